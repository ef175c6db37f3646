"""Rollouts as a trainer reads them: stored completions (`store: true` on chat completions and
on vLLM's `/inference/v1/generate`) made into rows of ids, linked into trajectories, exported
as Parquet, read back with no tokenizer. docs/rl.md (section 7) has every column and its type.

One row per sampled choice. `prompt_ids` is the prompt the model read; `completion_ids` what it
sampled, the id that ended it last where one did (as vLLM's `token_ids`; the record keeps that
id whatever the response showed); `loss_mask` covers both and marks the completion only, so
every sampled id is trained exactly once, in the row that sampled it (an earlier turn's ids
stand in a later turn's prompt as context, 0 there); `completion_logprobs` the sampler's
logprobs of `completion_ids` (null when the request asked for none); `weight_versions` the
spans of the weights that sampled it; `model` what the request named (an adapter's name, where
the fleet serves adapters); `reward` the record's `metadata["reward"]` as a number (a loop sets
it after scoring, with `POST /v1/chat/completions/{id}`), else null.

`trajectory_id` and `turn` link the turns of one multi-turn rollout: a record whose prompt
continues an earlier row's sample (`Trajectories`) is that row's trajectory, one turn on; any
other choice starts a trajectory of its own (`<id>:<choice>`, turn 0). Parquet needs `pyarrow`
(`tokenwire[rl]`); `datasets.load_dataset("parquet", data_files=...)` reads the file as it is.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from array import array
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..storage import Store, StoredCompletion

__all__ = ["COLUMNS", "Trajectories", "rollout_rows", "stored_rollouts", "write_parquet"]

COLUMNS = ("id", "choice", "trajectory_id", "turn", "created", "model", "tokenizer_version",
           "template_version", "prompt_ids", "completion_ids", "loss_mask",
           "completion_logprobs", "weight_versions", "finish_reason", "stop_reason", "reward",
           "metadata")

Link = tuple[str, int]
"""A trajectory's id, and the turn a row is in it."""


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part)
    return h.digest()


_WIDTH = array("q").itemsize


def _ids(ids: Sequence[int]) -> bytes:
    return array("q", ids).tobytes()


def _message(m: Any) -> bytes:
    """One sent message, as the same bytes whenever the same message is sent again."""
    return json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() \
        + b"\x1e"


class Trajectories:
    """Which earlier row a record continues, as records are read oldest first. A record's
    choices share its prompt, so they continue the same row, or none:

    - a chat completion continues the row whose sample it sent back: an assistant message
      whose `token_ids` are that row's sampled ids (its stop id last, or not), after exactly
      the messages that row's request sent (the last such message counts: the turn just
      before). The messages, not the prompt, are compared, so a turn whose earlier reasoning
      the template or `keep_reasoning: false` dropped from the prompt still links.
    - a `/inference/v1/generate` rollout continues the row whose prompt and sampled ids (its
      stop id last, or not) its own prompt starts with (the longest such: the turn just
      before), the client having put the sampled ids back as they were.

    Identical samples (greedy choices of one prompt) are one sample: a later turn continues
    the first of them."""

    def __init__(self) -> None:
        self._after_messages: dict[bytes, Link] = {}
        """(the request's messages, a sampled completion) -> the row that sampled it."""
        self._prefixes: dict[bytes, Link] = {}
        """A generate row's prompt and sample, as ids -> the row."""
        self._lengths: list[int] = []
        """The lengths of `_prefixes`' keys, ascending, each once."""

    def parent(self, record: StoredCompletion) -> Link | None:
        """The trajectory and turn of the row `record` continues, if it continues one."""
        if record.endpoint == "generate":
            return self._by_prefix(record.prompt_ids)
        messages = record.request.get("messages")
        if not isinstance(messages, list):
            return None
        before = hashlib.blake2b(digest_size=16)  # the messages before the one at hand
        found = None
        for m in messages:
            if isinstance(m, dict) and m.get("role") == "assistant":
                ids = m.get("token_ids")
                if isinstance(ids, list) and ids:
                    key = before.copy().digest() + _digest(_ids(ids))
                    found = self._after_messages.get(key, found)
            before.update(_message(m))
        return found

    def _by_prefix(self, prompt: Sequence[int]) -> Link | None:
        data = _ids(prompt)
        prefix = hashlib.blake2b(digest_size=16)
        found = None
        done = 0
        # proper prefixes only: the prompt goes on past the sample it continues
        for n in self._lengths[:bisect.bisect_left(self._lengths, len(prompt))]:
            prefix.update(data[done * _WIDTH:n * _WIDTH])
            done = n
            found = self._prefixes.get(prefix.copy().digest(), found)
        return found

    def add(self, record: StoredCompletion, rows: Sequence[dict[str, Any]]) -> None:
        """Remember the record's rows (each with its `trajectory_id`, `turn` and the sampled
        ids), for the records after it to continue."""
        chat = record.endpoint != "generate"
        messages = record.request.get("messages") if chat else None
        if chat and not isinstance(messages, list):
            return
        before = b"".join(_message(m) for m in messages) if chat and messages else b""
        head = _digest(before)
        for row in rows:
            link: Link = (row["trajectory_id"], row["turn"])
            sampled = row["completion_ids"]
            forms = [sampled]
            if row["stop_reason"] is not None and len(sampled) > 1:
                forms.append(sampled[:-1])  # sent back without its stop id
            for ids in forms:
                if chat:
                    self._after_messages.setdefault(head + _digest(_ids(ids)), link)
                    continue
                key = _digest(_ids([*record.prompt_ids, *ids]))
                if key not in self._prefixes:
                    self._prefixes[key] = link
                    n = len(record.prompt_ids) + len(ids)
                    i = bisect.bisect_left(self._lengths, n)
                    if i == len(self._lengths) or self._lengths[i] != n:
                        self._lengths.insert(i, n)


