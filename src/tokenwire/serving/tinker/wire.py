"""Tinker's protobuf, with the schema the SDK ships (`tinker.proto.tinker_public_pb2`,
Apache-2.0; the `tinker` extra): a finished sample (`SampleResponse`), a training batch read
(`ForwardBackwardRequest`, zstd-compressed or not) and its outcome (`ForwardBackwardOutput`).
Arrays are packed little-endian, as the SDK reads them (`np.frombuffer`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...engines.base import TokenEvent
from ...errors import InvalidRequestError, UnsupportedParameterError
from ..generation import ChoiceResult

__all__ = ["MASK_LOGPROB", "forward_backward_output", "read_forward_backward",
           "sample_response"]

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


_DTYPES = {"float32": "<f4", "int64": "<i8"}


def _tensor(pb: Any, msg: Any, param: str) -> np.ndarray:
    """A dense `Tensor` as an array (sparse ones, which only the SDK's torch helper makes
    from sparse torch tensors, are refused by name)."""
    if msg.HasField("sparse_csr"):
        raise UnsupportedParameterError("sparse loss_fn_inputs are not supported", param=param)
    dtype = {pb.DTYPE_FLOAT32: "<f4", pb.DTYPE_INT64: "<i8", pb.DTYPE_INT32: "<i4"}.get(msg.dtype)
    if dtype is None or len(msg.dense) % np.dtype(dtype).itemsize:
        raise InvalidRequestError("a tensor of an unknown dtype or a broken size",
                                  param=param, code="invalid_value")
    return np.frombuffer(msg.dense, dtype=dtype)


def read_forward_backward(body: bytes, encoding: str | None) -> dict[str, Any]:
    """`POST /api/v1/forward_backward`'s body as the trainer's request: the model, the loss,
    its config, `forward_only`, and each datum's token ids and loss inputs."""
    pb = _pb()
    if encoding == "zstd":
        import zstandard  # the SDK's own dependency: the `tinker` extra

        try:
            body = zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 30)
        except zstandard.ZstdError as exc:
            raise InvalidRequestError(f"the body is not zstd: {exc}", param="body",
                                      code="invalid_value") from exc
    elif encoding not in (None, "", "identity"):
        raise UnsupportedParameterError(f"Content-Encoding {encoding!r}", param="body")
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise InvalidRequestError("the body is not a ForwardBackwardRequest protobuf",
                                  param="body", code="invalid_value") from exc
    config: dict[str, float] = dict(msg.loss_fn_config)
    for k, v in msg.loss_fn_config_v2.items():
        if v.WhichOneof("value") == "number":
            config[k] = v.number
        else:
            raise UnsupportedParameterError(f"loss_fn_config[{k!r}] as text",
                                            param=f"loss_fn_config.{k}")
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[np.ndarray] = []
        for j, chunk in enumerate(d.model_input):
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise UnsupportedParameterError(
                    f"a model_input chunk of type {chunk.WhichOneof('chunk')!r}: tokenwire "
                    "trains on token ids (encoded_text chunks) only",
                    param=f"data[{i}].model_input.chunks[{j}]")
            raw = chunk.encoded_text.tokens
            if len(raw) % 4:
                raise InvalidRequestError("token ids are packed as int32: the bytes' length is "
                                          "not a multiple of 4", code="invalid_value",
                                          param=f"data[{i}].model_input.chunks[{j}].tokens")
            tokens.append(np.frombuffer(raw, dtype="<i4"))
        inputs = {name: _tensor(pb, t, f"data[{i}].loss_fn_inputs.{name}")
                  for name, t in d.loss_fn_inputs.items()}
        data.append({"tokens": np.concatenate(tokens) if tokens else np.zeros(0, "<i4"),
                     "inputs": inputs})
    return {"model_id": msg.model_id, "seq_id": msg.seq_id, "loss_fn": msg.loss_fn,
            "loss_fn_config": config, "forward_only": msg.forward_only, "data": data}


def forward_backward_output(outputs: Sequence[dict[str, np.ndarray]],
                            metrics: dict[str, float]) -> bytes:
    """Each datum's outputs (`logprobs`, `elementwise_loss`: one float per input token) as one
    `ArrayRecord` of batched tensors, and the metrics."""
    pb = _pb()
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        out.metrics[k] = v
    record = out.loss_fn_outputs.add(num_datums=len(outputs))
    for name in (outputs[0] if outputs else {}):
        arrays = [np.asarray(o[name], dtype="<f4").reshape(-1) for o in outputs]
        offsets = np.cumsum([0, *(a.nbytes for a in arrays)], dtype="<i8")
        record.fields[name].CopyFrom(pb.BatchedTensor(
            data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(),
            dtype=pb.DTYPE_FLOAT32))
    data: bytes = out.SerializeToString()
    return data
