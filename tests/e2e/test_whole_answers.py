"""Whole answers in one body (`upstream_whole_answers`), read in bulk (a `TokenRun`, logprobs
written as JSON: docs/hot-path.md): the same ids, logprobs and text as the same request
streamed from the same upstream, on real vLLM and on a second tokenwire (the passes whose
gateway speaks vLLM's API). A second gateway, in process, on the live server's upstream."""

from __future__ import annotations

import base64
from array import array
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import TEST_UPSTREAM, LiveServer, _free_port, start_server
from tokenwire.api.app import create_app

pytestmark = pytest.mark.skipif(TEST_UPSTREAM not in ("tokenwire", "vllm"),
                                reason="a gateway in front of vLLM's API (the tokenwire and "
                                "vLLM passes) asks for whole answers")


@pytest.fixture(scope="module")
def whole(live_server: LiveServer) -> Iterator[str]:
    settings = live_server.settings.model_copy(update={
        "port": _free_port(), "upstream_whole_answers": True})
    server, thread = start_server(create_app(settings), settings.port)
    yield f"http://127.0.0.1:{settings.port}"
    server.should_exit = True
    thread.join(timeout=60)


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _model(url: str) -> str:
    return str(httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"])


def test_a_whole_chat_answer_is_the_streamed_one(live_server: LiveServer, whole: str) -> None:
    body = {"model": _model(whole), "temperature": 0, "max_tokens": 40, "n": 2,
            "messages": [{"role": "user", "content": "Name three colours."}],
            "logprobs": True, "top_logprobs": 2, "return_token_ids": True}
    streamed = _post(live_server.url, "/v1/chat/completions", body)  # streamed from upstream
    bulk = _post(whole, "/v1/chat/completions", body)  # one body from upstream, in bulk
    for a, b in zip(streamed["choices"], bulk["choices"], strict=True):
        assert b["token_ids"] == a["token_ids"] and b["message"] == a["message"]
        assert len(b["logprobs"]["content"]) == len(b["token_ids"])
        for x, y in zip(a["logprobs"]["content"], b["logprobs"]["content"], strict=True):
            assert (y["id"], y["token"], y["bytes"]) == (x["id"], x["token"], x["bytes"])
            assert y["logprob"] == pytest.approx(x["logprob"], abs=1e-4)
            assert [t["id"] for t in y["top_logprobs"]] == [t["id"] for t in x["top_logprobs"]]
    # (the cached prompt tokens differ: the second request finds the first's prefix cached)
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert bulk["usage"][key] == streamed["usage"][key]


def test_a_whole_generate_answer_is_the_streamed_one(live_server: LiveServer,
                                                     whole: str) -> None:
    prompt = httpx.post(live_server.url + "/v1/tokenize", json={
        "model": _model(whole), "prompt": "The capital of France is"}, timeout=10).json()
    body = {"model": _model(whole), "token_ids": prompt["tokens"],
            "sampling_params": {"max_tokens": 24, "temperature": 0, "logprobs": 1}}
    a = _post(live_server.url, "/inference/v1/generate", body)["choices"][0]
    b = _post(whole, "/inference/v1/generate", body)["choices"][0]
    assert b["token_ids"] == a["token_ids"] and b["finish_reason"] == a["finish_reason"]
    for x, y in zip(a["logprobs"]["content"], b["logprobs"]["content"], strict=True):
        assert (y["token_id"], y["token"], y.get("rank")) == \
            (x["token_id"], x["token"], x.get("rank"))
        assert y["logprob"] == pytest.approx(x["logprob"], abs=1e-4)
    # the bulk answer's ids as base64 (`encoding_format`): the same ids
    c = _post(whole, "/inference/v1/generate", {**body, "encoding_format": "base64"})
    assert array("i", base64.b64decode(c["choices"][0]["token_ids"])).tolist() == b["token_ids"]
