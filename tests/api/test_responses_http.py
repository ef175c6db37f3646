"""POST /v1/responses over HTTP, in process, on a scripted engine with the real tokenizer and
template: shapes, events, ids and refusals (the real model and the SDK: tests/e2e)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.test_tools_http import OUTPUT, WEATHER
from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine, other_tokenizer
from tokenwire.errors import RateLimitError
from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.registry import TokenizerRegistry

pytestmark = pytest.mark.anyio

IDS = ["output.token_ids"]
TOOL = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]


def req(input: Any = "Hello!", **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": input, **kw}


async def post(client: httpx.AsyncClient, payload: Any) -> httpx.Response:
    return await client.post("/v1/responses", json=payload)


def typed_events(r: httpx.Response) -> list[dict[str, Any]]:
    """A typed-event stream's events (Responses', Messages'), each checked against its
    `event:` line."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    out = []
    for frame in r.text.strip().split("\n\n"):
        kind, data = frame.split("\n")
        ev = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {ev['type']}"
        out.append(ev)
    return out


async def events(client: httpx.AsyncClient, payload: dict[str, Any]) -> list[dict[str, Any]]:
    out = typed_events(await post(client, {**payload, "stream": True}))
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def error(r: httpx.Response, status: int = 400) -> tuple[str, str | None]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    return err["code"], err["param"]


async def test_plain_request_gets_a_plain_openai_response(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    r = await post(client, req())
    assert r.status_code == 200
    data = r.json()
    assert data["object"] == "response" and data["id"].startswith("resp_")
    assert data["status"] == "completed" and data["incomplete_details"] is None
    for key in ("tokenizer_version", "token_ids_source", "input_token_ids", "warnings"):
        assert key not in data
    [item] = data["output"]
    assert item["id"].startswith("msg_") and "token_ids" not in item
    assert (item["type"], item["role"], item["status"]) == ("message", "assistant", "completed")
    assert item["content"] == [{"type": "output_text", "text": tok.decode(fake_engine.script),
                                "annotations": [], "logprobs": []}]
    prompt = len(fake_engine.prompts[0])
    assert data["usage"] == {
        "input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": len(fake_engine.script) + 1,  # the end-of-turn token counts
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + len(fake_engine.script) + 1}


async def test_the_prompt_is_the_chat_prompt(client: httpx.AsyncClient, tok: HFTokenizer,
                                             fake_engine: FakeEngine) -> None:
    """instructions, items and input_tokens parts render exactly as the chat messages do."""
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                     {"type": "input_tokens", "token_ids": tok.encode("there")}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye?"},
    ]
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": history, "tokenizer_version": tok.family})
    assert r.status_code == 200
    r = await post(client, req(instructions="Be brief.", tokenizer_version=tok.family, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Hi "},
                                     {"type": "input_tokens", "token_ids": tok.encode("there")}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]},
        {"role": "user", "content": "Bye?"}]))
    assert r.status_code == 200, r.text
    assert fake_engine.prompts[1] == fake_engine.prompts[0]
    await post(client, req("Bye?"))
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Bye?"}]})
    assert fake_engine.prompts[2] == fake_engine.prompts[3]


async def test_token_ids_on_request(client: httpx.AsyncClient, tok: HFTokenizer,
                                    fake_engine: FakeEngine) -> None:
    r = await post(client, req(include=[*IDS, "input.token_ids"]))
    data = r.json()
    assert data["tokenizer_version"] == tok.version
    assert data["token_ids_source"] == "sampled"
    assert data["input_token_ids"] == fake_engine.prompts[0]
    assert data["output"][0]["token_ids"] == fake_engine.script


