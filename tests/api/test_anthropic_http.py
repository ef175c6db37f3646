"""POST /v1/messages (Anthropic's Messages API) over HTTP, in process, on a scripted engine with
the real tokenizer and template: shapes, events, ids, params and errors in Anthropic's shape
(the real model and the official SDK: tests/e2e/test_anthropic_sdk.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.api.test_responses_http import typed_events
from tests.api.test_tools_http import OUTPUT
from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine
from tokenwire.errors import RateLimitError
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.anyio

WEATHER = {"name": "get_weather", "description": "The weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
TOKEN_NATIVE = {"tokenizer_version", "template_version", "token_ids_source", "prompt_token_ids",
                "weight_versions", "warnings"}


def req(content: Any = "Hello!", **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 256, "messages": [{"role": "user", "content": content}],
            **kw}


async def post(client: httpx.AsyncClient, payload: Any, path: str = "/v1/messages",
               ) -> httpx.Response:
    return await client.post(path, json=payload)


async def events(client: httpx.AsyncClient, payload: dict[str, Any]) -> list[dict[str, Any]]:
    return typed_events(await post(client, {**payload, "stream": True}))


def error(r: httpx.Response, status: int = 400) -> tuple[str, str, str | None]:
    """Anthropic's error body: (type, tokenwire's code, the param it names)."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}
    err = body["error"]
    return err["type"], err["details"]["error_code"], err["details"]["param"]


async def test_a_plain_request_gets_a_plain_anthropic_message(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    r = await post(client, req())
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["id"].startswith("msg_") and m["type"] == "message" and m["role"] == "assistant"
    assert m["model"] == MODEL
    assert m["content"] == [{"type": "text", "text": tok.decode(fake_engine.script)}]
    assert m["stop_reason"] == "end_turn" and m["stop_sequence"] is None
    # the end-of-turn id was sampled too (Anthropic's and vLLM's output count)
    assert m["usage"] == {"input_tokens": len(fake_engine.prompts[0]),
                          "output_tokens": len(fake_engine.script) + 1}
    assert not TOKEN_NATIVE & set(m)


async def test_ids_on_every_block_and_the_versions_on_the_message(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    fake_engine.script = tok.encode(OUTPUT)
    r = await post(client, req("Weather?", tools=[WEATHER], response_format_tokens=True,
                               return_token_ids=True))
    assert r.status_code == 200, r.text
    m = r.json()
    assert [b["type"] for b in m["content"]] == ["text", "tool_use", "tool_use"]
    assert m["content"][0]["text"] == "Checking."
    assert [(b["name"], b["input"]) for b in m["content"][1:]] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    # every sampled id in exactly one block, the calls' syntax with the calls
    assert [t for b in m["content"] for t in b["token_ids"]] == fake_engine.script
    assert m["stop_reason"] == "tool_use"
    assert m["prompt_token_ids"] == fake_engine.prompts[0]
    assert m["tokenizer_version"].startswith("smollm2") or m["tokenizer_version"]
    assert m["token_ids_source"] == "sampled" and m["template_version"]


async def test_a_stream_is_anthropics_events_with_ids_on_every_delta(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    fake_engine.script = tok.encode(OUTPUT)
    whole = (await post(client, req("Weather?", tools=[WEATHER],
                                    response_format_tokens=True))).json()
    evs = events(client, req("Weather?", tools=[WEATHER], response_format_tokens=True))
    out = await evs
    kinds = [e["type"] for e in out]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta",
                                                                    "message_stop"]
    start = out[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["tokenizer_version"] == whole["tokenizer_version"]
    blocks: dict[int, dict[str, Any]] = {}
    for e in out[2:-2]:
        if e["type"] == "content_block_start":
            assert "token_ids" not in e["content_block"]  # the SDK would copy an empty list
            blocks[e["index"]] = {**e["content_block"], "text": "", "json": "", "ids": []}
        elif e["type"] == "content_block_delta":
            b, d = blocks[e["index"]], e["delta"]
            b["ids"] += d["token_ids"]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            else:
                assert d["type"] == "input_json_delta"
                b["json"] += d["partial_json"]
        else:
            assert e["type"] == "content_block_stop" and e["index"] in blocks
    assert sorted(blocks) == list(range(len(whole["content"])))
    for i, b in enumerate(whole["content"]):
        got = blocks[i]
        assert got["type"] == b["type"] and got["ids"] == b["token_ids"]
        if b["type"] == "text":
            assert got["text"] == b["text"]
        else:
            assert json.loads(got["json"]) == b["input"] and got["name"] == b["name"]
    delta = out[-2]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


async def test_stop_reasons(client: httpx.AsyncClient, tok: HFTokenizer,
                            fake_engine: FakeEngine) -> None:
    m = (await post(client, req(max_tokens=3))).json()
    assert m["stop_reason"] == "max_tokens" and m["usage"]["output_tokens"] == 3
    m = (await post(client, req(stop_sequences=["tous"]))).json()
    assert (m["stop_reason"], m["stop_sequence"]) == ("stop_sequence", "tous")
    assert m["content"][0]["text"] == "Bonjour à "


async def test_history_ids_are_spliced_and_blocks_become_chat_messages(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    fake_engine.script = tok.encode(OUTPUT)
    first = req("Weather?", tools=[WEATHER], response_format_tokens=True,
                return_token_ids=True)
    m1 = (await post(client, first)).json()
    p1 = m1["prompt_token_ids"]
    s1 = [t for b in m1["content"] for t in b["token_ids"]]
    results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "sunny"}
               for b in m1["content"] if b["type"] == "tool_use"]
    fake_engine.script = tok.encode("Sunny.")
    second = {**first, "tokenizer_version": m1["tokenizer_version"], "messages": [
        *first["messages"], {"role": "assistant", "content": m1["content"]},
        {"role": "user", "content": [*results, {"type": "text", "text": "Thanks."}]}]}
    m2 = (await post(client, second)).json()
    p2 = m2["prompt_token_ids"]
    assert p2[:len(p1)] == p1 and p2[len(p1):len(p1) + len(s1)] == s1
    # the same conversation as chat renders it: two tool messages, then the user's text
    chat = await client.post("/v1/chat/completions/render", json={
        "model": MODEL, "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": WEATHER["description"],
            "parameters": WEATHER["input_schema"]}}],
        "tokenizer_version": m1["tokenizer_version"], "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "token_ids": s1},
            *[{"role": "tool", "tool_call_id": r["tool_use_id"], "content": "sunny"}
              for r in results],
            {"role": "user", "content": [{"type": "text", "text": "Thanks."}]}]})
    assert chat.status_code == 200, chat.text
    assert chat.json()["token_ids"] == p2


