"""Counts of every text <-> ids conversion the server performs, by direction and reason.

The token-native claim ("ids in, ids out, no text in between") is checked, not assumed: each
place that turns text into ids (encode) or ids into text or bytes (decode) records one
conversion per call, whatever its length. The tokenizer itself records its `encode`,
`encode_segments`, `decode` and `decode_bytes`; a place that builds text from `token_bytes`
lookups (the streaming output decoder, logprob entries, translation) records one conversion
per output it builds, so a choice streamed in 50 chunks is one decode, as it is whole.
`token_bytes` and `token_str` alone are vocabulary lookups and are not counted.

The reason is the caller's: `with conversion_reason("prompt"):` around the call, carried by a
context variable (so worker threads started with `asyncio.to_thread` inherit it); "other" where
no caller said. The counts are process-wide, as tokenizer objects are shared by every app in a
process; `/metrics` exports them (`metrics.py`), and tests compare deltas.

Reasons:
    prompt       a text prompt or message content encoded for the model
    template     the chat template's own structure (role markers), once per distinct piece
    output       sampled ids made text for a response's `content`/`text`
    stop         sampled ids made bytes to match stop strings
    tools        sampled ids made text to parse tool calls
    policy       content-policy checks (input ids decoded, output text read)
    canonical    the `non_canonical_tokens` check (ids decoded and re-encoded)
    drift        `check_drift`: assistant content encoded to compare with its ids
    echo         `echo`: the prompt or last message as text
    logprobs     logprob entries' `token` text
    translate    `tokenizer_fallback: "translate"` and /v1/translate
    tokenize     /v1/tokenize, /v1/detokenize and their kin
    document     a document sent or read back as text (/v1/documents)
    search       a document search query sent as text
    stored       a stored completion read back as text
    upstream     a text-only upstream engine (its prompt as text, its output re-encoded)
    probe        start-up parity probes between a tokenizer and an engine
    other        anything no caller named
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Literal

__all__ = ["Direction", "Reason", "conversion_reason", "conversions", "record"]

Direction = Literal["encode", "decode"]
Reason = Literal["prompt", "template", "output", "stop", "tools", "policy", "canonical",
                 "drift", "echo", "logprobs", "translate", "tokenize", "document", "search",
                 "stored", "upstream", "probe", "other"]

_reason: ContextVar[Reason] = ContextVar("tokenwire_conversion_reason", default="other")
_lock = threading.Lock()
_counts: dict[tuple[Direction, Reason], int] = {}


@contextlib.contextmanager
def conversion_reason(reason: Reason) -> Iterator[None]:
    """Conversions made inside the block count under `reason`."""
    token = _reason.set(reason)
    try:
        yield
    finally:
        _reason.reset(token)


def record(direction: Direction, reason: Reason | None = None) -> None:
    """One conversion, under `reason` or else the one the caller's context names."""
    key = (direction, reason or _reason.get())
    with _lock:  # the plan is built in worker threads, the output on the event loop
        _counts[key] = _counts.get(key, 0) + 1


def conversions() -> dict[tuple[Direction, Reason], int]:
    """A snapshot of the counts so far, by (direction, reason)."""
    with _lock:
        return dict(_counts)
