"""A finished sample as the SDK reads it: `tinker_public.SampleResponse`, protobuf, written with
the schema the SDK ships (`tinker.proto.tinker_public_pb2`, Apache-2.0; the `tinker` extra).
Arrays are packed little-endian, as the SDK reads them (`np.frombuffer`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...engines.base import TokenEvent
from ..generation import ChoiceResult

__all__ = ["MASK_LOGPROB", "sample_response"]

MASK_LOGPROB = -99999.0
"""The SDK's empty top-k cell (`tinker.types.topk_logprobs.MASK_LOGPROB`), with id 0."""


def _pb() -> Any:
    from tinker.proto import tinker_public_pb2  # the `tinker` extra; checked at the route

    return tinker_public_pb2


def _topk(pb: Any, rows: Sequence[Sequence[tuple[int, float]] | None], k: int) -> Any:
    """Rows of up to `k` (id, logprob), most likely first; None: a row not computed."""
    ids = np.zeros((len(rows), k), dtype="<i4")
    lps = np.full((len(rows), k), MASK_LOGPROB, dtype="<f4")
    for i, row in enumerate(rows):
        for j, (t, lp) in enumerate((row or ())[:k]):
            ids[i, j], lps[i, j] = t, lp
    return pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=lps.tobytes(), k=k,
                           length=len(rows))


def _logprob(ev: TokenEvent) -> float:
    return ev.logprob if ev.logprob is not None else math.nan


def sample_response(prompt: Sequence[int], results: Sequence[ChoiceResult], *,
                    prompt_logprobs: bool, topk_prompt: int, last_n: int | None,
                    topk_sample: int) -> bytes:
    """Each choice's ids exactly as `/inference/v1/generate` returns them (the stop id last,
    where one ended it), with the sampled logprob of each; prompt logprobs for the positions
    asked (the first, and those before the last `last_n`, NaN: nothing was asked there)."""
    pb = _pb()
    out = pb.SampleResponse()
    for r in results:
        events = [*r.events, *([r.stop_event] if r.stop_event is not None else [])]
        ids = [*r.ids, *([r.stop_event.token_id] if r.stop_event is not None else [])]
        seq = out.sequences.add()
        seq.stop_reason = pb.STOP_REASON_LENGTH if r.finish_reason == "length" \
            else pb.STOP_REASON_STOP
        seq.tokens = np.asarray(ids, dtype="<i4").tobytes()
        seq.logprobs = np.asarray([_logprob(e) for e in events], dtype="<f4").tobytes()
        if topk_sample:
            seq.topk_sampled_logprobs.CopyFrom(
                _topk(pb, [e.top_logprobs for e in events], topk_sample))
        if r.cached_tokens:
            out.prompt_cache_hit_tokens = max(out.prompt_cache_hit_tokens, r.cached_tokens)
    if results and (prompt_logprobs or topk_prompt):
        scored = results[0].prompt_logprobs  # positions 1.. of the prompt
        first = len(prompt) - last_n if last_n is not None else 1
        keep = [i >= max(first, 1) for i in range(len(prompt))]
        if prompt_logprobs:
            values = np.full(len(prompt), math.nan, dtype="<f4")
            for pos, ev in enumerate(scored, start=1):
                if keep[pos]:
                    values[pos] = _logprob(ev)
            out.prompt_logprobs = values.tobytes()
        if topk_prompt:
            rows: list[Sequence[tuple[int, float]] | None] = [None] * len(prompt)
            for pos, ev in enumerate(scored, start=1):
                if keep[pos]:
                    rows[pos] = ev.top_logprobs
            out.topk_prompt_logprobs.CopyFrom(_topk(pb, rows, topk_prompt))
    data: bytes = out.SerializeToString()
    return data