async def test_a_token_ids_block_and_system_blocks(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    version = (await client.get(f"/v1/models/{MODEL}")).json()["tokenizer_version"]
    ids = tok.encode("Hello!")
    by_ids = (await post(client, req([{"type": "token_ids", "token_ids": ids}],
                                     system=[{"type": "text", "text": "Be brief."}],
                                     tokenizer_version=version, return_token_ids=True))).json()
    by_text = (await post(client, req("Hello!", system="Be brief.",
                                      return_token_ids=True))).json()
    assert by_ids["prompt_token_ids"] == by_text["prompt_token_ids"]
    # ids without the version they belong to: refused
    assert error(await post(client, req([{"type": "token_ids", "token_ids": ids}]))) == (
        "invalid_request_error", "tokenizer_version_required", "tokenizer_version")
    # an id the vocabulary lacks, named where the client put it (a tool result's block)
    bad = req([{"type": "tool_result", "tool_use_id": "t", "content": "x"},
               {"type": "tool_result", "tool_use_id": "u", "content": [
                   {"type": "text", "text": "y"},
                   {"type": "token_ids", "token_ids": [5, tok.vocab_size]}]}],
              tokenizer_version=version)
    assert error(await post(client, bad))[1:] == (
        "invalid_token_id", "messages[0].content[1].content[1].token_ids[1]")
    # and in a user message whose tool results went first
    bad = req([{"type": "tool_result", "tool_use_id": "t", "content": "x"},
               {"type": "text", "text": "y"},
               {"type": "token_ids", "token_ids": [tok.vocab_size]}], tokenizer_version=version)
    assert error(await post(client, bad))[1:] == (
        "invalid_token_id", "messages[0].content[2].token_ids[0]")


async def test_a_last_assistant_message_is_continued(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    body = req("Hi", return_token_ids=True)
    body["messages"].append({"role": "assistant", "content": "Bonjour"})
    prompt = (await post(client, body)).json()["prompt_token_ids"]
    chat = await client.post("/v1/chat/completions/render", json={
        "model": MODEL, "messages": body["messages"], "add_generation_prompt": False,
        "continue_final_message": True})
    assert prompt == chat.json()["token_ids"]
    count = await post(client, {"model": MODEL, "messages": body["messages"]},
                       "/v1/messages/count_tokens")
    assert count.json() == {"input_tokens": len(prompt)}


async def test_count_tokens_is_the_prompt_messages_runs(
        client: httpx.AsyncClient, fake_engine: FakeEngine) -> None:
    body = req("What is the weather in Paris?", system="Be brief.", tools=[WEATHER])
    count = await post(client, {k: body[k] for k in ("model", "messages", "system", "tools")},
                       "/v1/messages/count_tokens")
    assert count.status_code == 200, count.text
    m = (await post(client, {**body, "return_token_ids": True})).json()
    assert count.json() == {"input_tokens": len(m["prompt_token_ids"])}


@pytest.mark.parametrize(("patch", "param", "code"), [
    ({"max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences", "invalid_value"),
    ({"temperature": 1.5}, "temperature", "invalid_value"),
    # a budget for a model that does not reason (vLLM's thinking_token_budget, by its name here)
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.budget_tokens",
     "unsupported_parameter"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type", "invalid_value"),
    ({"thinking": {"type": "enabled", "budget_tokens": 8, "display": "x"}}, "thinking.display",
     "unsupported_parameter"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]},
     "tools[0].type", "unsupported_parameter"),
    ({"tools": [{**WEATHER, "defer_loading": True}]}, "tools[0].defer_loading",
     "unsupported_parameter"),
    ({"tool_choice": {"type": "tool"}, "tools": [WEATHER]}, "tool_choice.name",
     "missing_required_parameter"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice", "invalid_value"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content", "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]}],
      "tools": [WEATHER]}, "messages[1].content[0]", "invalid_value"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": "x", "toolset_name": "mcp"}]}]},
     "messages[0].content[0].toolset_name", "unsupported_parameter"),
    ({"output_config": {"effort": "high"}}, "output_config.effort", "unsupported_parameter"),
    ({"tool_choice": {"type": "any"}}, "tool_choice", "invalid_value"),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, "tool_choice.name",
     "invalid_value"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "data": ""}}]}]},
     "messages[0].content[0]", "invalid_value"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "token_ids": [1]}]}]},
     "messages[0].content[0].token_ids", "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "text", "text": "a", "token_ids": [1]},
        {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": "more"}]},
     "messages[1].content[1].token_ids", "invalid_value"),
    ({"unknown_field": 1}, "unknown_field", "unknown_parameter"),
])
async def test_bad_requests_are_anthropic_errors_naming_the_field(
        client: httpx.AsyncClient, patch: dict[str, Any], param: str, code: str | None) -> None:
    body = {**req(), **patch}
    kind, got_code, got_param = error(await post(client, body))
    assert kind == "invalid_request_error"
    assert got_param == param
    if code is not None:
        assert got_code == code