def _reward(metadata: dict[str, str]) -> float | None:
    try:
        value = float(metadata["reward"])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _stop(record: StoredCompletion, i: int,
          choice: dict[str, Any]) -> tuple[int | None, float | None]:
    """The id that ended choice `i` and its logprob: as the record kept it; in a record stored
    before stops were kept (schema version 6), as the response named it (with ids shown)."""
    if record.stops:
        stop = record.stops[i] if i < len(record.stops) else None
        return (stop[0], stop[1]) if stop is not None else (None, None)
    named = choice.get("stop_reason")
    if choice.get("finish_reason") in ("stop", "tool_calls") and isinstance(named, int) \
            and not isinstance(named, bool):
        return named, choice.get("stop_logprob")
    return None, None


def _row(record: StoredCompletion, i: int, sampled: list[int], choice: dict[str, Any],
         link: Link) -> dict[str, Any]:
    stop, stop_logprob = _stop(record, i, choice)
    completion = [*sampled, stop] if stop is not None else list(sampled)
    content = (choice.get("logprobs") or {}).get("content")
    logprobs = None
    if content is not None:
        logprobs = [t["logprob"] for t in content]
        if stop is not None and record.endpoint != "generate":
            logprobs.append(stop_logprob)  # generate's entries end with the stop id's
    return {
        "id": record.id, "choice": i, "trajectory_id": link[0], "turn": link[1],
        "created": record.created, "model": record.model,
        "tokenizer_version": record.tokenizer_version,
        "template_version": record.template_version,
        "prompt_ids": record.prompt_ids, "completion_ids": completion,
        "loss_mask": [0] * len(record.prompt_ids) + [1] * len(completion),
        "completion_logprobs": logprobs,
        "weight_versions": choice.get("weight_versions") or [],
        "finish_reason": choice.get("finish_reason"), "stop_reason": stop,
        "reward": _reward(record.metadata), "metadata": dict(record.metadata),
    }


def rollout_rows(record: StoredCompletion,
                 trajectories: Trajectories | None = None) -> list[dict[str, Any]]:
    """The record's choices as rows (`COLUMNS`), linked to the earlier rows `trajectories` has
    seen (none given: each choice is a trajectory of its own, turn 0)."""
    choices = record.response.get("choices") or []
    by_index = {c.get("index", k): c for k, c in enumerate(choices)}
    parent = trajectories.parent(record) if trajectories is not None else None
    rows = [_row(record, i, sampled, by_index.get(i, {}),
                 (parent[0], parent[1] + 1) if parent is not None else (f"{record.id}:{i}", 0))
            for i, sampled in enumerate(record.output_ids)]
    if trajectories is not None:
        trajectories.add(record, rows)
    return rows


async def stored_rollouts(store: Store, owner: str, *, model: str | None = None,
                          metadata: dict[str, str] | None = None,
                          ) -> AsyncIterator[dict[str, Any]]:
    """Every row of an owner's stored completions, oldest first (filtered as the list
    endpoint filters), linked into trajectories."""
    trajectories = Trajectories()
    after = None
    while True:
        page = await store.list_completions(owner, model=model, metadata=metadata,
                                            after=after, limit=100)
        for record in page.data:
            for row in rollout_rows(record, trajectories):
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
        ("id", pa.string()), ("choice", pa.int32()), ("trajectory_id", pa.string()),
        ("turn", pa.int32()), ("created", pa.int64()),
        ("model", pa.string()), ("tokenizer_version", pa.string()),
        ("template_version", pa.string()), ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
        ("completion_logprobs", pa.list_(pa.float32())), ("weight_versions", pa.list_(span)),
        ("finish_reason", pa.string()), ("stop_reason", pa.int32()), ("reward", pa.float64()),
        ("metadata", pa.map_(pa.string(), pa.string())),
    ])
    assert schema.names == list(COLUMNS)
    data = list(rows)
    table = pa.Table.from_pylist(
        [{**r, "metadata": list(r["metadata"].items())} for r in data], schema=schema)
    pq.write_table(table, str(path))
    return len(data)
