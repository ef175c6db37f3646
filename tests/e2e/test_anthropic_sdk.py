"""Anthropic's Messages API end to end: a real uvicorn server, the real engine and model (or a
gateway over a real upstream), the official `anthropic` SDK's `messages.create`,
`messages.stream` and `messages.count_tokens`.

The SDK has no `temperature`/`top_k` arguments in 2.17 for this path's tests to pass as such:
they and the token-native fields go in `extra_body`, which it sends as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.conftest import LiveServer
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"
WEATHER: Any = {"name": "get_weather", "description": "The weather of a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"], "additionalProperties": False}}
IDS: Any = {"temperature": 0, "response_format_tokens": True, "return_token_ids": True}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[anthropic.Anthropic]:
    """The official client on the live server (it posts to `/v1/messages` itself)."""
    with anthropic.Anthropic(base_url=live_server.url, api_key="unused", max_retries=0) as c:
        yield c


def extra(obj: Any, key: str) -> Any:
    return (obj.model_extra or {}).get(key)


def sampled(content: list[Any]) -> list[int]:
    return [t for b in content for t in extra(b, "token_ids")]


def results(content: list[Any]) -> list[Any]:
    return [{"type": "tool_result", "tool_use_id": b.id, "content": "Sunny, 21 C."}
            for b in content if b.type == "tool_use"]


def test_a_two_turn_tool_conversation_fed_back_by_ids(client: anthropic.Anthropic,
                                                      tok: HFTokenizer) -> None:
    r1 = client.messages.create(model=MODEL, max_tokens=64, messages=ASK, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                extra_body=IDS)
    assert r1.stop_reason == "tool_use"
    call = r1.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather"
    assert isinstance(call.input, dict) and isinstance(call.input["city"], str)
    assert all(extra(b, "token_ids") for b in r1.content)
    version = extra(r1, "tokenizer_version")
    assert version == tok.version
    p1, s1 = extra(r1, "prompt_token_ids"), sampled(r1.content)
    assert r1.usage.output_tokens == len(s1) + 1  # and the end of turn
    assert r1.usage.input_tokens + (r1.usage.cache_read_input_tokens or 0) == len(p1)
    # turn 2: the response as the SDK hands it back (its blocks keep their ids)
    messages: Any = [*ASK, r1.to_param(), {"role": "user", "content": results(r1.content)}]
    r2 = client.messages.create(model=MODEL, max_tokens=32, messages=messages, tools=[WEATHER],
                                extra_body={**IDS, "tokenizer_version": version})
    p2 = extra(r2, "prompt_token_ids")
    assert p2[:len(p1)] == p1 and p2[len(p1):len(p1) + len(s1)] == s1
    assert r2.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert client.messages.count_tokens(
        model=MODEL, messages=messages, tools=[WEATHER],
        extra_body={"tokenizer_version": version}).input_tokens == len(p2)


def test_the_same_conversation_streamed(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(model=MODEL, max_tokens=64, messages=ASK, tools=[WEATHER],
                                   tool_choice={"type": "tool", "name": "get_weather"},
                                   extra_body=IDS)
    stream = client.messages.create(model=MODEL, max_tokens=64, messages=ASK, tools=[WEATHER],
                                    tool_choice={"type": "tool", "name": "get_weather"},
                                    extra_body=IDS, stream=True)
    kinds: list[str] = []
    blocks: dict[int, dict[str, Any]] = {}
    start: Any = None
    for ev in stream:
        kinds.append(ev.type)
        if ev.type == "message_start":
            start = ev.message
        elif ev.type == "content_block_start":
            assert extra(ev.content_block, "token_ids") is None
            blocks[ev.index] = {"block": ev.content_block, "text": "", "json": "", "ids": []}
        elif ev.type == "content_block_delta":
            b = blocks[ev.index]
            b["ids"] += extra(ev.delta, "token_ids")
            if ev.delta.type == "text_delta":
                b["text"] += ev.delta.text
            else:
                b["json"] += ev.delta.partial_json
        elif ev.type == "message_delta":
            assert ev.delta.stop_reason == whole.stop_reason == "tool_use"
            assert ev.usage.output_tokens == whole.usage.output_tokens
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert extra(start, "prompt_token_ids") == extra(whole, "prompt_token_ids")
    assert [b["ids"] for _, b in sorted(blocks.items())] == [
        extra(b, "token_ids") for b in whole.content]
    # turn 2 from the events: the blocks rebuilt with their ids
    rebuilt: Any = []
    for _, b in sorted(blocks.items()):
        if b["block"].type == "text":
            rebuilt.append({"type": "text", "text": b["text"], "token_ids": b["ids"]})
        else:
            rebuilt.append({"type": "tool_use", "id": b["block"].id, "name": b["block"].name,
                            "input": json.loads(b["json"]),
                            "token_ids": b["ids"]})
    assert [r["input"] for r in rebuilt if r["type"] == "tool_use"] == [
        b.input for b in whole.content if b.type == "tool_use"]
    version = extra(whole, "tokenizer_version")
    messages: Any = [*ASK, {"role": "assistant", "content": rebuilt},
                     {"role": "user", "content": results(whole.content)}]
    p1, s1 = extra(whole, "prompt_token_ids"), sampled(whole.content)
    with client.messages.stream(model=MODEL, max_tokens=24, messages=messages, tools=[WEATHER],
                                extra_body={**IDS, "tokenizer_version": version}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    p2 = extra(final, "prompt_token_ids")
    assert p2[:len(p1)] == p1 and p2[len(p1):len(p1) + len(s1)] == s1
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert text == "".join(b.text for b in final.content if b.type == "text")
    assert final.usage.output_tokens > 0


def test_a_plain_request_and_the_helper_round_trip_by_text(client: anthropic.Anthropic) -> None:
    r = client.messages.create(model=MODEL, max_tokens=16, system="You are terse.",
                               messages=[{"role": "user", "content": "Say hello."}],
                               extra_body={"temperature": 0})
    assert r.type == "message" and r.role == "assistant" and r.content[0].type == "text"
    assert r.content[0].text and r.stop_reason in ("end_turn", "max_tokens")
    for key in ("token_ids", "tokenizer_version", "prompt_token_ids"):
        assert extra(r, key) is None and extra(r.content[0], key) is None
    # fed back without ids: rendered from its text, as any Anthropic client does it
    again = client.messages.create(
        model=MODEL, max_tokens=8, system="You are terse.", extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Say hello."}, r.to_param(),
                  {"role": "user", "content": "Again."}])
    assert again.content[0].type == "text"


def test_errors_are_the_sdks_classes(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="nope", max_tokens=8, messages=ASK)
    assert nf.value.type == "not_found_error" and nf.value.error_code == "model_not_found"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "token_ids", "token_ids": [1, 2]}]}],  # type: ignore[list-item, misc]
            extra_body={"tokenizer_version": "smollm2-49k@sha256:" + "0" * 64})
    assert bad.value.type == "invalid_request_error"
    assert bad.value.error_code in ("unknown_tokenizer_version", "tokenizer_version_mismatch")
    with pytest.raises(anthropic.BadRequestError) as unsupported:
        client.messages.create(model=MODEL, max_tokens=8, messages=ASK,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert unsupported.value.error_code == "unsupported_parameter"
