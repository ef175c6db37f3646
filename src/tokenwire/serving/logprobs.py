"""Logprobs in OpenAI's chat and legacy shapes, each entry with the integer id of its token.

Entries spell their tokens' text and bytes: each batch of entries built counts one decode
conversion, reason "logprobs" (tokenizers/conversions.py).

A whole answer's entries (thousands: an RL rollout's) are written as JSON in bulk
(`chat_logprobs_json`, `generate_logprobs_json`): each id's `"token"` and `"bytes"` encoded once
per tokenizer and kept, then one string per entry, no model per entry (docs/hot-path.md). The
models (`chat_logprobs`) remain for stream chunks, a few entries each.
"""

from __future__ import annotations

import codecs
import math
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import orjson

from ..engines.base import LOGPROB_FLOOR, TokenEvent, TokenRun
from ..protocol._base import RawJSON
from ..protocol.common import LogprobEntry, PromptLogprob, TokenLogprob
from ..protocol.completions import CompletionLogprobs, TopTokenLogprob
from ..tokenizers.base import Tokenizer
from ..tokenizers.conversions import record

__all__ = ["MISSING_LOGPROB", "IdMap", "LegacyLogprobs", "chat_logprobs", "chat_logprobs_json",
           "generate_logprobs_json", "prompt_logprob_rows", "prompt_logprobs", "same_id",
           "token_text"]

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


def same_id(token_id: int) -> int | None:
    """The model's own id (no translation): the one `IdMap` the bulk writers' fast path
    recognises (by identity)."""
    return token_id


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float, as_ids: bool,
           ids: IdMap) -> LogprobEntry:
    return LogprobEntry.model_construct(
        token=f"token_id:{token_id}" if as_ids else token_text(tokenizer, token_id),
        bytes=list(tokenizer.token_bytes(token_id)), logprob=float(logprob),
        id=ids(token_id))


def chat_logprobs(tokenizer: Tokenizer, events: Sequence[TokenEvent], *,
                  as_ids: bool = False, ids: IdMap = same_id) -> list[TokenLogprob]:
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


def _columns(events: Sequence[TokenEvent],
             ) -> Iterator[tuple[int, float | None, Sequence[tuple[int, float]]]]:
    """Each token's id, logprob and top entries: from a run's arrays, or from its events."""
    if isinstance(events, TokenRun):
        if events.logprobs is None:
            yield from ((t, None, ()) for t in events.ids)
            return
        tops, starts, lps = (list(zip(events.top_ids or (), events.top_logprobs or (),
                                      strict=True)), events.top_starts, events.logprobs)
        assert starts is not None
        for i, t in enumerate(events.ids):
            yield t, lps[i], tops[starts[i]:starts[i + 1]]
        return
    for ev in events:
        yield ev.token_id, ev.logprob, ev.top_logprobs


def _number(x: float) -> str:
    """A float as pydantic writes it in JSON (not finite: null)."""
    return repr(x) if math.isfinite(x) else "null"


class _Heads(dict[int, str]):
    """id -> the start of its chat entry, `{"token":...,"bytes":[...],"logprob":`, made when an
    id is first met (a vocabulary's worth at most, a few MB)."""

    def __init__(self, tokenizer: Tokenizer, as_ids: bool):
        super().__init__()
        self._tok = tokenizer
        self._as_ids = as_ids

    def __missing__(self, t: int) -> str:
        text = f"token_id:{t}" if self._as_ids else token_text(self._tok, t)
        head = self[t] = ('{"token":' + orjson.dumps(text).decode() + ',"bytes":'
                          + orjson.dumps(list(self._tok.token_bytes(t))).decode()
                          + ',"logprob":')
        return head


_HEADS: dict[tuple[str, bool], _Heads] = {}


def _heads(tokenizer: Tokenizer, as_ids: bool) -> _Heads:
    """Kept per tokenizer version (content-addressed: the same version, the same bytes)."""
    heads = _HEADS.get((tokenizer.version, as_ids))
    if heads is None:
        heads = _HEADS[(tokenizer.version, as_ids)] = _Heads(tokenizer, as_ids)
    return heads


def chat_logprobs_json(tokenizer: Tokenizer, events: Sequence[TokenEvent], *,
                       as_ids: bool = False, ids: IdMap = same_id) -> RawJSON:
    """`chat_logprobs` written as JSON in bulk: the same entries (tests/serving/
    test_bulk_logprobs.py holds them to the models), no model per entry."""
    if events:
        record("decode", "logprobs")
    heads = _heads(tokenizer, as_ids)
    if isinstance(events, TokenRun) and events.logprobs is not None and ids is same_id \
            and events.top_starts == array("q", range(len(events) + 1)) \
            and all(map(math.isfinite, events.logprobs)) \
            and all(map(math.isfinite, events.top_logprobs or ())):
        # one entry with its one top entry (`top_logprobs: 1`, an RL rollout's)
        return RawJSON.array([
            f'{heads[t]}{lp!r},"id":{t},"top_logprobs":[{heads[k]}{klp!r},"id":{k}}}]}}'
            for t, lp, k, klp in zip(events.ids, events.logprobs, events.top_ids or (),
                                     events.top_logprobs or (), strict=True)])
    out = []
    for t, lp, top in _columns(events):
        entries = []
        for k, klp in top:
            kid = ids(k)
            entries.append(heads[k] + _number(klp) + ("}" if kid is None else f',"id":{kid}}}'))
        tid = ids(t)
        out.append(heads[t] + (_number(lp) if lp is not None else "0.0")
                   + ("" if tid is None else f',"id":{tid}')
                   + ',"top_logprobs":[' + ",".join(entries) + "]}")
    return RawJSON.array(out)


def _generate_entry(t: int, lp: float | None, top: Sequence[tuple[int, float]]) -> str:
    """vLLM's generate entry (serving/generate.py's models): the sampled token with its rank,
    then it and the most likely ones, each `token_id`, `token`, `logprob`, `rank`."""
    rank = next((r for r, (k, _) in enumerate(top, start=1) if k == t), None)
    first = (f'{{"token_id":{t},"token":"token_id:{t}","logprob":'
             f'{_number(lp if lp is not None else MISSING_LOGPROB)}'
             + ("}" if rank is None else f',"rank":{rank}}}'))
    rest = [f'{{"token_id":{k},"token":"token_id:{k}","logprob":{_number(klp)},"rank":{r}}}'
            for r, (k, klp) in enumerate(top, start=1) if k != t]
    return first[:-1] + ',"top_logprobs":[' + ",".join([first, *rest]) + "]}"


def generate_logprobs_json(events: Sequence[TokenEvent]) -> list[str]:
    """Each token's entry of /inference/v1/generate's `logprobs.content`, as JSON."""
    return [_generate_entry(t, lp, top) for t, lp, top in _columns(events)]


class LegacyLogprobs:
    """Builds /v1/completions logprobs piece by piece; `text_offset` counts characters from the
    start of the choice's text (a token that begins inside a character gets that character's
    offset)."""

    def __init__(self, tokenizer: Tokenizer, ids: IdMap = same_id):
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
