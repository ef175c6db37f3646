"""`tokenwire_tokenizer_conversions_total` on /metrics: the token-native chat path, on the real
engine, converts nothing; text in and text out cost exactly what they must."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import MODEL
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = [pytest.mark.anyio, pytest.mark.engine]

CONVERSIONS = "tokenwire_tokenizer_conversions_total"
QUESTION = "Count from one to ten."

Counts = dict[tuple[str, str], float]


async def conversions(client: httpx.AsyncClient) -> Counts:
    r = await client.get("/metrics")
    assert r.status_code == 200
    return {(s.labels["direction"], s.labels["reason"]): s.value
            for f in text_string_to_metric_families(r.text) for s in f.samples
            if s.name == CONVERSIONS}


def delta(before: Counts, after: Counts) -> Counts:
    """The series that moved, and by how much."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def body(content: Any, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 8, "temperature": 0, **kw}


def frames(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    data = [f[6:] for f in r.text.split("\n\n") if f.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(f) for f in data[:-1]]


@pytest.fixture
async def client(engine, make_app) -> AsyncIterator[httpx.AsyncClient]:  # type: ignore[no-untyped-def]
    app = make_app(engine)
    try:  # no lifespan: the engine is shared by the session (shutting down would close it)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            yield c
    finally:
        engine.on_step = None  # the next app to share the engine sets its own


@pytest.fixture
def ids(tok: HFTokenizer) -> list[int]:
    return tok.encode(QUESTION)  # before any scrape: the test's own encode is not counted


async def measured(client: httpx.AsyncClient, send: Callable[[], Any]) -> tuple[Counts, Any]:
    """The conversions one request made (after a first, identical one warmed the template)."""
    await send()
    before = await conversions(client)
    got = await send()
    return delta(before, await conversions(client)), got


async def test_the_token_native_path_converts_nothing(client: httpx.AsyncClient,
                                                      tok: HFTokenizer, ids: list[int]) -> None:
    """input_tokens in, `response_format_tokens: "only"` out, whole and streamed: not one
    encode or decode, for any reason, while the model samples real tokens."""
    req = body({"type": "input_tokens", "token_ids": ids}, tokenizer_version=tok.version,
               response_format_tokens="only")

    async def whole() -> dict[str, Any]:
        r = await client.post("/v1/chat/completions", json=req)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    moved, data = await measured(client, whole)
    assert moved == {}
    message = data["choices"][0]["message"]
    assert message["content"] is None and len(message["token_ids"]) >= 1

    async def streamed() -> list[dict[str, Any]]:
        return frames(await client.post("/v1/chat/completions", json={**req, "stream": True}))

    moved, chunks = await measured(client, streamed)
    assert moved == {}
    streamed_ids = [t for c in chunks for ch in c["choices"] for t in ch["delta"]["token_ids"]]
    assert streamed_ids == message["token_ids"]  # same seedless greedy run, same ids
    assert all(ch["delta"].get("content") is None for c in chunks for ch in c["choices"])


async def test_text_in_and_text_out_cost_one_encode_and_one_decode(
        client: httpx.AsyncClient, tok: HFTokenizer, ids: list[int]) -> None:
    """The same question as text: its one content encoded (the template's structure is kept
    encoded), and each choice's output made text once, however many chunks carry it."""

    async def whole() -> dict[str, Any]:
        r = await client.post("/v1/chat/completions", json=body(QUESTION))
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    moved, data = await measured(client, whole)
    assert moved == {("encode", "prompt"): 1, ("decode", "output"): 1}
    assert data["choices"][0]["message"]["content"]

    async def streamed() -> list[dict[str, Any]]:
        return frames(await client.post("/v1/chat/completions",
                                        json=body(QUESTION, stream=True)))

    moved, chunks = await measured(client, streamed)
    text_chunks = [c for c in chunks for ch in c["choices"] if ch["delta"].get("content")]
    assert len(text_chunks) >= 2  # several deltas, still one conversion
    assert moved == {("encode", "prompt"): 1, ("decode", "output"): 1}

    # ids in, text out: only the output is converted; n=2 choices, one decode each
    moved, _ = await measured(client, lambda: client.post("/v1/chat/completions", json=body(
        {"type": "input_tokens", "token_ids": ids}, tokenizer_version=tok.version, n=2,
        seed=7, temperature=0.8)))
    assert moved == {("decode", "output"): 2}


async def test_stop_strings_read_the_output_bytes(client: httpx.AsyncClient, tok: HFTokenizer,
                                                  ids: list[int]) -> None:
    """Where a conversion IS needed it stays and is named: stop strings are matched on the
    output's bytes, one decode per choice under reason "stop" (content is still null)."""

    async def send() -> dict[str, Any]:
        r = await client.post("/v1/chat/completions", json=body(
            {"type": "input_tokens", "token_ids": ids}, tokenizer_version=tok.version,
            response_format_tokens="only", stop=["\n\n\n"]))
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    moved, data = await measured(client, send)
    assert moved == {("decode", "stop"): 1}
    assert data["choices"][0]["message"]["content"] is None
