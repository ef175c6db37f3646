"""A model that really reasons, served by `tokenwire serve --model smollm2-think`: SmolLM2 with
`<think>` and `</think>` added as tokens of their own and Qwen3's real chat template, fine-tuned at
set-up on reasoning and tool-call traces (scripts/make-thinking-model.py). Greedy, so each turn
thinks, calls and answers the same way every run; everything below is checked on ids the model
sampled, through the official `openai` and `anthropic` clients.

The contract: the reasoning, marker, content and call ids partition the sampled ids; a stream
joins to the whole answer; the next turn's prompt begins with the last prompt and every id the
model sampled (reasoning included) unless the client asks to drop the reasoning."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.upstreams import Upstream, free_port, llama_server, vllm_server

pytestmark = pytest.mark.slow

WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULT = '{"city": "Paris", "temperature_c": 18, "sky": "sunny"}'
IDS: Any = {"response_format_tokens": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def think_model() -> Path:
    path = Path(os.environ.get("TOKENWIRE_THINK_MODEL", "/nonexistent"))
    if not path.is_file():
        if os.environ.get("TOKENWIRE_TEST_REQUIRE_MODELS"):
            pytest.fail(f"{path}: the thinking model is missing (make think-model)")
        pytest.skip("TOKENWIRE_THINK_MODEL names no GGUF (make think-model makes it)")
    return path


@pytest.fixture(scope="module", params=["embedded", "gateway-llama-server", "gateway-vllm"])
def server(request: pytest.FixtureRequest, think_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """`tokenwire serve --model smollm2-think`, or a gateway in front of llama.cpp's own server
    on the same GGUF, or in front of real vLLM on the same model as a Hugging Face directory
    (made from the GGUF: `make test`'s TOKENWIRE_THINK_HF): the gateway asks for ids and
    splits them itself (docs/api.md)."""
    tmp = tmp_path_factory.mktemp("think")
    store = {"TOKENWIRE_TOKENIZER_STORE": str(tmp / "store")}
    behind = None
    if request.param == "embedded":
        args = ["--model", "smollm2-think", "--n-parallel", "2"]
        env = {**store, "TOKENWIRE_THINK_MODEL": str(think_model)}
    elif request.param == "gateway-llama-server":
        behind = llama_server(tmp, slots=2, ctx_per_slot=4096, model=think_model)
        args = ["--engine", "llama-server", "--upstream", behind.url,
                "--tokenizer", str(think_model)]
        env = store
    else:
        hf = Path(os.environ.get("TOKENWIRE_THINK_HF", "/nonexistent"))
        if not (hf / "config.json").is_file():
            if os.environ.get("TOKENWIRE_TEST_REQUIRE_MODELS"):
                pytest.fail(f"{hf}: the thinking model's Hugging Face directory is missing "
                            "(make test makes it)")
            pytest.skip("TOKENWIRE_THINK_HF names no Hugging Face directory (make test)")
        behind = vllm_server(tmp, model=hf, name="smollm2-think", max_model_len=4096)
        args = ["--engine", "vllm", "--upstream", behind.url, "--tokenizer", str(think_model)]
        env = store
    port = free_port()
    up = Upstream("tokenwire-think", [sys.executable, "-m", "tokenwire", "serve", *args,
                                      "--port", str(port)], port, tmp / "serve.log",
                  env=env).start()
    yield up
    up.stop()
    if behind is not None:
        behind.stop()


@pytest.fixture(scope="module")
def client(server: Upstream) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    (m,) = client.models.list().data
    return m.id


def extra(obj: Any) -> dict[str, Any]:
    return obj.model_extra or {}


def chat(client: openai.OpenAI, model: str, messages: list[Any], **kw: Any) -> Any:
    kw.setdefault("max_tokens", 120)
    return client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER], temperature=0,
        extra_body={**IDS, **kw.pop("extra_body", {})}, **kw)


def contains(ids: list[int], run: list[int]) -> bool:
    return any(ids[i:i + len(run)] == run for i in range(len(ids) - len(run) + 1))


@pytest.fixture(scope="module")
def turn1(client: openai.OpenAI, model: str) -> Any:
    return chat(client, model, ASK)


def test_first_turn_thinks_then_calls_the_tool(turn1: Any, server: Upstream) -> None:
    choice = turn1.choices[0]
    msg = choice.message
    reasoning = extra(msg)["reasoning"]
    assert "Paris" in reasoning and "get_weather" in reasoning  # it really thought about it
    assert choice.finish_reason == "tool_calls"
    (call,) = msg.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather", {"city": "Paris"})
    ids, thought = extra(msg)["token_ids"], extra(msg)["reasoning_token_ids"]
    # markers are the model's own ids (user-defined tokens, as Qwen3's): `<think>` first,
    # `</think>` right after the reasoning's run
    tok = httpx.post(f"{server.url}/v1/tokenize", json={
        "model": turn1.model, "prompt": "<think></think>", "add_special_tokens": False}).json()
    start, end = tok["tokens"]
    assert ids[0] == start and contains(ids, [*thought, end])
    assert turn1.usage.completion_tokens_details.reasoning_tokens == len(thought)
    # the partition: reasoning, markers, then content and the call's ids, in order
    detok = httpx.post(f"{server.url}/v1/detokenize", json={
        "model": turn1.model, "tokens": thought,
        "tokenizer_version": extra(turn1)["tokenizer_version"]}).json()["prompt"]
    assert detok == reasoning


def test_the_stream_joins_to_the_whole_answer(client: openai.OpenAI, model: str,
                                              turn1: Any) -> None:
    stream = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=120,
        stream=True, extra_body=IDS)
    reasoning, ids, args = "", [], ""
    for chunk in stream:
        for c in chunk.choices:
            d = extra(c.delta)
            reasoning += d.get("reasoning") or ""
            ids += d.get("token_ids") or []
            for t in c.delta.tool_calls or []:
                args += t.function.arguments or ""
            assert "<think>" not in (c.delta.content or "") + (d.get("reasoning") or "")
    whole = turn1.choices[0].message
    assert reasoning == extra(whole)["reasoning"]
    assert ids == extra(whole)["token_ids"]
    assert json.loads(args) == {"city": "Paris"}


def test_second_turn_feeds_every_sampled_id_back(client: openai.OpenAI, model: str,
                                                  turn1: Any, server: Upstream) -> None:
    c1 = turn1.choices[0]
    sampled = extra(c1)["token_ids"] + [extra(c1)["stop_reason"]]  # the end of turn too
    history = [*ASK, {"role": "assistant", "token_ids": sampled,
                      "tool_calls": [t.model_dump() for t in c1.message.tool_calls]},
               {"role": "tool", "tool_call_id": c1.message.tool_calls[0].id,
                "content": RESULT}]
    turn2 = chat(client, model, history,
                 extra_body={"tokenizer_version": extra(turn1)["tokenizer_version"]})
    prompt = extra(turn2)["prompt_token_ids"]
    assert prompt[:len(extra(turn1)["prompt_token_ids"]) + len(sampled)] == \
        extra(turn1)["prompt_token_ids"] + sampled  # an extension: reasoning kept as sampled
    msg = turn2.choices[0].message
    assert "18" in extra(msg)["reasoning"]
    assert "18" in msg.content and "sunny" in msg.content
    assert turn2.choices[0].finish_reason == "stop"
    # the render mask: the first turn's reasoning, call and stop id are sampled, the rest not
    render = httpx.post(f"{server.url}/v1/chat/completions/render", json={
        "model": model, "messages": history, "tools": [WEATHER],
        "tokenizer_version": extra(turn1)["tokenizer_version"]}).json()
    assert render["token_ids"] == prompt
    assert [t for t, m in zip(render["token_ids"], render["sampled_mask"], strict=True)
            if m] == sampled
    # asked to drop it, the reasoning's ids go, the call's stay
    dropped = httpx.post(f"{server.url}/v1/chat/completions/render", json={
        "model": model, "messages": history, "tools": [WEATHER], "keep_reasoning": False,
        "tokenizer_version": extra(turn1)["tokenizer_version"]}).json()
    thought = extra(c1.message)["reasoning_token_ids"]
    assert not contains(dropped["token_ids"], thought)
    kept = [t for t, m in zip(dropped["token_ids"], dropped["sampled_mask"], strict=True) if m]
    assert sampled[-len(kept):] == kept and len(kept) < len(sampled) - len(thought)


def test_a_length_cut_inside_the_reasoning(client: openai.OpenAI, model: str) -> None:
    r = chat(client, model, ASK, max_tokens=6)
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.content and not choice.message.tool_calls
    ids = extra(choice.message)["token_ids"]
    assert len(ids) == 6 and extra(choice.message)["reasoning_token_ids"] == ids[1:]


def test_thinking_switched_off_by_the_template(client: openai.OpenAI, model: str) -> None:
    """`reasoning_effort: "none"` is Qwen3's `enable_thinking: false`: the template writes an
    empty reasoning block into the prompt itself."""
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 12 + 7?"}],
        temperature=0, max_tokens=30, reasoning_effort="none",  # type: ignore[arg-type]
        extra_body={"return_token_ids": True})
    on = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 12 + 7?"}],
        temperature=0, max_tokens=30, extra_body={"return_token_ids": True})
    off_prompt, on_prompt = extra(r)["prompt_token_ids"], extra(on)["prompt_token_ids"]
    assert off_prompt[:len(on_prompt)] == on_prompt and len(off_prompt) > len(on_prompt)
    with pytest.raises(openai.BadRequestError) as both:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "What is 12 + 7?"}],
            max_tokens=5, reasoning_effort="none",  # type: ignore[arg-type]
            extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert both.value.body["param"] == "reasoning_effort"  # type: ignore[index]


def test_responses_api_reasoning_item_then_call(client: openai.OpenAI, model: str) -> None:
    tool = {"type": "function", "name": "get_weather",
            "parameters": WEATHER["function"]["parameters"]}
    r = client.responses.create(
        model=model, input=ASK[0]["content"], tools=[tool],  # type: ignore[list-item]
        temperature=0, max_output_tokens=120, include=["output.token_ids"])  # type: ignore[list-item]
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "function_call"]
    thought, call = r.output
    assert "Paris" in thought.content[0].text  # type: ignore[union-attr, index]
    assert json.loads(call.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens > 0
    # continued by id: Qwen3's template renders a last assistant turn with an empty reasoning
    # block and the same turn followed by a tool result without one; the continuation is the
    # previous prompt, every id it sampled (the reasoning too) and the turn's closing
    r2 = client.responses.create(
        model=model, previous_response_id=r.id, temperature=0, max_output_tokens=120,
        input=[{"type": "function_call_output", "call_id": call.call_id,  # type: ignore[union-attr]
                "output": RESULT}], include=["output.token_ids"])  # type: ignore[list-item]
    text = "".join(c.text for item in r2.output if item.type == "message"
                   for c in item.content)  # type: ignore[union-attr]
    assert "18" in text and "sunny" in text  # it read the result
    with httpx.Client(base_url=str(client.base_url), timeout=30) as h:
        first = h.get(f"responses/{r.id}", params={"include[]": "input.token_ids"}).json()
        second = h.get(f"responses/{r2.id}", params={"include[]": "input.token_ids"}).json()
    sampled = [i for item in first["output"] for i in item["token_ids"]]
    prompt = first["input_token_ids"]
    assert second["input_token_ids"][:len(prompt) + len(sampled)] == prompt + sampled


def test_messages_api_thinking_block_then_tool_use(server: Upstream, model: str) -> None:
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as c:
        m = c.messages.create(
            model=model, max_tokens=120, messages=[{"role": "user", "content": ASK[0]["content"]}],
            tools=[{"name": "get_weather", "description": "Get the current weather in a city.",
                    "input_schema": WEATHER["function"]["parameters"]}],
            extra_body={"temperature": 0, "response_format_tokens": True})
        assert [b.type for b in m.content] == ["thinking", "tool_use"]
        thinking, use = m.content
        assert "Paris" in thinking.thinking and thinking.signature  # type: ignore[union-attr]
        assert use.input == {"city": "Paris"}  # type: ignore[union-attr]
        assert m.stop_reason == "tool_use"
        with c.messages.stream(
                model=model, max_tokens=120,
                messages=[{"role": "user", "content": ASK[0]["content"]}],
                tools=[{"name": "get_weather", "description": "Get the current weather in a city.",
                        "input_schema": WEATHER["function"]["parameters"]}],
                extra_body={"temperature": 0}) as s:
            final = s.get_final_message()
        assert final.content[0].thinking == thinking.thinking  # type: ignore[union-attr]


def test_a_required_call_and_a_schema_hold_after_the_reasoning(
        client: openai.OpenAI, model: str, server: Upstream) -> None:
    """tool_choice "required" and a JSON schema constrain the answer, not the thought: on the
    embedded engine the grammar holds from `</think>` on (as vLLM's does from its reasoning
    parser's end), so the model thinks first; an upstream's grammar holds from the first token
    (the thought is then empty)."""
    embedded = "--upstream" not in server.cmd
    forced = chat(client, model, ASK, tool_choice="required")
    choice = forced.choices[0]
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and "Paris" in call.function.arguments
    thought = extra(choice.message).get("reasoning")
    if embedded:
        assert thought and "get_weather" in thought  # it thought, then called
        assert contains(extra(choice.message)["token_ids"],
                        extra(choice.message)["reasoning_token_ids"])
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"], "additionalProperties": False}
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 12+7?"}], temperature=0,
        max_tokens=120, response_format={"type": "json_schema", "json_schema": {
            "name": "sum", "schema": schema}}, extra_body=IDS)
    msg = out.choices[0].message
    if embedded:
        assert isinstance(json.loads(msg.content or "")["answer"], int)  # the schema held
        assert extra(msg).get("reasoning")  # after a thought the schema did not touch
    else:  # from the first token: no thought (vLLM's grammar then lets this model pad the
        # object with whitespace up to max_tokens; llama.cpp's closes it)
        assert (msg.content or "").startswith("{") and not extra(msg).get("reasoning")


def test_a_thinking_budget_cuts_the_thought_and_the_model_answers(
        client: openai.OpenAI, model: str, server: Upstream) -> None:
    """vLLM's `thinking_token_budget` (and Anthropic's `budget_tokens`, which vLLM maps to it):
    after that many tokens of reasoning `</think>` is forced and the model goes on to its
    answer. The embedded engine bounds it; an engine that cannot refuses it by name."""
    if "--upstream" in server.cmd:
        with pytest.raises(openai.BadRequestError) as exc:
            chat(client, model, ASK, extra_body={"thinking_token_budget": 4})
        assert exc.value.body["param"] == "thinking_token_budget"  # type: ignore[index]
        return
    free = chat(client, model, ASK)
    assert free.usage.completion_tokens_details.reasoning_tokens > 4
    cut = chat(client, model, ASK, extra_body={"thinking_token_budget": 4})
    msg = cut.choices[0].message
    assert cut.usage.completion_tokens_details.reasoning_tokens == 4
    assert len(extra(msg)["reasoning_token_ids"]) == 4
    thought = extra(free.choices[0].message)["reasoning_token_ids"]
    assert extra(msg)["reasoning_token_ids"] == thought[:4]  # greedy: the same start, cut
    assert msg.content or msg.tool_calls  # and then it answered
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as c:
        m = c.messages.create(
            model=model, max_tokens=120, messages=[{"role": "user", "content": ASK[0]["content"]}],
            thinking={"type": "enabled", "budget_tokens": 4},
            extra_body={"temperature": 0, "response_format_tokens": True})
        assert m.content[0].type == "thinking"
        assert len(m.content[0].token_ids) <= 6  # type: ignore[union-attr]  # 4 and the markers
        with pytest.raises(anthropic.BadRequestError) as bad:
            c.messages.create(model=model, max_tokens=20, messages=[{"role": "user",
                                                                    "content": "Hi"}],
                              thinking={"type": "enabled", "budget_tokens": -1})
        assert bad.value.body["error"]["details"]["param"] == "thinking.budget_tokens"  # type: ignore[index]
