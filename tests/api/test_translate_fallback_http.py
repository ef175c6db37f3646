"""`tokenizer_fallback: "translate"`: the output ids in the client's version, streamed or not,
are exactly encode_client(decode_model(sampled)); on a scripted engine, then the real model."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import serve_in_process, stream_frames
from tests.fakes import MODEL, FakeEngine, other_tokenizer
from tokenwire.serving.logprobs import token_text
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
    streamed, text, stop = _chat_stream(await stream_frames(c, "/v1/chat/completions", _chat(
        version, response_format_tokens=True, **kw)))
    assert streamed == ids and text == content == OTHER.decode(streamed)
    assert stop == choice.get("stop_reason")

    legacy = {"model": MODEL, "tokenizer_version": version, "tokenizer_fallback": "translate",
              "prompt": OTHER.encode("The quick brown fox"), "return_token_ids": True, **kw}
    lw = (await c.post("/v1/completions", json=legacy)).json()["choices"][0]
    assert lw["token_ids"] == OTHER.encode(lw["text"])
    ls: list[int] = []
    for f in await stream_frames(c, "/v1/completions", legacy):
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
    streamed, got, _ = _chat_stream(await stream_frames(client, "/v1/chat/completions", _chat(
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


async def test_logprobs_show_the_client_versions_ids(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine,
        client_version: str) -> None:
    """Each entry is the model's token as it scored it; `id` is the client version's one id
    for the token's bytes, and is left out where the client spells it with several ids."""
    fake_engine.script = tok.encode("The quick brown fox, ça va? Zebra")

    def want_id(model_id: int) -> int | None:
        data = tok.token_bytes(model_id)
        try:
            ids = OTHER.encode(data.decode())
        except UnicodeDecodeError:  # part of a character: only a lone byte has one id
            ids = [i for i in range(OTHER.vocab_size)
                   if OTHER.token_bytes(i) == data and len(data) == 1]
        return ids[0] if len(ids) == 1 else None

    data = (await client.post("/v1/chat/completions", json=_chat(
        client_version, logprobs=True, top_logprobs=2))).json()
    entries = data["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == [token_text(tok, t) for t in fake_engine.script]
    shown = [(e.get("id"), want_id(t)) for e, t in zip(entries, fake_engine.script, strict=True)]
    assert all(got == want for got, want in shown)
    assert any(g is None for g, _ in shown) and any(g is not None for g, _ in shown)
    for e in entries:  # the candidates follow the same rule
        for top in e["top_logprobs"]:
            model_id = next(t for t in range(tok.vocab_size)
                            if list(tok.token_bytes(t)) == top["bytes"])
            assert top.get("id") == want_id(model_id)
    # streamed: the same entries
    streamed = [e for f in await stream_frames(client, "/v1/chat/completions", _chat(
        client_version, logprobs=True, top_logprobs=2))
        for ch in f["choices"] for e in (ch.get("logprobs") or {}).get("content") or []]
    assert streamed == entries
    # the legacy shape: `token_ids` parallel to `tokens`, null where no one id exists
    legacy = (await client.post("/v1/completions", json={
        "model": MODEL, "tokenizer_version": client_version, "tokenizer_fallback": "translate",
        "prompt": OTHER.encode("The quick"), "logprobs": 1})).json()["choices"][0]["logprobs"]
    assert legacy["token_ids"] == [want_id(t) for t in fake_engine.script]


@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/chat/completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "return_tokens_as_token_ids": True},
     "return_tokens_as_token_ids"),
    ("/v1/completions", {"echo": True, "logprobs": 1}, "echo"),
])
async def test_what_names_the_models_prompt_ids_is_refused_under_translate(
        client: httpx.AsyncClient, client_version: str, path: str, extra: dict[str, Any],
        param: str) -> None:
    body = _chat(client_version, **extra) if path.endswith("chat/completions") else {
        "model": MODEL, "tokenizer_version": client_version, "tokenizer_fallback": "translate",
        "prompt": OTHER.encode("The quick"), **extra}
    r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_responses_stream_translates_as_a_stream(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine,
        client_version: str) -> None:
    """The Responses API: the delta events' ids, concatenated, are the whole response's ids,
    which are encode_client(decode_model(sampled)) (not each delta re-encoded on its own)."""
    text = "The lazy dog jumps over the quick brown fox, ça va?"
    fake_engine.script = tok.encode(text)
    body = {"model": MODEL, "tokenizer_version": client_version,
            "tokenizer_fallback": "translate", "include": ["output.token_ids"],
            "input": [{"role": "user", "content": [{
                "type": "input_tokens", "token_ids": OTHER.encode("Bonjour à tous")}]}]}
    whole = (await client.post("/v1/responses", json=body)).json()
    [item] = whole["output"]
    assert whole["token_ids_source"] == "translated"
    assert item["token_ids"] == OTHER.encode(text) and item["content"][0]["text"] == text
    r = await client.post("/v1/responses", json={**body, "stream": True})
    events = [json.loads(line[6:]) for line in r.text.split("\n") if line.startswith("data: ")]
    deltas = [t for e in events if e["type"] == "response.output_text.delta"
              for t in e.get("token_ids") or []]
    done = next(e for e in events if e["type"] == "response.completed")
    assert deltas == done["response"]["output"][0]["token_ids"] == OTHER.encode(text)