async def test_missing_max_tokens_is_a_400_not_a_422(client: httpx.AsyncClient) -> None:
    body = req()
    del body["max_tokens"]
    assert error(await post(client, body)) == (
        "invalid_request_error", "missing_required_parameter", "max_tokens")


async def test_errors_take_anthropics_shape_only_on_its_paths(
        client: httpx.AsyncClient, fake_engine: FakeEngine) -> None:
    assert error(await post(client, {**req(), "model": "nope"}), 404)[:2] == (
        "not_found_error", "model_not_found")
    assert error(await client.get("/v1/messages"), 405)[0] == "invalid_request_error"
    assert error(await client.post("/v1/messages/nope", json={}), 404)[0] == "not_found_error"
    fake_engine.refuse = RateLimitError("the queue is full")
    assert error(await post(client, req()), 429)[0] == "rate_limit_error"
    fake_engine.refuse = None
    # OpenAI's shape elsewhere
    r = await client.post("/v1/chat/completions", json={"model": "nope", "messages": []})
    assert r.status_code in (400, 404) and set(r.json()) == {"error"}


async def test_keys_in_x_api_key_and_errors_before_the_route(make_app) -> None:  # type: ignore[no-untyped-def]
    app = make_app(api_keys=["k1"], max_body_bytes=4096)
    async with serve_in_process(app) as c:
        assert error(await c.post("/v1/messages", json=req()), 401)[0] == "authentication_error"
        r = await c.post("/v1/messages", json=req(), headers={"x-api-key": "k1"})
        assert r.status_code == 200, r.text
        r = await c.post("/v1/messages", json=req(), headers={"x-api-key": "nope"})
        assert error(r, 401)[0] == "authentication_error"
        r = await c.post("/v1/messages", json=req("x" * 8000), headers={"x-api-key": "k1"})
        assert error(r, 413)[0] == "request_too_large"
        # the OpenAI paths keep their shape
        r = await c.post("/v1/chat/completions", json={})
        assert r.status_code == 401 and set(r.json()) == {"error"}


