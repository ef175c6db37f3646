"""Rollouts as a trainer reads them: stored chat completions (`store: true`) made into rows of
ids, exported as Parquet, read back with no tokenizer.

One row per sampled choice. `prompt_ids` is the prompt the model read; `completion_ids` what it
sampled, the end-of-turn id included where it sampled one (as vLLM's `token_ids`);
`loss_mask` covers both (1 where the model sampled the id: this choice, and the earlier
assistant turns sent back as `token_ids`, whose spans the record kept); `completion_logprobs`
the sampler's logprobs of `completion_ids` (the stop id's `stop_logprob` last; null when the
request asked for none); `weight_versions` the spans of the weights that sampled it; `model`
what the request named (an adapter's name, where the fleet serves adapters); `reward` the
record's `metadata["reward"]` as a number (a loop sets it after scoring, with
`POST /v1/chat/completions/{id}`), else null. Parquet needs `pyarrow` (`tokenwire[rl]`);
`datasets.load_dataset("parquet", data_files=...)` reads the file as it is.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from ..storage import Store, StoredCompletion

__all__ = ["COLUMNS", "rollout_rows", "stored_rollouts", "write_parquet"]

COLUMNS = ("id", "choice", "created", "model", "tokenizer_version", "template_version",
           "prompt_ids", "completion_ids", "loss_mask", "completion_logprobs",
           "weight_versions", "finish_reason", "stop_reason", "reward", "metadata")


def _sampled_in_prompt(record: StoredCompletion) -> list[int]:
    """1 at the prompt positions of assistant turns sent back as the ids the model sampled."""
    mask = [0] * len(record.prompt_ids)
    messages = record.request.get("messages") or []
    for index, start, end in record.spans:
        m = messages[index] if index < len(messages) else {}
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("token_ids"):
            mask[start:end] = [1] * (end - start)
    return mask


def _reward(metadata: dict[str, str]) -> float | None:
    try:
        value = float(metadata["reward"])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) else None


def rollout_rows(record: StoredCompletion) -> list[dict[str, Any]]:
    """The record's choices as rows (`COLUMNS`)."""
    prompt_mask = _sampled_in_prompt(record)
    choices = record.response.get("choices") or []
    rows = []
    for i, sampled in enumerate(record.output_ids):
        c = choices[i] if i < len(choices) else {}
        stop = c.get("stop_reason")
        ends_turn = c.get("finish_reason") in ("stop", "tool_calls") and isinstance(stop, int) \
            and not isinstance(stop, bool)
        completion = [*sampled, stop] if ends_turn else list(sampled)
        content = (c.get("logprobs") or {}).get("content")
        logprobs = None
        if content is not None:
            logprobs = [t["logprob"] for t in content]
            if ends_turn and c.get("stop_logprob") is not None:
                logprobs.append(c["stop_logprob"])
        rows.append({
            "id": record.id, "choice": i, "created": record.created, "model": record.model,
            "tokenizer_version": record.tokenizer_version,
            "template_version": record.template_version,
            "prompt_ids": record.prompt_ids, "completion_ids": completion,
            "loss_mask": prompt_mask + [1] * len(completion),
            "completion_logprobs": logprobs,
            "weight_versions": c.get("weight_versions") or [],
            "finish_reason": c.get("finish_reason"),
            "stop_reason": stop if isinstance(stop, int) and not isinstance(stop, bool)
            else None,
            "reward": _reward(record.metadata), "metadata": dict(record.metadata),
        })
    return rows


async def stored_rollouts(store: Store, owner: str, *, model: str | None = None,
                          metadata: dict[str, str] | None = None,
                          ) -> AsyncIterator[dict[str, Any]]:
    """Every row of an owner's stored completions, oldest first (filtered as the list
    endpoint filters)."""
    after = None
    while True:
        page = await store.list_completions(owner, model=model, metadata=metadata,
                                            after=after, limit=100)
        for record in page.data:
            for row in rollout_rows(record):
                yield row
        if not page.has_more or not page.data:
            return
        after = page.data[-1].id


def write_parquet(rows: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Write `rows` as one Parquet file; how many were written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    span = pa.struct([("version", pa.string()), ("start", pa.int32()), ("end", pa.int32())])
    schema = pa.schema([
        ("id", pa.string()), ("choice", pa.int32()), ("created", pa.int64()),
        ("model", pa.string()), ("tokenizer_version", pa.string()),
        ("template_version", pa.string()), ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
        ("completion_logprobs", pa.list_(pa.float32())), ("weight_versions", pa.list_(span)),
        ("finish_reason", pa.string()), ("stop_reason", pa.int32()), ("reward", pa.float64()),
        ("metadata", pa.map_(pa.string(), pa.string())),
    ])
    data = list(rows)
    table = pa.Table.from_pylist(
        [{**r, "metadata": list(r["metadata"].items())} for r in data], schema=schema)
    pq.write_table(table, str(path))
    return len(data)
