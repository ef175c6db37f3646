"""Logprob entries in OpenAI's chat shape, each with the integer `id` of its token."""

from __future__ import annotations

from collections.abc import Sequence

from ..engines.base import TokenEvent
from ..protocol.common import LogprobEntry, TokenLogprob
from ..tokenizers.base import Tokenizer

__all__ = ["chat_logprobs", "token_text"]


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token's text; OpenAI's `bytes:\\xNN` spelling when it is not valid UTF-8 alone."""
    data = tokenizer.token_bytes(token_id)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float) -> LogprobEntry:
    return LogprobEntry(token=token_text(tokenizer, token_id),
                        bytes=list(tokenizer.token_bytes(token_id)), logprob=logprob, id=token_id)


def chat_logprobs(tokenizer: Tokenizer, events: Sequence[TokenEvent]) -> list[TokenLogprob]:
    out = []
    for ev in events:
        head = _entry(tokenizer, ev.token_id, ev.logprob if ev.logprob is not None else 0.0)
        top = [_entry(tokenizer, t, lp) for t, lp in ev.top_logprobs]
        out.append(TokenLogprob(**head.model_dump(), top_logprobs=top))
    return out