async def test_stream_events_and_ids(client: httpx.AsyncClient, tok: HFTokenizer,
                                     fake_engine: FakeEngine) -> None:
    whole = (await post(client, req(include=IDS, seed=1))).json()
    evs = await events(client, req(include=IDS, seed=1))
    kinds = [e["type"] for e in evs]
    deltas = [e for e in evs if e["type"] == "response.output_text.delta"]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * len(deltas),
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    assert evs[0]["response"]["status"] == "in_progress" and evs[0]["response"]["output"] == []
    # the ids of the deltas make the item's ids, their text its text (no character split)
    assert [i for d in deltas for i in d["token_ids"]] == fake_engine.script
    assert "".join(d["delta"] for d in deltas) == tok.decode(fake_engine.script)
    assert any(d["delta"] == "" for d in deltas)  # ids of a partial character: text follows
    done = evs[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["token_ids"] == fake_engine.script
    assert evs[-2]["item"] == done["output"][0]
    assert evs[-4]["text"] == done["output"][0]["content"][0]["text"]
    # the whole response is the stream's last state
    for key in ("output", "usage", "tokenizer_version"):
        strip = (lambda o: [{**i, "id": None} for i in o]) if key == "output" else (lambda v: v)
        assert strip(done[key]) == strip(whole[key])
    plain = await events(client, req())
    assert all("token_ids" not in e for e in plain if e["type"].endswith(".delta"))
    assert "token_ids" not in plain[-1]["response"]["output"][0]


async def test_function_calls_are_items(client: httpx.AsyncClient, tok: HFTokenizer,
                                        fake_engine: FakeEngine) -> None:
    fake_engine.script = tok.encode(OUTPUT)
    data = (await post(client, req("Weather in Paris and Rome?", tools=[TOOL],
                                   include=IDS))).json()
    msg, paris, rome = data["output"]
    assert msg["content"][0]["text"] == "Checking."
    for call, city in ((paris, "Paris"), (rome, "Rome")):
        assert call["type"] == "function_call" and call["id"].startswith("fc_")
        assert call["call_id"].startswith("call_") and call["name"] == "get_weather"
        assert json.loads(call["arguments"]) == {"city": city}
        assert call["status"] == "completed"
    # every sampled id in exactly one item, in order
    assert msg["token_ids"] + paris["token_ids"] + rome["token_ids"] == fake_engine.script
    assert data["tool_choice"] == "auto" and data["tools"][0]["name"] == "get_weather"
    assert fake_engine.params[-1].grammar is not None  # chat's lazy tool grammar

    evs = await events(client, req("Weather in Paris and Rome?", tools=[TOOL], include=IDS))
    added = [e["item"]["type"] for e in evs if e["type"] == "response.output_item.added"]
    assert added == ["message", "function_call", "function_call"]
    args = [e for e in evs if e["type"] == "response.function_call_arguments.delta"]
    by_item: dict[int, list[int]] = {}
    for e in evs:
        if e["type"].endswith(".delta"):
            by_item.setdefault(e["output_index"], []).extend(e["token_ids"])
    final = evs[-1]["response"]["output"]
    assert [by_item[i] for i in range(3)] == [it["token_ids"] for it in final]
    assert "".join(a["delta"] for a in args if a["output_index"] == 1) == final[1]["arguments"]
    dones = [e for e in evs if e["type"] == "response.function_call_arguments.done"]
    assert [(d["name"], d["arguments"]) for d in dones] == [
        (c["name"], c["arguments"]) for c in final[1:]]


async def test_tool_turn_round_trip_splices_ids(client: httpx.AsyncClient, tok: HFTokenizer,
                                                fake_engine: FakeEngine) -> None:
    fake_engine.script = tok.encode(OUTPUT)
    first = (await post(client, req("Weather?", tools=[TOOL], include=IDS))).json()
    fake_engine.script = tok.encode("Sunny in both.")
    outputs = [{"type": "function_call_output", "call_id": c["call_id"], "output": "sunny"}
               for c in first["output"][1:]]
    r = await post(client, req([{"role": "user", "content": "Weather?"}, *first["output"],
                                *outputs], tools=[TOOL], tokenizer_version=tok.version))
    assert r.status_code == 200, r.text
    prompt = fake_engine.prompts[-1]
    # the first turn's prompt, then its sampled ids verbatim
    n = len(fake_engine.prompts[0])
    assert prompt[:n] == fake_engine.prompts[0]
    assert prompt[n:n + len(OUTPUT_IDS := tok.encode(OUTPUT))] == OUTPUT_IDS
    # the same history as chat messages gives the same prompt
    calls = [{"id": c["call_id"], "type": "function",
              "function": {"name": c["name"], "arguments": c["arguments"]}}
             for c in first["output"][1:]]
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "tools": [WEATHER], "tokenizer_version": tok.version, "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": calls,
             "token_ids": OUTPUT_IDS},
            *[{"role": "tool", "tool_call_id": c["id"], "content": "sunny"} for c in calls]]})
    assert r.status_code == 200, r.text
    assert fake_engine.prompts[-1] == prompt
    # without ids the turn is rendered from its items, which still works
    bare = [{k: v for k, v in item.items() if k != "token_ids"} for item in first["output"]]
    r = await post(client, req([{"role": "user", "content": "Weather?"}, *bare, *outputs],
                               tools=[TOOL]))
    assert r.status_code == 200, r.text
    # ids on some items of the turn only: refused, naming the first without
    r = await post(client, req([{"role": "user", "content": "Weather?"}, first["output"][0],
                                bare[1], bare[2], *outputs], tools=[TOOL],
                               tokenizer_version=tok.version))
    assert error(r) == ("invalid_value", "input[2].token_ids")


