"""Logprobs in OpenAI's chat and legacy shapes, each entry with the integer id of its token.

Entries spell their tokens' text and bytes: each batch of entries built counts one decode
conversion, reason "logprobs" (tokenizers/conversions.py).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..engines.base import LOGPROB_FLOOR, TokenEvent
from ..protocol.common import LogprobEntry, PromptLogprob, TokenLogprob
from ..protocol.completions import CompletionLogprobs, TopTokenLogprob
from ..tokenizers.base import Tokenizer
from ..tokenizers.conversions import record

__all__ = ["MISSING_LOGPROB", "IdMap", "LegacyLogprobs", "chat_logprobs", "prompt_logprob_rows",
           "prompt_logprobs", "token_text"]

T = TypeVar("T")

#: vLLM's stand-in for a logprob the engine did not report
MISSING_LOGPROB = LOGPROB_FLOOR


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token's text; OpenAI's `bytes:\\xNN` spelling when it is not valid UTF-8 alone."""
    data = tokenizer.token_bytes(token_id)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


#: a model id -> the id an entry shows: the client version's (None: it has no one id for it)
IdMap = Callable[[int], int | None]


def _same(token_id: int) -> int | None:
    return token_id


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float, as_ids: bool,
           ids: IdMap) -> LogprobEntry:
    return LogprobEntry.model_construct(
        token=f"token_id:{token_id}" if as_ids else token_text(tokenizer, token_id),
        bytes=list(tokenizer.token_bytes(token_id)), logprob=float(logprob),
        id=ids(token_id))


def chat_logprobs(tokenizer: Tokenizer, events: Sequence[TokenEvent], *,
                  as_ids: bool = False, ids: IdMap = _same) -> list[TokenLogprob]:
    """`as_ids`: vLLM's `return_tokens_as_token_ids`, every `token` spelled `token_id:<id>`.
    Entries are the model's tokens (what it scored); `ids` says which id each shows (under
    `tokenizer_fallback: "translate"`, the client version's, omitted where it has none)."""
    if events:
        record("decode", "logprobs")
    out = []
    for ev in events:
        t = ev.token_id
        top = [_entry(tokenizer, k, lp, as_ids, ids) for k, lp in ev.top_logprobs]
        # built from what we made ourselves (no validation: a whole rollout has thousands)
        out.append(TokenLogprob.model_construct(
            token=f"token_id:{t}" if as_ids else token_text(tokenizer, t),
            bytes=list(tokenizer.token_bytes(t)),
            logprob=float(ev.logprob) if ev.logprob is not None else 0.0, id=ids(t),
            top_logprobs=top))
    return out


class LegacyLogprobs:
    """Builds /v1/completions logprobs piece by piece; `text_offset` counts characters from the
    start of the choice's text (a token that begins inside a character gets that character's
    offset)."""

    def __init__(self, tokenizer: Tokenizer, ids: IdMap = _same):
        self._tok = tokenizer
        self._ids = ids
        self._chars = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def take(self, events: Sequence[TokenEvent]) -> CompletionLogprobs:
        tok = self._tok
        out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[],
                                 token_ids=[], top_token_logprobs=[])
        if events:
            record("decode", "logprobs")
        for ev in events:
            out.tokens.append(token_text(tok, ev.token_id))
            out.token_ids.append(self._ids(ev.token_id))
            out.token_logprobs.append(ev.logprob)
            out.text_offset.append(self._chars)
            self._chars += len(self._utf8.decode(tok.token_bytes(ev.token_id)))
            if ev.logprob is None:  # the first prompt token: nothing predicted it
                out.top_logprobs.append(None)
                out.top_token_logprobs.append(None)
                continue
            top = [TopTokenLogprob(id=self._ids(t), token=token_text(tok, t), logprob=lp)
                   for t, lp in ev.top_logprobs]
            if all(t != ev.token_id for t, _ in ev.top_logprobs):
                # OpenAI's legacy shape holds the sampled token too: up to `logprobs` + 1
                top.append(TopTokenLogprob(id=self._ids(ev.token_id), token=out.tokens[-1],
                                           logprob=ev.logprob))
            # string-keyed, as OpenAI's; the most likely id wins a shared spelling
            by_text: dict[str, float] = {}
            for t in top:
                by_text.setdefault(t.token, t.logprob)
            out.top_logprobs.append(by_text)
            out.top_token_logprobs.append(top)
        return out


def prompt_logprob_rows(prompt: Sequence[int], scored: Sequence[TokenEvent],
                        entry: Callable[[int, float, int | None], T],
                        ) -> list[dict[str, T] | None]:
    """vLLM's `prompt_logprobs`: per position (the first is null, nothing predicts it) the
    prompt's token and the most likely ones there, keyed by id; `entry(id, logprob, rank)`
    spells one in the endpoint's shape."""
    out: list[dict[str, T] | None] = [None]
    for pos, ev in enumerate(scored, start=1):
        ranks = {t: r for r, (t, _) in enumerate(ev.top_logprobs, start=1)}
        lp = ev.logprob if ev.logprob is not None else MISSING_LOGPROB
        row = {str(prompt[pos]): entry(prompt[pos], lp, ranks.get(ev.token_id))}
        for r, (t, tlp) in enumerate(ev.top_logprobs, start=1):
            row.setdefault(str(t), entry(t, tlp, r))
        out.append(row)
    return out


def prompt_logprobs(tokenizer: Tokenizer, prompt: Sequence[int], scored: Sequence[TokenEvent],
                    *, as_ids: bool = False) -> list[dict[str, PromptLogprob] | None]:
    """Chat's `prompt_logprobs` (vLLM's `Logprob`, with `decoded_token`)."""

    def entry(t: int, lp: float, rank: int | None) -> PromptLogprob:
        spelled = f"token_id:{t}" if as_ids else token_text(tokenizer, t)
        return PromptLogprob(logprob=lp, rank=rank, decoded_token=spelled)

    if scored and not as_ids:
        record("decode", "logprobs")
    return prompt_logprob_rows(prompt, scored, entry)
