"""The rollout export's rules on records as the server stores them, through a real SQLite store
and a real Parquet file: which rows are one trajectory, each sampled id in exactly one row's
loss mask, and the stop id kept whatever the response showed. (The same export of a live
server's records: tests/e2e/test_rollouts.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tokenwire.rl.rollouts import COLUMNS, stored_rollouts, write_parquet
from tokenwire.storage import SQLiteStore, StoredCompletion

pytestmark = pytest.mark.anyio

EOS = 2  # SmolLM2's <|im_end|>
USER = [{"role": "user", "content": "Name a fruit."}]
_created = iter(range(1_700_000_000, 1_800_000_000))


def chat(id: str, messages: list[dict[str, Any]], prompt: list[int],
         samples: list[list[int]], *, stopped: bool = True, shown: bool = True,
         logprobs: bool = True) -> StoredCompletion:
    """A stored chat completion as `ChatService` keeps it: each sample stopped by EOS (kept
    in `stops`, named in the response only when ids were shown)."""
    choices = []
    for i, ids in enumerate(samples):
        c: dict[str, Any] = {"index": i, "finish_reason": "stop" if stopped else "length",
                             "message": {"role": "assistant", "content": "x"}}
        if logprobs:
            c["logprobs"] = {"content": [{"token": "x", "logprob": -0.5 - k / 10,
                                          "bytes": [120], "top_logprobs": []}
                                         for k in range(len(ids))]}
        if shown:
            c.update(token_ids=ids, stop_reason=EOS if stopped else None,
                     stop_logprob=-0.01 if stopped and logprobs else None)
        choices.append(c)
    return StoredCompletion(
        id=id, owner="", model="m", created=next(_created), tokenizer_version="tv",
        template_version="tpl", prompt_ids=prompt, vocab_size=49_152,
        request={"model": "m", "messages": messages, "store": True},
        response={"id": id, "object": "chat.completion", "choices": choices},
        metadata={"run": "r"}, output_ids=samples,
        stops=[(EOS, -0.01 if logprobs else None) if stopped else None for _ in samples])


def generate(id: str, prompt: list[int], samples: list[list[int]]) -> StoredCompletion:
    """A stored /inference/v1/generate rollout: vLLM's response (its ids and logprob entries
    end with the stop id), the sampled ids apart from the stop id in the record."""
    choices = [{"index": i, "finish_reason": "stop", "stop_reason": None,
                "token_ids": [*ids, EOS],
                "logprobs": {"content": [{"token_id": t, "logprob": -1.0}
                                         for t in [*ids, EOS]]}}
               for i, ids in enumerate(samples)]
    return StoredCompletion(
        id=id, owner="", model="m", created=next(_created), tokenizer_version="tv",
        template_version=None, prompt_ids=prompt, vocab_size=49_152,
        request={"token_ids": prompt, "sampling_params": {"n": len(samples)}, "store": True},
        response={"request_id": id, "choices": choices}, metadata={"run": "r"},
        output_ids=samples, stops=[(EOS, -1.0) for _ in samples], endpoint="generate")


async def export(tmp_path: Path, *records: StoredCompletion) -> list[dict[str, Any]]:
    """The records through a real store, exported to Parquet and read back."""
    store = SQLiteStore(tmp_path / "store.sqlite3")
    try:
        for r in records:
            await store.put_completion(r)
        rows = [r async for r in stored_rollouts(store, "")]
    finally:
        await store.aclose()
    out = tmp_path / "rollouts.parquet"
    assert write_parquet(rows, out) == len(rows)
    table = pq.read_table(out)
    assert table.column_names == list(COLUMNS)
    return table.to_pylist()


def assert_each_sampled_id_trained_once(rows: list[dict[str, Any]]) -> None:
    """Within each row, 1 exactly on its own completion; so over a trajectory's rows every
    sampled id is counted once (however many later turns carry it in their prompts)."""
    for r in rows:
        assert r["loss_mask"] == [0] * len(r["prompt_ids"]) + [1] * len(r["completion_ids"])
        if r["completion_logprobs"] is not None:
            assert len(r["completion_logprobs"]) == len(r["completion_ids"])


def turns(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(r["trajectory_id"], r["turn"]) for r in rows]


async def test_a_chat_rollout_is_one_trajectory_branching_where_a_turn_sampled_several(
        tmp_path: Path) -> None:
    first = chat("chatcmpl-1", USER, [1, 10, 11, 9], [[50, 51]])
    fed = {"role": "assistant", "content": "x", "token_ids": [50, 51, EOS]}
    then = [*USER, fed, {"role": "user", "content": "And a colour?"}]
    second = chat("chatcmpl-2", then, [1, 10, 11, 9, 50, 51, EOS, 7, 12, 9],
                  [[60], [61, 62]])
    # the third turn continues the second's choice 1, sent back without its stop id
    fed2 = {"role": "assistant", "content": "y", "token_ids": [61, 62]}
    third = chat("chatcmpl-3", [*then, fed2, {"role": "user", "content": "Why?"}],
                 [1, 10, 11, 9, 50, 51, EOS, 7, 12, 9, 61, 62, EOS, 7, 13, 9], [[70]])
    rows = await export(tmp_path, first, second, third)
    assert turns(rows) == [("chatcmpl-1:0", 0), ("chatcmpl-1:0", 1), ("chatcmpl-1:0", 1),
                           ("chatcmpl-1:0", 2)]
    assert [r["completion_ids"] for r in rows] == [[50, 51, EOS], [60, EOS], [61, 62, EOS],
                                                   [70, EOS]]
    assert_each_sampled_id_trained_once(rows)
    # turn 1's ids stand in the later prompts as context, never marked
    assert rows[1]["prompt_ids"][4:7] == [50, 51, EOS]
    assert rows[1]["loss_mask"][4:7] == [0, 0, 0]


async def test_a_group_is_one_trajectory_per_sample(tmp_path: Path) -> None:
    group = chat("chatcmpl-g", USER, [1, 10, 11, 9], [[50], [51]])
    later = [chat(f"chatcmpl-g{k}", [*USER, {"role": "assistant", "token_ids": [50 + k, EOS]},
                                     {"role": "user", "content": "More."}],
                  [1, 10, 11, 9, 50 + k, EOS, 7, 14, 9], [[80 + k]]) for k in (0, 1)]
    # the same prompt again is a new rollout (it continues nothing)
    again = chat("chatcmpl-h", USER, [1, 10, 11, 9], [[50]])
    rows = await export(tmp_path, group, *later, again)
    assert turns(rows) == [("chatcmpl-g:0", 0), ("chatcmpl-g:1", 0), ("chatcmpl-g:0", 1),
                           ("chatcmpl-g:1", 1), ("chatcmpl-h:0", 0)]


async def test_a_turn_links_by_the_messages_sent_not_the_prompt(tmp_path: Path) -> None:
    """keep_reasoning false (Qwen3's habit): turn 2's prompt holds turn 1 without its
    reasoning, so the prompts differ, but the messages sent hold turn 1's sampled ids."""
    think = [300, 40, 41, 301, 198]  # <think> ... </think>\n
    first = chat("chatcmpl-q1", USER, [1, 10, 11, 9], [[*think, 50, 51]])
    fed = {"role": "assistant", "token_ids": [*think, 50, 51, EOS]}
    second = chat("chatcmpl-q2", [*USER, fed, {"role": "user", "content": "And?"}],
                  [1, 10, 11, 9, 50, 51, EOS, 7, 15, 9], [[52]])
    # the same sample after other messages is another conversation's
    other = chat("chatcmpl-o", [{"role": "user", "content": "Other."}, fed,
                                {"role": "user", "content": "And?"}],
                 [1, 16, 9, 50, 51, EOS, 7, 15, 9], [[53]])
    rows = await export(tmp_path, first, second, other)
    assert turns(rows) == [("chatcmpl-q1:0", 0), ("chatcmpl-q1:0", 1), ("chatcmpl-o:0", 0)]
    assert rows[0]["completion_ids"] == [*think, 50, 51, EOS]  # the reasoning is trained


async def test_generate_rollouts_link_by_prompt_ids(tmp_path: Path) -> None:
    first = generate("generate-tokens-1", [1, 10, 9], [[50, 51]])
    second = generate("generate-tokens-2", [1, 10, 9, 50, 51, EOS, 7, 12, 9], [[60]])
    third = generate("generate-tokens-3",
                     [1, 10, 9, 50, 51, EOS, 7, 12, 9, 60, EOS, 7, 13, 9], [[70]])
    fresh = generate("generate-tokens-4", [1, 10, 9], [[50, 51]])  # the same first prompt
    rows = await export(tmp_path, first, second, third, fresh)
    assert turns(rows) == [("generate-tokens-1:0", 0), ("generate-tokens-1:0", 1),
                           ("generate-tokens-1:0", 2), ("generate-tokens-4:0", 0)]
    # vLLM's token_ids and logprobs, as the response had them
    for r, rec in zip(rows, (first, second, third, fresh), strict=True):
        choice = rec.response["choices"][0]
        assert r["completion_ids"] == choice["token_ids"]
        assert r["completion_logprobs"] == [e["logprob"] for e in choice["logprobs"]["content"]]
        assert r["stop_reason"] == EOS and r["template_version"] is None
    assert_each_sampled_id_trained_once(rows)


async def test_the_stop_id_is_kept_when_the_response_showed_no_ids(tmp_path: Path) -> None:
    hidden = chat("chatcmpl-t", USER, [1, 10, 11, 9], [[50, 51]], shown=False)
    cut = chat("chatcmpl-c", USER, [1, 10, 11, 9], [[50, 51]], stopped=False)
    quiet = chat("chatcmpl-n", USER, [1, 10, 11, 9], [[50]], shown=False, logprobs=False)
    # a record stored before stops were kept: the response's stop id, where it named one
    old_shown = chat("chatcmpl-os", USER, [1, 10, 11, 9], [[50]])
    old_hidden = chat("chatcmpl-oh", USER, [1, 10, 11, 9], [[50]], shown=False)
    old = [dataclasses.replace(r, stops=[]) for r in (old_shown, old_hidden)]
    rows = await export(tmp_path, hidden, cut, quiet, *old)
    assert [(r["completion_ids"], r["stop_reason"], r["finish_reason"]) for r in rows] == [
        ([50, 51, EOS], EOS, "stop"), ([50, 51], None, "length"), ([50, EOS], EOS, "stop"),
        ([50, EOS], EOS, "stop"), ([50], None, "stop")]
    assert rows[0]["completion_logprobs"] == pytest.approx([-0.5, -0.6, -0.01])
    assert rows[2]["completion_logprobs"] is None
    assert_each_sampled_id_trained_once(rows)