async def test_max_output_tokens_is_incomplete(client: httpx.AsyncClient,
                                               fake_engine: FakeEngine) -> None:
    data = (await post(client, req(max_output_tokens=3))).json()
    assert data["status"] == "incomplete"
    assert data["incomplete_details"] == {"reason": "max_output_tokens"}
    assert data["output"][0]["status"] == "incomplete"
    assert data["usage"]["output_tokens"] == 3
    evs = await events(client, req(max_output_tokens=3))
    assert evs[-1]["type"] == "response.incomplete"
    assert evs[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_logprobs_on_request(client: httpx.AsyncClient, fake_engine: FakeEngine) -> None:
    data = (await post(client, req(include=["message.output_text.logprobs"],
                                   top_logprobs=2))).json()
    lps = data["output"][0]["content"][0]["logprobs"]
    assert [e["id"] for e in lps] == fake_engine.script
    assert all(len(e["top_logprobs"]) == 2 and "bytes" in e for e in lps)
    assert fake_engine.params[-1].logprobs == 2
    evs = await events(client, req(include=["message.output_text.logprobs"], top_logprobs=1))
    got = [e["id"] for d in evs if d["type"] == "response.output_text.delta"
           for e in d["logprobs"]]
    assert got == fake_engine.script


async def test_structured_output(client: httpx.AsyncClient, fake_engine: FakeEngine) -> None:
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}}
    r = await post(client, req(text={"format": {"type": "json_schema", "name": "person",
                                                 "schema": schema}}))
    assert r.status_code == 200
    assert fake_engine.params[-1].grammar is not None
    assert r.json()["text"]["format"]["schema"] == schema
    bad = {"type": "object", "description": "x" * 300_000}  # past what compiles at admission
    r = await post(client, req(text={"format": {"type": "json_schema", "name": "p",
                                                 "schema": bad}}))
    assert error(r) == ("unsupported_parameter", "text.format.schema")


@pytest.fixture
def second_version(registry: TokenizerRegistry) -> str:
    return registry.register(other_tokenizer(), aliases=["tiny"]).version


