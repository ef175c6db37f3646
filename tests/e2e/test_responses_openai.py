"""The Responses API end to end: a real uvicorn server, the real engine and model, the official
`openai` client's `responses.create` and `responses.stream`."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"
IDS: Any = ["output.token_ids", "input.token_ids"]
WEATHER: Any = {"type": "function", "name": "get_weather", "description": "The weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}, "strict": True}


def extra(obj: Any, key: str) -> Any:
    return (obj.model_extra or {}).get(key)


def test_plain_create(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="Say only yes.", temperature=0,
                                max_output_tokens=20)
    assert r.object == "response" and r.status == "completed"
    assert r.output_text and r.output[0].type == "message"
    for key in ("tokenizer_version", "token_ids_source", "input_token_ids"):
        assert extra(r, key) is None
    assert r.usage is not None and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_instructions_and_items_are_the_chat_prompt(client: openai.OpenAI, tok: HFTokenizer,
                                                    ) -> None:
    question = "What is the capital of France? Answer in one word."
    chat = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=20, messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": question}],
        extra_body={"return_token_ids": True})
    as_text = client.responses.create(model=MODEL, instructions="You are terse.",
                                      input=question, temperature=0, max_output_tokens=20,
                                      include=IDS)
    version = extra(as_text, "tokenizer_version")
    assert version == tok.version
    as_ids = client.responses.create(
        model=MODEL, instructions="You are terse.", temperature=0, max_output_tokens=20,
        include=IDS, input=[{"role": "user", "content": [
            {"type": "input_tokens", "token_ids": tok.encode(question)}]}],  # type: ignore[list-item]
        extra_body={"tokenizer_version": version})
    prompt = chat.prompt_token_ids  # type: ignore[attr-defined]
    assert extra(as_text, "input_token_ids") == prompt == extra(as_ids, "input_token_ids")
    sampled = chat.choices[0].token_ids  # type: ignore[attr-defined]
    assert extra(as_text.output[0], "token_ids") == sampled == extra(as_ids.output[0], "token_ids")
    assert as_text.output_text == as_ids.output_text == chat.choices[0].message.content


def test_function_call_round_trip(client: openai.OpenAI, tok: HFTokenizer) -> None:
    history: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(model=MODEL, input=history, tools=[WEATHER],
                                tool_choice="required", parallel_tool_calls=False,
                                temperature=0, include=IDS)
    [call] = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments), dict)
    first_prompt = extra(r, "input_token_ids")
    sampled = [i for o in r.output for i in extra(o, "token_ids")]
    # the SDK's output items go back as they are, their token_ids with them
    history += [*r.output, {"type": "function_call_output", "call_id": call.call_id,
                            "output": "Sunny, 22 C"}]
    r2 = client.responses.create(model=MODEL, input=history, tools=[WEATHER], temperature=0,
                                 max_output_tokens=30, include=IDS,
                                 extra_body={"tokenizer_version": tok.version})
    assert r2.status in ("completed", "incomplete")
    prompt = extra(r2, "input_token_ids")
    assert prompt[:len(first_prompt)] == first_prompt
    assert prompt[len(first_prompt):len(first_prompt) + len(sampled)] == sampled


def test_stream_events_and_final_response(client: openai.OpenAI) -> None:
    args: Any = {"model": MODEL, "input": "Say only yes.", "temperature": 0,
                 "max_output_tokens": 40, "include": IDS}
    whole = client.responses.create(**args)
    # the raw events: each delta carries the ids of its text
    delta_ids: list[int] = []
    text = ""
    for ev in client.responses.create(**args, stream=True):
        if ev.type == "response.output_text.delta":
            delta_ids += extra(ev, "token_ids")
            text += ev.delta
    assert text == whole.output_text
    assert delta_ids == extra(whole.output[0], "token_ids")
    # the SDK's stream helper (it rebuilds delta events, dropping fields it does not know;
    # items and the final response keep theirs)
    kinds: list[str] = []
    done_ids = None
    with client.responses.stream(**args) as stream:
        for e in stream:
            kinds.append(e.type)
            if e.type == "response.output_item.done":
                done_ids = extra(e.item, "token_ids")
        final = stream.get_final_response()
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert whole.status == "completed" and kinds[-1] == "response.completed"
    assert done_ids == delta_ids
    assert final.output_text == text
    assert extra(final.output[0], "token_ids") == delta_ids


def test_incomplete_and_refusals(client: openai.OpenAI, tok: HFTokenizer) -> None:
    r = client.responses.create(model=MODEL, input="Tell me a long story.", temperature=0,
                                max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens == 5
    ids: Any = [{"role": "user", "content": [{"type": "input_tokens",
                                              "token_ids": tok.encode("Hi")}]}]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input=ids, extra_body={
            "tokenizer_version": "smollm2-49k@sha256:0000000000000000"})
    assert err.value.code == "unknown_tokenizer_version"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input=ids)
    assert err.value.code == "tokenizer_version_required"