async def test_an_error_mid_stream_is_an_error_event(
        client: httpx.AsyncClient, fake_engine: FakeEngine) -> None:
    fake_engine.fail_after = 2
    out = await events(client, req())
    assert out[0]["type"] == "message_start"
    assert out[-1]["type"] == "error"
    assert out[-1]["error"]["type"] in ("overloaded_error", "api_error")
    assert "message_stop" not in [e["type"] for e in out]


async def test_is_error_results_are_rendered_and_said_in_a_warning(
        client: httpx.AsyncClient) -> None:
    body = req(response_format_tokens=True)
    body["messages"] = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "X"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "no such city", "is_error": True}]}]
    m = (await post(client, {**body, "tools": [WEATHER]})).json()
    assert [w["code"] for w in m["warnings"]] == ["tool_error_not_rendered"]
    assert m["warnings"][0]["param"] == "messages[2].content[0].is_error"


async def test_fields_the_sdk_may_send_that_change_nothing_are_accepted(
        client: httpx.AsyncClient) -> None:
    body = req(diagnostics={"x": 1}, service_tier="auto", metadata={"user_id": "u1"},
               thinking={"type": "disabled"}, speed="standard", cache_control={
                   "type": "ephemeral"},
               tools=[{**WEATHER, "eager_input_streaming": True, "defer_loading": False,
                       "allowed_callers": ["direct"], "input_examples": [],
                       "cache_control": {"type": "ephemeral"}, "type": "custom",
                       "strict": True}])
    body["messages"] = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?",
                                      "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                                           "name": "get_weather", "input": {"city": "Paris"},
                                           "caller": {"type": "direct"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "Sunny.", "toolset_name": None}]}]
    r = await post(client, body)
    assert r.status_code == 200, r.text
    count = await post(client, {"model": MODEL, "messages": body["messages"],
                                "speed": "standard", "tools": body["tools"]},
                       "/v1/messages/count_tokens")
    assert count.status_code == 200, count.text


async def test_a_stop_sequence_that_cuts_a_call_is_no_tool_use(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    """A client must never be told to run a call half written."""
    fake_engine.script = tok.encode(OUTPUT)
    m = (await post(client, req("Weather?", tools=[WEATHER],
                                stop_sequences=["Paris"]))).json()
    assert (m["stop_reason"], m["stop_sequence"]) == ("stop_sequence", "Paris")
    m = (await post(client, req("Weather?", tools=[WEATHER]))).json()
    assert (m["stop_reason"], m["stop_sequence"]) == ("tool_use", None)


async def test_an_id_error_in_an_assistant_turn_names_its_block(
        client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    version = (await client.get(f"/v1/models/{MODEL}")).json()["tokenizer_version"]
    body = req(tokenizer_version=version, tools=[WEATHER])
    body["messages"] = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking.", "token_ids": tok.encode("Checking.")},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "X"},
             "token_ids": [5, tok.vocab_size]}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "x"}]}]
    assert error(await post(client, body))[1:] == (
        "invalid_token_id", "messages[1].content[1].token_ids[1]")
