"""Clients written for vLLM, nobody here wrote, against the live server (embedded, or a
gateway): verifiers' TrainClient renders chat locally and calls /inference/v1/generate;
strands-agents runs a tool-calling agent through the strands-vllm provider."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.upstreams import hf_tokenizer_dir

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
ROLLOUT = Path(__file__).parents[1] / "clients" / "verifiers_rollout.py"
STRANDS_AGENT = Path(__file__).parents[1] / "clients" / "strands_agent.py"


def clients_python(variable: str = "TOKENWIRE_CLIENTS_PYTHON") -> str:
    python = os.environ.get(variable, "")
    if not Path(python).is_file():
        pytest.fail(f"no virtualenv with the client: `make test` builds it and sets {variable}",
                    pytrace=False)
    return python


def test_a_strands_agent_calls_its_tool_and_the_provider_gets_the_ids(
        live_server: LiveServer) -> None:
    run = subprocess.run([clients_python("TOKENWIRE_STRANDS_PYTHON"), str(STRANDS_AGENT),
                          live_server.base_url, MODEL], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    [line] = [x for x in run.stdout.splitlines() if x.startswith("{")]
    out = json.loads(line)
    assert out["calls"] and all(isinstance(c, str) and c for c in out["calls"])
    history = out["history"]
    assert len(history) >= 2  # the call, then the model call that read the tool's result
    for turn in history:
        assert turn["prompt_token_ids"] and turn["token_ids"]
    with httpx.Client(base_url=live_server.url, timeout=120) as http:
        text = http.post("/v1/detokenize", json={"tokenizer_version": "smollm2-49k",
                                                 "tokens": history[0]["token_ids"]}).json()
    assert '<tool_call>\n{"name": "get_weather", "arguments": ' in text["prompt"]
    # each prompt starts with the one before it (the history grows, nothing re-rendered there)
    for a, b in zip(history, history[1:], strict=False):
        assert b["prompt_token_ids"][:len(a["prompt_token_ids"])] == a["prompt_token_ids"]


def test_a_verifiers_trainclient_rollout(live_server: LiveServer, tmp_path: Path) -> None:
    tokenizer = hf_tokenizer_dir(tmp_path / "SmolLM2-135M-Instruct")
    run = subprocess.run([clients_python(), str(ROLLOUT), live_server.base_url, str(tokenizer),
                          MODEL], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    turns = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(turns) == 2
    with httpx.Client(base_url=live_server.url, timeout=120) as http:
        for turn in turns:
            assert turn["finish_reason"] in ("stop", "length") and turn["completion_ids"]
            logprobs = turn["completion_logprobs"]
            assert len(logprobs) == len(turn["completion_ids"])
            assert all(math.isfinite(x) and x <= 0 for x in logprobs)
            # the same prompt ids through our own chat endpoint sample the same ids (greedy)
            r = http.post("/v1/completions", json={
                "model": MODEL, "prompt": turn["prompt_ids"], "max_tokens": 24,
                "temperature": 0, "tokenizer_version": "smollm2-49k",
                "return_token_ids": True})
            choice = r.json()["choices"][0]
            assert [*choice["token_ids"], *([choice["stop_reason"]] if choice[
                "finish_reason"] == "stop" else [])] == turn["completion_ids"]
        # turn 1 was rendered by transformers' chat template; ours renders it in token space
        ours = http.post("/v1/tokenize", json={"model": MODEL,
                                               "messages": turns[0]["messages"]}).json()
        assert ours["tokens"] == turns[0]["prompt_ids"]
    # turn 2's prompt holds turn 1's sampled ids exactly: no re-tokenization in the loop
    first, second = turns
    sampled = first["completion_ids"]
    assert second["prompt_ids"][:len(first["prompt_ids"]) + len(sampled)] == \
        first["prompt_ids"] + sampled
