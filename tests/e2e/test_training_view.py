"""What a trainer needs of a sample, on the real model and a real server (every pass): the end
of turn the model sampled is part of the sample, with its logprob; fed back in an assistant's
`token_ids`, the render's mask marks it; and every choice names the weights that sampled it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import TEST_UPSTREAM, LiveServer

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"
VERSION = "smollm2-49k"
IM_END, IM_START = 2, 1


def turn(live_server: LiveServer, messages: list[Any]) -> tuple[Any, Any]:
    with openai.OpenAI(base_url=live_server.base_url, api_key="none") as client:
        r = client.chat.completions.create(
            model=MODEL, messages=messages, temperature=0, max_tokens=40, logprobs=True,
            extra_body={"return_token_ids": True, "tokenizer_version": VERSION})
    return r, r.choices[0]


def test_the_stop_id_is_part_of_the_sample(live_server: LiveServer) -> None:
    messages = [{"role": "user", "content": "Say only yes."}]
    r, c = turn(live_server, messages)
    extra = c.model_extra
    assert c.finish_reason == "stop" and extra["stop_reason"] == IM_END
    lps = [t.logprob for t in c.logprobs.content]
    assert len(lps) == len(extra["token_ids"])
    assert extra["stop_logprob"] <= 0.0
    if TEST_UPSTREAM != "llama-server":  # llama-server labels no weights
        [span] = extra["weight_versions"]
        assert (span["start"], span["end"]) == (0, len(extra["token_ids"]) + 1)
    # vLLM's generate keeps the stop id in its ids and logprobs: the same sample
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        gen = http.post("/inference/v1/generate", json={
            "model": MODEL, "token_ids": r.model_extra["prompt_token_ids"],
            "sampling_params": {"temperature": 0, "max_tokens": 40, "logprobs": 0}}).json()
    g = gen["choices"][0]
    assert g["token_ids"] == [*extra["token_ids"], IM_END]
    last = g["logprobs"]["content"][-1]
    assert last["token_id"] == IM_END
    assert last["logprob"] == pytest.approx(extra["stop_logprob"], abs=0.05)


def test_the_mask_marks_the_sampled_end_of_turn(live_server: LiveServer) -> None:
    first = [{"role": "user", "content": "Say only yes."}]
    _, c = turn(live_server, first)
    sampled = [*c.model_extra["token_ids"], c.model_extra["stop_reason"]]
    history = [*first, {"role": "assistant", "content": c.message.content,
                        "token_ids": sampled},
               {"role": "user", "content": "Say only no."}]
    body = {"model": MODEL, "tokenizer_version": VERSION, "messages": history,
            "check_drift": True}
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        with_end = http.post("/v1/chat/completions/render", json=body).json()
        history[1] = {**history[1], "token_ids": sampled[:-1]}
        without = http.post("/v1/chat/completions/render", json=body).json()
        # another control id at the end (sampled, then cut by max_tokens): this server lets
        # its loopback clients send raw prompts, so it is content, the model's
        history[1] = {**history[1], "token_ids": [*sampled[:-1], IM_START]}
        opened = http.post("/v1/chat/completions/render", json=body).json()
    ids, mask = with_end["token_ids"], with_end["sampled_mask"]
    assert ids == without["token_ids"]  # the same prompt: the sampled id is the template's
    assert "warnings" not in with_end  # not a drift: the end of turn is no text
    [span] = [s for s in with_end["spans"] if s["message_index"] == 1]
    assert ids[span["start"]:span["end"]] == sampled
    assert mask == [1 if span["start"] <= k < span["end"] else 0 for k in range(len(ids))]
    # without the sampled id, the template's end of turn is structure (0)
    assert without["sampled_mask"][span["end"] - 1] == 0
    [span] = [s for s in opened["spans"] if s["message_index"] == 1]
    assert opened["token_ids"][span["start"]:span["end"]] == [*sampled[:-1], IM_START]
    assert opened["token_ids"][span["end"]] == IM_END  # the template's: not sampled
    assert opened["sampled_mask"][span["start"]:span["end"] + 1] == [1] * len(sampled) + [0]
    # chat runs the same prompt
    _, c2 = turn(live_server, history[:1] + [{**history[1], "token_ids": sampled}] + history[2:])
    assert c2.finish_reason in ("stop", "length")


def test_a_response_says_which_weights_made_it(live_server: LiveServer) -> None:
    with openai.OpenAI(base_url=live_server.base_url, api_key="none") as client:
        r = client.responses.create(model=MODEL, input="Say only yes.", temperature=0,
                                    extra_body={"include": ["output.token_ids"]})
    sampled = [t for item in r.output for t in (item.model_extra or {}).get("token_ids", [])]
    spans = (r.model_extra or {}).get("weight_versions")
    if TEST_UPSTREAM == "llama-server":  # llama-server labels no weights
        assert spans is None
        return
    # over the whole output, the end of turn the model sampled included
    assert [(s["start"], s["end"]) for s in spans] == [(0, len(sampled) + 1)]
    assert r.usage is not None and r.usage.output_tokens == len(sampled) + 1


@pytest.mark.skipif(TEST_UPSTREAM != "", reason="the embedded engine's control plane (through "
                    "a gateway, versions change with the upstreams': tests/e2e/test_vllm.py)")
def test_a_stream_shows_new_weights_as_they_come(live_server: LiveServer) -> None:
    """pause?mode=keep, a new label, resume, in the middle of a stream: the chunk where the
    weights changed says so, and the last one has both spans."""
    body = {"model": MODEL, "stream": True, "temperature": 0, "max_tokens": 40,
            "ignore_eos": True, "messages": [{"role": "user", "content": "Tell me a story."}]}
    seen: list[list[dict[str, Any]]] = []
    n_chunks = 0
    with httpx.Client(base_url=live_server.url, timeout=60) as http, \
            httpx.Client(base_url=live_server.url, timeout=60) as admin:
        before = admin.get("/weight_info").json()["weight_version"]
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                n_chunks += 1
                for c in json.loads(line[6:])["choices"]:
                    if c.get("weight_versions"):
                        seen.append(c["weight_versions"])
                if n_chunks == 6:
                    try:
                        assert admin.post("/pause", params={"mode": "keep"}).status_code == 200
                        admin.post("/update_weight_version", json={"new_version": "mid-stream"})
                    finally:
                        assert admin.post("/resume").status_code == 200
    first, changed, last = seen[0], seen[1], seen[-1]
    assert first == [{"version": before, "start": 0, "end": 1}]
    [(old, new)] = [(changed[0], changed[1])]
    assert old["version"] == before and new["version"] == "mid-stream"
    assert old["end"] == new["start"] and new["end"] == new["start"] + 1
    assert last == [old, {"version": "mid-stream", "start": new["start"], "end": 40}]
