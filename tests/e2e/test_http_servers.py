"""tokenwire under granian (`--http-server granian`, HTTP/1.1), the server bench/sweep.py
measures beside uvicorn (the default): the same answers, a stream that carries every id, a
client that leaves mid-stream freeing its sequence, the engine in its process of its own. One
server process for the module."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.upstreams import Upstream, tokenwire_upstream

pytestmark = [pytest.mark.slow, pytest.mark.engine]


@pytest.fixture(scope="module")
def granian(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    server = tokenwire_upstream(tmp_path_factory.mktemp("granian"),
                                env={"TOKENWIRE_HTTP_SERVER": "granian"})
    yield server
    server.stop()


def running(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(
        r"^tokenwire_num_requests_running\{[^}]*\} (\S+)$", text, re.M))


def test_granian_serves_the_same_answers(granian: Upstream) -> None:
    log = Path(granian.log).read_text(errors="replace")
    assert "granian" in log.lower()  # it is granian that serves
    client = openai.OpenAI(base_url=f"{granian.url}/v1", api_key="unused")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Name three colours."}]
    whole = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=24, logprobs=True,
        top_logprobs=1, extra_body={"return_token_ids": True})  # type: ignore[arg-type]
    ids = whole.choices[0].model_extra["token_ids"]  # type: ignore[index]
    assert len(whole.choices[0].logprobs.content) == len(ids)  # type: ignore[union-attr]
    streamed: list[int] = []
    text = ""
    for chunk in client.chat.completions.create(
            model=model, messages=messages, temperature=0, max_tokens=24, stream=True,
            extra_body={"return_token_ids": True}):  # type: ignore[arg-type]
        for c in chunk.choices:
            streamed += c.model_extra.get("token_ids") or []  # type: ignore[union-attr]
            text += c.delta.content or ""
    assert streamed == ids and text == whole.choices[0].message.content


def test_a_client_that_leaves_mid_stream_frees_its_sequence(granian: Upstream) -> None:
    body = {"stream": True, "max_tokens": 3000, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell me a very long story."}]}
    with httpx.Client(base_url=granian.url, timeout=30) as http:
        body["model"] = http.get("/v1/models").json()["data"][0]["id"]
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = 0
            stream = r.iter_lines()  # held: see test_chat_openai's disconnect test
            for line in stream:
                lines += bool(line)
                if lines == 5:
                    break
            assert running(granian.url) == 1
    deadline = time.monotonic() + 15
    while running(granian.url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(granian.url) == 0
