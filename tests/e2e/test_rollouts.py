"""What the trainer reads: stored chat completions of a two-turn rollout (the first turn's
sampled ids fed back), a reward set afterwards, exported by `tokenwire export-rollouts` and read
back from Parquet with no tokenizer (every pass's live server); the stop id of a record stored
without ids shown; rollouts of vLLM's /inference/v1/generate stored and exported alike."""

from __future__ import annotations

import json
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
    # one trajectory: the first turn, then the two samples the second turn drew after it
    trajectory = f"{first['id']}:0"
    assert [(r["trajectory_id"], r["turn"]) for r in rows] == [
        (trajectory, 0), (trajectory, 1), (trajectory, 1)]
    # the second turn's prompt holds the first turn's sampled ids, as context: each row marks
    # its own sample only, so every sampled id is marked exactly once over the trajectory
    for row in rows[1:]:
        assert row["prompt_ids"][:len(rows[0]["prompt_ids"]) + len(fed)] == \
            rows[0]["prompt_ids"] + fed
        assert row["loss_mask"] == [0] * len(row["prompt_ids"]) + [1] * len(row["completion_ids"])
    marked = [ids[k] for r in rows for ids in [r["prompt_ids"] + r["completion_ids"]]
              for k, m in enumerate(r["loss_mask"]) if m]
    assert marked == fed + rows[1]["completion_ids"] + rows[2]["completion_ids"]
    assert [r["reward"] for r in rows] == [None, 0.75, 0.75]
    assert dict(rows[1]["metadata"]) == {"run": run, "reward": "0.75"}


def export(live_server: LiveServer, tmp_path: Path, run: str) -> list[dict[str, object]]:
    """`tokenwire export-rollouts` of one run's records, read back from Parquet."""
    out = tmp_path / f"{run}.parquet"
    done = subprocess.run(
        [sys.executable, "-m", "tokenwire", "export-rollouts", "--out", str(out),
         "--storage", str(live_server.settings.storage_url()), "--metadata", f"run={run}"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return pq.read_table(out).to_pylist()  # type: ignore[no-any-return]


def test_the_stop_id_is_kept_when_the_response_shows_no_ids(live_server: LiveServer,
                                                            tmp_path: Path) -> None:
    """A record stored without ids shown keeps the id that ended each choice: the exported
    completion is the one the same greedy request shows with ids, stop id and its logprob
    last."""
    run = uuid.uuid4().hex
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Say only yes."}],
           "temperature": 0, "max_tokens": 16, "logprobs": True}
    with httpx.Client(base_url=live_server.base_url, timeout=120) as http:
        hidden = http.post("/chat/completions", json={**ask, "store": True,
                                                      "metadata": {"run": run}})
        shown = http.post("/chat/completions", json={**ask, "return_token_ids": True})
    assert hidden.status_code == shown.status_code == 200, (hidden.text, shown.text)
    h, c = hidden.json()["choices"][0], shown.json()["choices"][0]
    assert "stop_reason" not in h and "token_ids" not in h  # the response named no ids
    assert c["finish_reason"] == h["finish_reason"] == "stop" and isinstance(c["stop_reason"],
                                                                            int)
    [row] = export(live_server, tmp_path, run)
    assert row["completion_ids"] == c["token_ids"] + [c["stop_reason"]]
    assert row["stop_reason"] == c["stop_reason"]
    assert row["completion_logprobs"] == pytest.approx(
        [t["logprob"] for t in c["logprobs"]["content"]] + [c["stop_logprob"]], abs=1e-5)


def test_generate_rollouts_are_stored_and_exported_like_chats(live_server: LiveServer,
                                                              tmp_path: Path) -> None:
    """`store: true` on vLLM's /inference/v1/generate: two turns (the second streamed, its
    prompt the first's prompt and sampled ids as they came, rendered by the client), read back
    and given a reward at /v1/chat/completions/{id}, exported as one trajectory whose rows are
    vLLM's token_ids and logprobs."""
    run = uuid.uuid4().hex
    user = {"role": "user", "content": "Name a fruit."}
    with httpx.Client(base_url=live_server.url, timeout=120) as http:
        def render(messages: list[dict[str, object]]) -> list[int]:
            r = http.post("/v1/chat/completions/render", json={
                "model": MODEL, "messages": messages, "tokenizer_version": "smollm2-49k"})
            assert r.status_code == 200, r.text
            return r.json()["token_ids"]  # type: ignore[no-any-return]

        def body(prompt: list[int], turn: int, **more: object) -> dict[str, object]:
            return {"model": MODEL, "token_ids": prompt, "request_id": f"{run}-{turn}",
                    "store": True, "metadata": {"run": run}, **more,
                    "sampling_params": {"temperature": 1.0, "seed": 7, "max_tokens": 12,
                                        "logprobs": 0}}

        prompt1 = render([user])
        r = http.post("/inference/v1/generate", json=body(prompt1, 1))
        assert r.status_code == 200, r.text
        first = r.json()
        c1 = first["choices"][0]
        again = http.post("/inference/v1/generate", json=body(prompt1, 1))
        assert again.status_code == 400 and again.json()["error"]["code"] == "duplicate_id"
        prompt2 = render([user, {"role": "assistant", "content": "", "token_ids": c1["token_ids"]},
                          {"role": "user", "content": "And a colour?"}])
        assert prompt2[:len(prompt1) + len(c1["token_ids"])] == prompt1 + c1["token_ids"]
        ids2: list[int] = []
        logprobs2: list[float] = []
        with http.stream("POST", "/inference/v1/generate",
                         json=body(prompt2, 2, stream=True)) as s:
            assert s.status_code == 200
            for line in s.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for ch in json.loads(line[6:])["choices"]:
                    ids2 += ch["token_ids"]
                    logprobs2 += [e["logprob"] for e in ch["logprobs"]["content"]]
        # durable once the stream has said the choice finished: read it back as a chat
        # completion of its prompt ids, and give it its reward
        kept = http.get(f"/v1/chat/completions/generate-tokens-{run}-2",
                        params={"format": "tokens"})
        assert kept.status_code == 200, kept.text
        k = kept.json()
        assert k["prompt_token_ids"] == prompt2
        named = k["choices"][0].get("stop_reason")
        stop = [named] if isinstance(named, int) else []
        assert k["choices"][0]["message"]["token_ids"] + stop == ids2
        r = http.post(f"/v1/chat/completions/generate-tokens-{run}-2",
                      json={"metadata": {"run": run, "reward": "1"}})
        assert r.status_code == 200, r.text
    rows = export(live_server, tmp_path, run)
    assert [r["id"] for r in rows] == [f"generate-tokens-{run}-1", f"generate-tokens-{run}-2"]
    trajectory = f"generate-tokens-{run}-1:0"
    assert [(r["trajectory_id"], r["turn"]) for r in rows] == [(trajectory, 0), (trajectory, 1)]
    assert [r["prompt_ids"] for r in rows] == [prompt1, prompt2]
    assert [r["completion_ids"] for r in rows] == [c1["token_ids"], ids2]
    assert rows[0]["completion_logprobs"] == pytest.approx(
        [e["logprob"] for e in c1["logprobs"]["content"]], abs=1e-6)
    assert rows[1]["completion_logprobs"] == pytest.approx(logprobs2, abs=1e-6)
    for row in rows:
        assert row["loss_mask"] == [0] * len(row["prompt_ids"]) + [1] * len(row["completion_ids"])
        assert row["template_version"] is None and row["model"] == MODEL
    assert rows[0]["finish_reason"] == c1["finish_reason"]
    assert [r["reward"] for r in rows] == [None, 1.0]
