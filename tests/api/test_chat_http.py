"""The chat endpoint's HTTP contract, in process, on a scripted engine with the real tokenizer."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine, other_tokenizer
from tokenwire.protocol.chat import ChatCompletionChunk
from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.registry import TokenizerRegistry

pytestmark = pytest.mark.anyio


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], **kw}


async def post(client: httpx.AsyncClient, payload: Any) -> httpx.Response:
    return await client.post("/v1/chat/completions", json=payload)


async def sse(client: httpx.AsyncClient, payload: dict[str, Any]) -> list[dict[str, Any]]:
    r = await post(client, {**payload, "stream": True})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


async def test_plain_request_gets_a_plain_openai_response(client: httpx.AsyncClient,
                                                          tok: HFTokenizer,
                                                          fake_engine: FakeEngine) -> None:
    r = await post(client, body())
    assert r.status_code == 200
    data = r.json()
    assert data["object"] == "chat.completion"
    assert data["id"].startswith("chatcmpl-")
    for key in ("prompt_token_ids", "tokenizer_version", "token_ids_source"):
        assert key not in data
    choice = data["choices"][0]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["message"] == {"role": "assistant", "content": tok.decode(fake_engine.script),
                                 "refusal": None}
    assert choice["finish_reason"] == "stop"
    assert data["usage"] == {
        "prompt_tokens": len(fake_engine.prompts[0]),
        "completion_tokens": len(fake_engine.script) + 1,  # the end-of-turn token counts
        "total_tokens": len(fake_engine.prompts[0]) + len(fake_engine.script) + 1,
    }


async def test_token_output_flags(client: httpx.AsyncClient, tok: HFTokenizer,
                                  fake_engine: FakeEngine) -> None:
    r = await post(client, body(response_format_tokens=True, return_token_ids=True))
    data = r.json()
    choice = data["choices"][0]
    assert choice["message"]["token_ids"] == fake_engine.script
    assert choice["message"]["content"] == tok.decode(fake_engine.script)
    assert choice["token_ids"] == fake_engine.script
    assert data["prompt_token_ids"] == fake_engine.prompts[0]
    assert data["tokenizer_version"] == tok.version
    assert data["token_ids_source"] == "sampled"
    assert choice["stop_reason"] == fake_engine.eog_id

    only = (await post(client, body(response_format_tokens="only"))).json()
    assert only["choices"][0]["message"]["content"] is None
    assert only["choices"][0]["message"]["token_ids"] == fake_engine.script
    assert "prompt_token_ids" not in only


async def test_text_and_its_canonical_ids_give_the_same_prompt(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    text = "What is 2+2? Answer <|im_start|> literally."
    ids = tok.encode(text)
    as_text = (await post(client, body(messages=[{"role": "user", "content": text}],
                                       return_token_ids=True))).json()
    as_ids = (await post(client, body(
        messages=[{"role": "user", "content": {"type": "input_tokens", "token_ids": ids}}],
        tokenizer_version=tok.version, return_token_ids=True))).json()
    half = len(text) // 2
    mixed = (await post(client, body(
        messages=[{"role": "user", "content": [
            {"type": "text", "text": text[:half]},
            {"type": "input_tokens", "token_ids": tok.encode(text[half:])}]}],
        tokenizer_version=tok.family, return_token_ids=True))).json()
    assert as_text["prompt_token_ids"] == as_ids["prompt_token_ids"]
    assert mixed["tokenizer_version"] == tok.version  # an alias in, the full id out
    # the sent ids are in the prompt exactly as sent
    p = as_ids["prompt_token_ids"]
    assert any(p[i:i + len(ids)] == ids for i in range(len(p)))
    mp = mixed["prompt_token_ids"]
    assert tok.decode(mp) == tok.decode(p)


async def test_assistant_history_ids_are_used_verbatim(client: httpx.AsyncClient,
                                                       tok: HFTokenizer) -> None:
    turn1 = (await post(client, body(return_token_ids=True))).json()
    sampled = turn1["choices"][0]["token_ids"]
    # a non-canonical spelling of the same text must survive: the model sampled it
    odd = [tok.encode("B")[0], *tok.encode("onjour")]
    turn2 = (await post(client, body(
        tokenizer_version=tok.version, return_token_ids=True,
        messages=[{"role": "user", "content": "Hello!"},
                  {"role": "assistant", "content": "ignored", "token_ids": sampled + odd},
                  {"role": "user", "content": "Again"}]))).json()
    prefix = turn1["prompt_token_ids"] + sampled + odd
    assert turn2["prompt_token_ids"][:len(prefix)] == prefix
    end = tok.special_id("<|im_end|>")
    assert turn2["prompt_token_ids"][len(prefix)] == end
    assert turn2["prompt_token_ids"][len(prefix) + 1] != end


async def test_stream_matches_non_stream(client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    payload = body(response_format_tokens=True, return_token_ids=True, seed=7,
                   stream_options={"include_usage": True})
    whole = (await post(client, {k: v for k, v in payload.items()
                                 if k != "stream_options"})).json()
    chunks = await sse(client, payload)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "",
                                                "token_ids": []}
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(c["tokenizer_version"] == tok.version for c in chunks)
    ids: list[int] = []
    text = ""
    for c in chunks[1:-2]:
        delta = c["choices"][0]["delta"]
        ids += delta["token_ids"]
        assert c["choices"][0]["token_ids"] == delta["token_ids"]
        text += delta["content"]
        assert "\ufffd" not in delta["content"]
    assert ids == whole["choices"][0]["message"]["token_ids"]
    assert text == tok.decode(ids) == whole["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-2]["choices"][0]["delta"] == {"token_ids": []}
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == whole["usage"]
    # a character split across ids: its first ids arrive with content ""
    assert any(c["choices"][0]["delta"].get("content") == "" and c["choices"][0]["delta"].get(
        "token_ids") for c in chunks[1:])


async def test_plain_stream_has_no_token_fields(client: httpx.AsyncClient) -> None:
    chunks = await sse(client, body())
    for c in chunks:
        assert "tokenizer_version" not in c and "prompt_token_ids" not in c
        assert "usage" not in c
        for ch in c["choices"]:
            assert "token_ids" not in ch["delta"] and "token_ids" not in ch


async def test_logprobs_carry_ids(client: httpx.AsyncClient, tok: HFTokenizer,
                                  fake_engine: FakeEngine) -> None:
    data = (await post(client, body(logprobs=True, top_logprobs=2))).json()
    entries = data["choices"][0]["logprobs"]["content"]
    assert [e["id"] for e in entries] == fake_engine.script
    for e in entries:
        assert bytes(e["bytes"]) == tok.token_bytes(e["id"])
        assert [t["id"] for t in e["top_logprobs"]] == [e["id"], e["id"] + 1]
    partial = [e for e in entries if e["token"].startswith("bytes:")]
    assert partial, "the script has a character split across ids"
    assert all("\\x" in e["token"] for e in partial)


async def test_stop_strings_and_max_tokens(client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    # "tous" begins inside the token " t"
    assert [tok.token_bytes(i) for i in tok.encode(" tous")] == [b" t", b"ous"]
    plain = (await post(client, body(stop=["tous"]))).json()["choices"][0]
    assert plain["finish_reason"] == "stop"
    assert plain["message"]["content"] == "Bonjour à "  # exactly before the stop, as OpenAI
    chunks = await sse(client, body(stop=["tous"]))
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Bonjour à "
    # with ids shown, the text is the text of the ids: the straddling token is left out
    ch = (await post(client, body(stop=["tous"], response_format_tokens=True))).json()
    ch = ch["choices"][0]
    assert ch["finish_reason"] == "stop" and ch["stop_reason"] == "tous"
    assert ch["message"]["content"] == "Bonjour à"
    assert tok.decode(ch["message"]["token_ids"]) == ch["message"]["content"]
    data = (await post(client, body(max_tokens=2))).json()
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 2


async def test_n_choices(client: httpx.AsyncClient) -> None:
    data = (await post(client, body(n=3))).json()
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    chunks = await sse(client, body(n=2))
    finished = [c["choices"][0]["index"] for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1]


@pytest.fixture
def second_version(registry: TokenizerRegistry) -> str:
    return registry.register(other_tokenizer(), aliases=["tiny"]).version


def _ids(ids: Any, **kw: Any) -> dict[str, Any]:
    return body(messages=[{"role": "user", "content": {"type": "input_tokens",
                                                       "token_ids": ids}}], **kw)


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

BAD: list[tuple[str, Any, int, str, str | None]] = [
    ("no messages", {"model": MODEL}, 400, "missing_required_parameter", "messages"),
    ("empty messages", body(messages=[]), 400, "invalid_value", "messages"),
    ("ids without version", _ids([1, 2]), 400, "tokenizer_version_required",
     "tokenizer_version"),
    ("unknown version", _ids([1], tokenizer_version="nope@sha256:0000000000000000"), 400,
     "unknown_tokenizer_version", "tokenizer_version"),
    ("id out of range", _ids([5, 49152], tokenizer_version="smollm2-49k"), 400,
     "invalid_token_id", "messages[0].content.token_ids[1]"),
    ("negative id", body(tokenizer_version="smollm2-49k", messages=[{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "input_tokens", "token_ids": [3, -1]}]}]), 400,
     "invalid_token_id", "messages[0].content[1].token_ids[1]"),
    ("string id", _ids([1, "2"], tokenizer_version="smollm2-49k"), 400, "invalid_token_id",
     "messages[0].content.token_ids[1]"),
    ("float id", _ids([1.5], tokenizer_version="smollm2-49k"), 400, "invalid_token_id",
     "messages[0].content.token_ids[0]"),
    ("bool id", _ids([True], tokenizer_version="smollm2-49k"), 400, "invalid_token_id",
     "messages[0].content.token_ids[0]"),
    ("assistant id out of range", body(tokenizer_version="smollm2-49k", messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "token_ids": [1, 2, 10**12]}]), 400, "invalid_token_id",
     "messages[1].token_ids[2]"),
    ("image block", body(messages=[{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}]),
     400, "invalid_value", "messages[0].content[1]"),
    ("block without ids", body(messages=[{"role": "user", "content": {"type": "input_tokens"}}]),
     400, "missing_required_parameter", "messages[0].content.token_ids"),
    ("ids not a list", _ids(7, tokenizer_version="smollm2-49k"), 400, "invalid_type",
     "messages[0].content.token_ids"),
    ("numeric content", body(messages=[{"role": "user", "content": 5}]), 400, "invalid_value",
     "messages[0].content"),
    ("empty content array", body(messages=[{"role": "user", "content": []}]), 400,
     "invalid_value", "messages[0].content"),
    ("bad role", body(messages=[{"role": "robot", "content": "x"}]), 400, "invalid_value",
     "messages[0].role"),
    ("user token_ids", body(tokenizer_version="smollm2-49k",
                            messages=[{"role": "user", "token_ids": [1]}]),
     400, "invalid_value", "messages[0].token_ids"),
    ("assistant without content", body(messages=[{"role": "assistant"}]), 400,
     "missing_required_parameter", "messages[0].content"),
    ("unknown field", body(foo=1), 400, "unknown_parameter", "foo"),
    ("string temperature", body(temperature="1"), 400, "invalid_type", "temperature"),
    ("temperature too high", body(temperature=3), 400, "invalid_value", "temperature"),
    ("legacy functions", body(functions=[{"name": "f"}]), 400, "unsupported_parameter",
     "functions"),
    ("logit_bias out of range", body(logit_bias={"49152": 1}), 400, "invalid_value",
     "logit_bias"),
    ("logit_bias twice", body(logit_bias={"5": 1, "05": 2}), 400, "invalid_value",
     "logit_bias"),
    ("top_k below -1", body(top_k=-2), 400, "invalid_value", "top_k"),
    ("string top_k", body(top_k="5"), 400, "invalid_type", "top_k"),
    ("repetition_penalty zero", body(repetition_penalty=0), 400, "invalid_value",
     "repetition_penalty"),
    ("min_tokens over max_tokens", body(max_tokens=2, min_tokens=5), 400, "invalid_value",
     "min_tokens"),
    ("stop_token_ids out of range", body(stop_token_ids=[1, 99999]), 400,
     "invalid_token_id", "stop_token_ids[1]"),
    ("continue and a generation prompt", body(continue_final_message=True), 400,
     "invalid_value", "continue_final_message"),
    ("reserved template variable", body(chat_template_kwargs={"messages": []}), 400,
     "invalid_value", "chat_template_kwargs.messages"),
    ("non-zero priority", body(priority=2), 400, "unsupported_parameter", "priority"),
    ("verbosity", body(verbosity="low"), 400, "unsupported_parameter", "verbosity"),
    ("custom chat template", body(chat_template="{{ messages }}"), 400,
     "unsupported_parameter", "chat_template"),
    ("bad_words", body(bad_words=["x"]), 400, "unsupported_parameter", "bad_words"),
    ("empty cache_salt", body(cache_salt=""), 400, "invalid_value", "cache_salt"),
    ("tool_choice without tools", body(tool_choice="required"), 400, "invalid_value",
     "tool_choice"),
    ("unknown named tool", body(tools=[TOOL], tool_choice={
        "type": "function", "function": {"name": "g"}}), 400, "invalid_value",
     "tool_choice.function.name"),
    ("bad function name", body(tools=[{"type": "function", "function": {"name": "a b"}}]),
     400, "invalid_value", "tools[0].function.name"),
    # (what a grammar library refuses is the engine's to say: tests/serving/test_structured.py,
    # tests/e2e/test_structured.py)
    ("schema too large to compile", body(response_format={
        "type": "json_schema", "json_schema": {"name": "n", "schema": {
            "type": "object", "description": "x" * 300_000}}}),
     400, "unsupported_parameter", "response_format.json_schema.schema"),
    ("tool schema too large to compile", body(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "description": "x" * 300_000}}}],
        tool_choice="required"),
     400, "unsupported_parameter", "tools[0].function.parameters"),
    ("json format with tools", body(tools=[TOOL], response_format={"type": "json_object"}),
     400, "unsupported_parameter", "response_format"),
    ("tool message without its call id", body(messages=[
        {"role": "user", "content": "x"}, {"role": "tool", "content": "1"}]), 400,
     "missing_required_parameter", "messages[1].tool_call_id"),
    ("reserved character in a name", body(messages=[
        {"role": "user", "content": "x", "name": "a\ue002b"}]), 400, "invalid_value",
     "messages[0].name"),
    ("tool_calls on a user message", body(messages=[{"role": "user", "content": "x",
        "tool_calls": [{"id": "c", "type": "function",
                        "function": {"name": "f", "arguments": "{}"}}]}]), 400,
     "invalid_value", "messages[0].tool_calls"),
    ("prompt_logprobs streamed", body(prompt_logprobs=1, stream=True), 400, "invalid_value",
     "prompt_logprobs"),
    ("n zero", body(n=0), 400, "invalid_value", "n"),
    ("n too large", body(n=1000), 400, "invalid_value", "n"),
    ("top_logprobs alone", body(top_logprobs=2), 400, "invalid_value", "top_logprobs"),
    ("top_logprobs too many", body(logprobs=True, top_logprobs=21), 400, "invalid_value",
     "top_logprobs"),
    ("five stops", body(stop=list("abcde")), 400, "invalid_value", "stop"),
    ("format flag", body(response_format_tokens="yes"), 400, "invalid_value",
     "response_format_tokens"),
    ("format flag as int", body(response_format_tokens=1), 400, "invalid_value",
     "response_format_tokens"),
    ("stream_options without stream", body(stream_options={"include_usage": True}), 400,
     "invalid_value", "stream_options"),
    ("prompt too long", _ids([253] * 2100, tokenizer_version="smollm2-49k"), 400,
     "context_length_exceeded", "messages"),
    ("max_tokens too large", body(max_tokens=5000), 400, "context_length_exceeded",
     "max_tokens"),
    ("max_tokens zero", body(max_tokens=0), 400, "invalid_value", "max_tokens"),
    ("unknown model", body(model="gpt-9"), 404, "model_not_found", "model"),
    ("not an object", [1, 2], 400, "invalid_type", None),
    ("fallback typo", body(tokenizer_fallback="maybe"), 400, "invalid_value",
     "tokenizer_fallback"),
]


@pytest.mark.parametrize(("case", "payload", "status", "code", "param"), BAD,
                         ids=[b[0] for b in BAD])
async def test_bad_requests(client: httpx.AsyncClient, fake_engine: FakeEngine, case: str,
                            payload: Any, status: int, code: str, param: str | None) -> None:
    r = await post(client, payload)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["code"], err["param"]) == (code, param), err
    assert err["message"]
    assert fake_engine.prompts == []  # a bad request never reaches the engine
    # and the server answers the next good request normally
    assert (await post(client, body())).status_code == 200


async def test_version_mismatch_names_the_model_version(
        client: httpx.AsyncClient, tok: HFTokenizer, second_version: str) -> None:
    r = await post(client, _ids([1, 2], tokenizer_version=second_version))
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("tokenizer_version_mismatch", "tokenizer_version")
    assert tok.version in err["message"]


async def test_ids_checked_against_their_own_version(client: httpx.AsyncClient,
                                                     second_version: str) -> None:
    r = await post(client, _ids([400], tokenizer_version="tiny",
                                tokenizer_fallback="translate"))
    assert r.json()["error"]["code"] == "invalid_token_id"


async def test_translate_fallback_goes_through_text(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine,
        second_version: str) -> None:
    other = other_tokenizer()
    text = "Bonjour à tous, ça va?"
    r = await post(client, _ids(other.encode(text), tokenizer_version=second_version,
                                tokenizer_fallback="translate", response_format_tokens=True))
    data = r.json()
    assert data["tokenizer_version"] == second_version
    assert data["token_ids_source"] == "translated"
    want, got = tok.encode(text), fake_engine.prompts[0]
    assert any(got[i:i + len(want)] == want for i in range(len(got)))
    out = data["choices"][0]["message"]
    assert other.decode(out["token_ids"]) == out["content"] == tok.decode(fake_engine.script)


async def test_http_errors_are_openai_shaped(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await client.put("/v1/chat/completions")  # GET lists stored completions
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = await client.post("/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


async def test_models_endpoint(client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    data = (await client.get("/v1/models")).json()
    assert data["object"] == "list"
    [card] = data["data"]
    assert card["id"] == MODEL and card["object"] == "model"
    assert card["tokenizer_version"] == tok.version
    assert card["max_model_len"] == 2048
    assert (await client.get(f"/v1/models/{MODEL}")).json() == card
    assert (await client.get("/v1/models/other")).json()["error"]["code"] == "model_not_found"


@pytest.mark.engine
async def test_a_request_without_a_limit_stops_at_the_default(engine, make_app) -> None:  # type: ignore[no-untyped-def]
    """TOKENWIRE_DEFAULT_MAX_TOKENS bounds a request that names no limit (the real model asked
    for a long answer runs into it); a named limit still wins, and it never causes a context
    error by itself."""
    ask = [{"role": "user", "content": "Write a long story about a dragon."}]
    app = make_app(engine, default_max_tokens=5)
    # no lifespan: the engine is shared by the session (shutting the app down would close it)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as c:
        data = (await c.post("/v1/chat/completions", json=body(
            messages=ask, temperature=0))).json()
        assert data["choices"][0]["finish_reason"] == "length"
        assert data["usage"]["completion_tokens"] == 5
        named = (await c.post("/v1/chat/completions", json=body(
            messages=ask, temperature=0, max_tokens=7))).json()
        assert named["usage"]["completion_tokens"] == 7
        legacy = (await c.post("/v1/completions", json={
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": None,
            "temperature": 0})).json()
        assert legacy["usage"]["completion_tokens"] == 5



async def test_the_default_limit_is_bounded_by_the_room_the_prompt_leaves(  # type: ignore[no-untyped-def]
        make_app, fake_engine: FakeEngine) -> None:
    async with serve_in_process(make_app(default_max_tokens=5000)) as c:
        r = await c.post("/v1/chat/completions", json=body())
        assert r.status_code == 200  # 5000 > the 2048 context: the room bounds it instead
    [prompt], [params] = fake_engine.prompts, fake_engine.params
    assert params.max_tokens == 2048 - len(prompt)


async def test_a_plain_text_chunk_is_the_bytes_the_model_writes(make_app: Any, tok: HFTokenizer,
                                                                fake_engine: FakeEngine) -> None:
    """Plain text chunks are written from frames (serving/chat_response.py `ChatChunks._frame`):
    each is byte for byte what the chunk's model writes, whatever the text (quotes, escapes,
    control characters, a character split across ids), with and without the token-native
    envelope."""
    fake_engine.script = tok.encode('Say "hi"\\\n\ttab \x01 \u2028 é 🎉 done')
    async with serve_in_process(make_app()) as client:
        for extra in ({}, {"n": 2}, {"tokenizer_version": tok.version,
                                     "messages": [{"role": "user", "content": {
                                         "type": "input_tokens", "token_ids": [19556]}}]}):
            r = await post(client, {**body(), **extra, "stream": True})
            frames = [ln[6:] for ln in r.text.split("\n\n") if ln.startswith("data: {")]
            plain = [f for f in frames if '"content":' in f and '"role"' not in f]
            assert len(plain) >= 10
            for f in plain:
                assert ChatCompletionChunk.model_validate_json(f).model_dump_json() == f
            texts: dict[int, str] = {}
            for f in plain:
                choice = json.loads(f)["choices"][0]
                texts[choice["index"]] = texts.get(choice["index"], "") + \
                    choice["delta"]["content"]
            assert texts == {i: tok.decode(fake_engine.script) for i in range(extra.get("n", 1))}