@pytest.mark.parametrize(("payload", "expected"), [
    (req(frobnicate=1), ("unknown_parameter", "frobnicate")),
    (req(background=True), ("unsupported_parameter", "background")),
    (req(reasoning={"effort": "high"}), ("unsupported_parameter", "reasoning.effort")),
    (req(reasoning={"summary": "auto"}), ("unsupported_parameter", "reasoning.summary")),
    (req(reasoning={"effort": "extreme"}), ("invalid_value", "reasoning.effort")),
    (req(truncation="auto"), ("unsupported_parameter", "truncation")),
    (req(tools=[{"type": "web_search"}]), ("unsupported_parameter", "tools[0].type")),
    (req(tool_choice={"type": "allowed_tools", "mode": "auto", "tools": []}),
     ("unsupported_parameter", "tool_choice.type")),
    (req(include=["file_search_call.results"]), ("unsupported_parameter", "include[0]")),
    (req(text={"verbosity": "low"}), ("unsupported_parameter", "text.verbosity")),
    (req(42), ("invalid_type", "input")),
    (req([]), ("invalid_value", "input")),
    (req([{"type": "reasoning", "summary": []}]), ("invalid_value", "input[0]")),
    (req([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
     ("invalid_value", "input[0].content[0]")),
    (req([{"role": "user", "content": []}]), ("invalid_value", "input[0].content")),
    (req([{"role": "user", "content": "hi", "token_ids": [1]}], tokenizer_version="smollm2-49k"),
     ("invalid_value", "input[0].token_ids")),
    (req([{"role": "user", "content": [{"type": "input_tokens", "token_ids": [1, -2]}]}]),
     ("invalid_token_id", "input[0].content[0].token_ids[1]")),
    (req([{"role": "user", "content": [{"type": "input_tokens", "token_ids": [1]}]}]),
     ("tokenizer_version_required", "tokenizer_version")),
    (req([{"role": "user", "content": "hi"},
          {"type": "input_text", "text": "x"}]), ("invalid_value", "input[1]")),
    (req(max_output_tokens=0), ("invalid_value", "max_output_tokens")),
    (req(max_output_tokens=10**6), ("context_length_exceeded", "max_output_tokens")),
    (req(tools=[{**TOOL, "name": "bad name"}]), ("invalid_value", "tools[0].name")),
    (req([{"role": "user", "content": "a", "id": "msg_1"},
          {"role": "user", "content": "b", "id": "msg_1"}]), ("invalid_value", "input[1].id")),
    # an assistant turn's ids are its items' ids one after another: an error names the item
    (req([{"role": "user", "content": "hi"},
          {"type": "message", "role": "assistant", "content": "a", "token_ids": [5]},
          {"type": "function_call", "call_id": "c1", "name": "get_weather",
           "arguments": "{}", "token_ids": [1, 10**6]},
          {"type": "function_call_output", "call_id": "c1", "output": "x"}],
         tokenizer_version="smollm2-49k"), ("invalid_token_id", "input[2].token_ids[1]")),
])
async def test_bad_requests_name_the_field(client: httpx.AsyncClient, fake_engine: FakeEngine,
                                           payload: dict[str, Any],
                                           expected: tuple[str, str]) -> None:
    r = await post(client, payload)
    assert error(r) == expected
    assert fake_engine.prompts == []  # never reached the engine
    assert (await post(client, req())).status_code == 200


async def test_version_is_pinned_and_checked(client: httpx.AsyncClient, tok: HFTokenizer,
                                             second_version: str) -> None:
    ids = [{"role": "user", "content": [{"type": "input_tokens",
                                         "token_ids": tok.encode("Hi")}]}]
    r = await post(client, req(ids, tokenizer_version=second_version))
    assert error(r) == ("tokenizer_version_mismatch", "tokenizer_version")
    assert tok.version in r.json()["error"]["message"]
    r = await post(client, req(ids, tokenizer_version="nope@sha256:0000000000000000"))
    assert error(r) == ("unknown_tokenizer_version", "tokenizer_version")
    r = await post(client, req(ids, tokenizer_version=tok.version, include=IDS))
    assert r.status_code == 200 and r.json()["tokenizer_version"] == tok.version


async def test_errors_before_and_after_the_first_byte(client: httpx.AsyncClient,
                                                      fake_engine: FakeEngine) -> None:
    fake_engine.refuse = RateLimitError("too many requests are waiting")
    r = await post(client, req(stream=True))
    assert error(r, 429) == ("queue_full", None)  # before the stream starts: plain HTTP
    fake_engine.refuse = None
    fake_engine.fail_after = 3
    r = await post(client, req())
    assert error(r, 503) == ("engine_error", None)
    evs = await events(client, req())
    assert evs[-1]["type"] == "response.failed"
    failed = evs[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "engine_error"
    assert failed["output"][0]["status"] == "incomplete"
    fake_engine.fail_after = None
    assert (await post(client, req())).status_code == 200


async def test_output_policy_is_content_filter(make_app, tmp_path: Path, tok: HFTokenizer,  # type: ignore[no-untyped-def]
                                               fake_engine: FakeEngine) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"blocked_phrases": ["forbidden recipe"],
                                  "check_output": True}))
    fake_engine.script = tok.encode("Sure: the forbidden recipe is flour.")
    async with serve_in_process(make_app(content_policy=policy)) as c:
        data = (await post(c, req())).json()
        assert data["status"] == "incomplete"
        assert data["incomplete_details"] == {"reason": "content_filter"}
        assert "forbidden recipe" not in data["output"][0]["content"][0]["text"]
        evs = await events(c, req())
        assert evs[-1]["type"] == "response.incomplete"
        assert "forbidden recipe" not in "".join(e.get("delta", "") for e in evs)
        r = await post(c, req("the forbidden recipe?"))
        assert error(r) == ("content_policy_violation", "input")
