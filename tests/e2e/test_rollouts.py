"""What the trainer reads: stored chat completions of a two-turn rollout (the first turn's
sampled ids fed back), a reward set afterwards, exported by `tokenwire export-rollouts` and read
back from Parquet with no tokenizer (every pass's live server)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from tests.conftest import TEST_UPSTREAM, LiveServer

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"


def test_stored_rollouts_export_as_rows_a_trainer_reads(live_server: LiveServer,
                                                        tmp_path: Path) -> None:
    run = uuid.uuid4().hex
    with httpx.Client(base_url=live_server.base_url, timeout=120) as http:
        def turn(messages: list[dict[str, object]], n: int) -> dict[str, object]:
            r = http.post("/chat/completions", json={
                "model": MODEL, "messages": messages, "n": n, "temperature": 1.0, "seed": 7,
                "max_tokens": 12, "logprobs": True, "return_token_ids": True, "store": True,
                "metadata": {"run": run}, "tokenizer_version": "smollm2-49k"})
            assert r.status_code == 200, r.text
            return r.json()  # type: ignore[no-any-return]

        first = turn([{"role": "user", "content": "Name a fruit."}], 1)
        c = first["choices"][0]  # type: ignore[index]
        fed = c["token_ids"] + ([c["stop_reason"]] if c["finish_reason"] == "stop" else [])
        second = turn([{"role": "user", "content": "Name a fruit."},
                       {"role": "assistant", "content": c["message"]["content"],
                        "token_ids": fed},
                       {"role": "user", "content": "And a colour?"}], 2)
        r = http.post(f"/chat/completions/{second['id']}", json={
            "metadata": {"run": run, "reward": "0.75"}})
        assert r.status_code == 200, r.text
    out = tmp_path / "rollouts.parquet"
    done = subprocess.run(
        [sys.executable, "-m", "tokenwire", "export-rollouts", "--out", str(out),
         "--storage", str(live_server.settings.storage_url()), "--metadata", f"run={run}"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"3 rollouts -> {out}"
    rows = pq.read_table(out).to_pylist()  # no tokenizer: ids, masks and numbers only
    assert [(r["id"], r["choice"]) for r in rows] == [
        (first["id"], 0), (second["id"], 0), (second["id"], 1)]
    for row, choice, resp in [(rows[0], c, first), (rows[1], second["choices"][0], second),
                              (rows[2], second["choices"][1], second)]:
        stop = [choice["stop_reason"]] if choice["finish_reason"] == "stop" else []
        assert row["prompt_ids"] == resp["prompt_token_ids"]
        assert row["completion_ids"] == choice["token_ids"] + stop  # the stop id: sampled
        lps = [t["logprob"] for t in choice["logprobs"]["content"]] + (
            [choice["stop_logprob"]] if stop else [])
        assert row["completion_logprobs"] == pytest.approx(lps, abs=1e-6)
        assert len(row["loss_mask"]) == len(row["prompt_ids"]) + len(row["completion_ids"])
        assert row["finish_reason"] == choice["finish_reason"]
        if TEST_UPSTREAM != "llama-server":  # llama-server labels no weights
            assert row["weight_versions"] == choice["weight_versions"]
        assert row["model"] == MODEL and row["tokenizer_version"] == resp["tokenizer_version"]
    # the first turn's prompt was all template and user: nothing in it was sampled
    assert rows[0]["loss_mask"] == [0] * len(rows[0]["prompt_ids"]) + \
        [1] * len(rows[0]["completion_ids"])
    # the second turn's prompt holds the first turn's sampled ids, marked where they stand
    for row in rows[1:]:
        ids, mask = row["prompt_ids"], row["loss_mask"][:len(row["prompt_ids"])]
        marked = [i for i, m in enumerate(mask) if m]
        assert [ids[i] for i in marked] == fed
        assert marked == list(range(marked[0], marked[0] + len(fed)))  # one run
    assert [r["reward"] for r in rows] == [None, 0.75, 0.75]
    assert dict(rows[1]["metadata"]) == {"run": run, "reward": "0.75"}
