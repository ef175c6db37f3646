"""`tokenizer_fallback: "translate"`: the output ids in the client's version, streamed or not,
are exactly encode_client(decode_model(sampled)); on a scripted engine, then the real model."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine, other_tokenizer
from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.registry import TokenizerRegistry

pytestmark = pytest.mark.anyio

OTHER = other_tokenizer()


@pytest.fixture
def client_version(registry: TokenizerRegistry) -> str:
    """The client's version: another family, whose end of text is `</s>`."""
    return registry.register(OTHER, aliases=["tiny"],
                             eos_id=OTHER.special_tokens["</s>"]).version


def _chat(version: str, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "tokenizer_version": version, "tokenizer_fallback": "translate",
            "messages": [{"role": "user", "content": {
                "type": "input_tokens", "token_ids": OTHER.encode("Bonjour à tous, ça va?")}}],
            **kw}


async def _frames(c: httpx.AsyncClient, path: str, payload: dict[str, Any],
                  ) -> list[dict[str, Any]]:
    r = await c.post(path, json={**payload, "stream": True})
    assert r.status_code == 200, r.text
    frames = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def _chat_stream(frames: list[dict[str, Any]]) -> tuple[list[int], str, Any]:
    ids: list[int] = []
    text = ""
    stop: Any = "unset"
    for f in frames:
        assert f["tokenizer_version"] == OTHER.version
        assert f["token_ids_source"] == "translated"
        for ch in f["choices"]:
            ids += ch["delta"]["token_ids"]
            text += ch["delta"].get("content") or ""
            if ch.get("finish_reason"):
                stop = ch.get("stop_reason")
    return ids, text, stop


async def _three_ways(c: httpx.AsyncClient, version: str, model_tok: HFTokenizer,
                      **kw: Any) -> tuple[list[int], Any]:
    """concat(delta.token_ids) == the non-stream token_ids == encode_client(decode_model(...))
    for chat, and the same for completions; returns the ids and stop_reason."""
    whole = (await c.post("/v1/chat/completions", json=_chat(
        version, response_format_tokens=True, return_token_ids=True, **kw))).json()
    choice = whole["choices"][0]
    ids, content = choice["message"]["token_ids"], choice["message"]["content"]
    assert choice["token_ids"] == ids
    assert whole["token_ids_source"] == "translated"
    assert ids == OTHER.encode(content)  # the model's text (valid UTF-8 here), re-encoded
    streamed, text, stop = _chat_stream(await _frames(c, "/v1/chat/completions", _chat(
        version, response_format_tokens=True, **kw)))
    assert streamed == ids and text == content == OTHER.decode(streamed)
    assert stop == choice.get("stop_reason")

    legacy = {"model": MODEL, "tokenizer_version": version, "tokenizer_fallback": "translate",
              "prompt": OTHER.encode("The quick brown fox"), "return_token_ids": True, **kw}
    lw = (await c.post("/v1/completions", json=legacy)).json()["choices"][0]
    assert lw["token_ids"] == OTHER.encode(lw["text"])
    ls: list[int] = []
    for f in await _frames(c, "/v1/completions", legacy):
        for ch in f["choices"]:
            ls += ch["token_ids"]
    assert ls == lw["token_ids"]
    return ids, choice.get("stop_reason")


async def test_scripted_output_three_ways(client: httpx.AsyncClient, tok: HFTokenizer,
                                          fake_engine: FakeEngine, client_version: str) -> None:
    ids, stop = await _three_ways(client, client_version, tok)
    assert ids == OTHER.encode(tok.decode(fake_engine.script))
    # the model's end of turn (its EOS) is the client version's EOS
    assert stop == OTHER.special_tokens["</s>"] != fake_engine.eog_id


async def test_stream_ids_are_not_re_encoded_per_delta(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine,
        client_version: str) -> None:
    """One model id per delta: encoding each delta's text on its own would give other ids."""
    text = "The lazy dog jumps over the quick brown fox, ça va?"
    fake_engine.script = tok.encode(text)
    per_delta = [t for i in fake_engine.script for t in OTHER.encode(tok.decode([i]))]
    assert per_delta != OTHER.encode(text)
    streamed, got, _ = _chat_stream(await _frames(client, "/v1/chat/completions", _chat(
        client_version, response_format_tokens=True)))
    assert got == text and streamed == OTHER.encode(text)


async def test_no_eos_in_the_client_version_means_no_stop_id(
        make_app, registry: TokenizerRegistry) -> None:  # type: ignore[no-untyped-def]
    version = registry.register(OTHER, aliases=["tiny"]).version  # no EOS registered
    async with serve_in_process(make_app()) as c:
        data = (await c.post("/v1/chat/completions", json=_chat(
            version, response_format_tokens=True))).json()
    choice = data["choices"][0]
    assert choice["finish_reason"] == "stop" and "stop_reason" not in choice  # omitted


@pytest.mark.engine
async def test_real_model_streams_in_the_client_version(
        engine, make_app, tok: HFTokenizer, client_version: str) -> None:  # type: ignore[no-untyped-def]
    """The real SmolLM2 engine samples; the client holds the other family's ids."""
    app = make_app(engine)
    # no lifespan: the engine is shared by the session (shutting the app down would close it)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as c:
        for seed in (1, 2):
            await _three_ways(c, client_version, tok, max_tokens=40, temperature=0.8,
                              seed=seed)
