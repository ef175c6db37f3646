"""End to end: a real uvicorn server, the real engine and model, the official `openai` client."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import TEST_UPSTREAM, LiveServer
from tests.upstreams import VLLM_BLOCK
from tokenwire.engines.base import Engine
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def version(client: openai.OpenAI) -> str:
    [model] = client.models.list().data
    return str(model.tokenizer_version)  # type: ignore[attr-defined]


def chat(client: openai.OpenAI, messages: list[Any], **extra: Any) -> Any:
    params = {k: extra.pop(k) for k in ("max_tokens", "temperature", "seed", "n", "stop",
                                        "logprobs", "top_logprobs") if k in extra}
    return client.chat.completions.create(model=MODEL, messages=messages, extra_body=extra,
                                          **{"max_tokens": 40, "temperature": 0, **params})


def test_models_list(client: openai.OpenAI, tok: HFTokenizer) -> None:
    [model] = client.models.list().data
    assert model.id == MODEL
    assert model.tokenizer_version == tok.version  # type: ignore[attr-defined]
    assert model.max_model_len == 8192  # type: ignore[attr-defined]


def test_plain_chat_is_plain_openai(client: openai.OpenAI) -> None:
    r = chat(client, [{"role": "user", "content": "Say only yes."}])
    assert r.object == "chat.completion"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert not r.model_extra  # no token-native fields unless asked
    assert r.usage.completion_tokens > 0


def test_text_and_canonical_ids_agree(client: openai.OpenAI, tok: HFTokenizer,
                                      version: str) -> None:
    question = "What is the capital of France? Answer in one word."
    as_text = chat(client, [{"role": "user", "content": question}], return_token_ids=True)
    as_ids = chat(client, [{"role": "user", "content": [
        {"type": "input_tokens", "token_ids": tok.encode(question)}]}],
        tokenizer_version=version, return_token_ids=True)
    assert as_text.prompt_token_ids == as_ids.prompt_token_ids
    assert as_text.choices[0].token_ids == as_ids.choices[0].token_ids
    assert as_text.choices[0].message.content == as_ids.choices[0].message.content
    assert as_ids.tokenizer_version == version
    assert as_ids.token_ids_source == "sampled"


def test_two_turns_in_token_space(client: openai.OpenAI, tok: HFTokenizer,
                                  version: str) -> None:
    first = [{"role": "user", "content": {"type": "input_tokens",
                                          "token_ids": tok.encode("Say only yes.")}}]
    t1 = chat(client, first, tokenizer_version=version, return_token_ids=True,
              response_format_tokens="only")
    sampled = t1.choices[0].message.token_ids
    assert t1.choices[0].message.content is None
    assert sampled == t1.choices[0].token_ids
    assert t1.choices[0].finish_reason == "stop"
    end = tok.special_id("<|im_end|>")
    assert end not in sampled  # the end-of-turn token is not part of token_ids
    assert t1.choices[0].stop_reason == end
    t2 = chat(client, [*first, {"role": "assistant", "token_ids": sampled},
                       {"role": "user", "content": "Now say only no."}],
              tokenizer_version=version, return_token_ids=True)
    prefix = t1.prompt_token_ids + sampled
    assert t2.prompt_token_ids[:len(prefix)] == prefix
    # exactly one end-of-turn marker after the spliced turn
    assert t2.prompt_token_ids[len(prefix)] == end
    assert t2.prompt_token_ids[len(prefix) + 1] != end


@pytest.mark.parametrize("question", [
    "Translate 'thank you' into Japanese.",
    "Reply with a single emoji.",
    "Write the word café five times.",
])
def test_stream_agrees_with_non_stream(client: openai.OpenAI, tok: HFTokenizer,
                                       question: str) -> None:
    messages = [{"role": "user", "content": question}]
    kw: dict[str, Any] = {"temperature": 0.3, "seed": 1234, "max_tokens": 40,
                          "response_format_tokens": True}
    whole = chat(client, messages, **kw)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, temperature=0.3, seed=1234, max_tokens=40,
        stream_options={"include_usage": True}, extra_body={"response_format_tokens": True})
    ids: list[int] = []
    text = ""
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            ids += ch.delta.token_ids or []  # type: ignore[attr-defined]
            text += ch.delta.content or ""
    assert ids == whole.choices[0].message.token_ids
    assert text == tok.decode(ids) == whole.choices[0].message.content
    assert any(ord(c) > 127 for c in text), "this prompt answers with multi-byte characters"
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_logprobs_with_ids(client: openai.OpenAI, tok: HFTokenizer) -> None:
    r = chat(client, [{"role": "user", "content": "Name a color."}], logprobs=True,
             top_logprobs=3, response_format_tokens=True)
    entries = r.choices[0].logprobs.content
    assert [e.id for e in entries] == r.choices[0].message.token_ids
    for e in entries:
        assert bytes(e.bytes) == tok.token_bytes(e.id)
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].id == e.id


def test_n_and_stop(client: openai.OpenAI, tok: HFTokenizer) -> None:
    r = chat(client, [{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
             n=2, temperature=0.8, seed=5, stop=["5"], response_format_tokens=True)
    assert len(r.choices) == 2
    for ch in r.choices:
        assert "5" not in ch.message.content
        assert tok.decode(ch.message.token_ids) == ch.message.content


MALFORMED: list[tuple[dict[str, Any], str, str | None]] = [
    ({"messages": [{"role": "user", "content": {"type": "input_tokens", "token_ids": [1]}}]},
     "tokenizer_version_required", "tokenizer_version"),
    ({"tokenizer_version": "x@sha256:0123456789abcdef",
      "messages": [{"role": "user", "content": {"type": "input_tokens", "token_ids": [1]}}]},
     "unknown_tokenizer_version", "tokenizer_version"),
    ({"tokenizer_version": "smollm2-49k", "messages": [{"role": "user", "content": [
        {"type": "input_tokens", "token_ids": [1, 2, 3, 4, 5, 6, 7, 999999]}]}]},
     "invalid_token_id", "messages[0].content[0].token_ids[7]"),
    ({"tokenizer_version": "smollm2-49k", "messages": [{"role": "user", "content": [
        {"type": "input_tokens", "token_ids": [-4]}]}]},
     "invalid_token_id", "messages[0].content[0].token_ids[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "audio", "data": "x"}]}]},
     "invalid_value", "messages[0].content[0]"),
    ({"messages": []}, "invalid_value", "messages"),
    ({"tokenizer_version": "smollm2-49k", "messages": [{"role": "user", "content": {
        "type": "input_tokens", "token_ids": [253] * 9000}}]},
     "context_length_exceeded", "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1},
     "invalid_value", "max_tokens"),
]


def test_malformed_requests_then_a_good_one(live_server: LiveServer, client: openai.OpenAI,
                                            ) -> None:
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        for payload, code, param in MALFORMED:
            r = http.post("/v1/chat/completions", json={"model": MODEL, **payload})
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert (err["code"], err["param"]) == (code, param)
            assert err["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, [{"role": "user", "content": {"type": "input_tokens", "token_ids": [1]}}])
    assert info.value.code == "tokenizer_version_required"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user",
                                                                  "content": "hi"}])
    r = chat(client, [{"role": "user", "content": "Say only yes."}])
    assert r.choices[0].message.content


def test_disconnect_mid_stream_frees_the_engine(live_server: LiveServer,
                                                client: openai.OpenAI) -> None:
    engine = live_server.app.state.models.get(MODEL).engine  # type: ignore[attr-defined]
    assert isinstance(engine, Engine)  # embedded, or a gateway's upstream engine
    body = {"model": MODEL, "stream": True, "max_tokens": 3000, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me a very long story."}]}
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = 0
            # held: a dropped line iterator closes the connection (httpcore), which would
            # disconnect before the check below
            stream = r.iter_lines()
            for line in stream:
                lines += bool(line)
                if lines == 5:
                    break
            assert engine.n_active == 1
    deadline = time.monotonic() + 10
    while engine.n_active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.n_active == 0
    assert chat(client, [{"role": "user", "content": "Say only yes."}]).choices[0].message.content


def test_a_second_turn_comes_from_the_prefix_cache(client: openai.OpenAI, version: str) -> None:
    """The embedded engine (and llama-server, through the gateway) keeps each slot's KV: turn 2
    computes only what turn 1 did not."""
    messages: list[Any] = [{"role": "user", "content": "Name a large animal."}]
    first = chat(client, messages, return_token_ids=True, max_tokens=16)
    prompt, out = first.model_extra["prompt_token_ids"], first.choices[0].model_extra["token_ids"]
    messages += [{"role": "assistant", "token_ids": out},
                 {"role": "user", "content": "And a small one?"}]
    second = chat(client, messages, return_token_ids=True, tokenizer_version=version,
                  max_tokens=16)
    assert second.model_extra["prompt_token_ids"][:len(prompt) + len(out)] == prompt + out
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    held = len(prompt) + len(out) - 1
    if TEST_UPSTREAM == "vllm":  # vLLM's cache serves whole blocks
        held -= held % VLLM_BLOCK
    assert cached >= held
    assert cached < second.usage.prompt_tokens


def test_vllms_generate_reports_the_cache_too(live_server: LiveServer) -> None:
    prompt = [1, 4093, 198, 21337, 253, 1345, 2511, 30, 2, 198, 1, 520, 9531, 198]
    body = {"token_ids": prompt, "sampling_params": {"temperature": 0, "max_tokens": 4}}
    with httpx.Client(base_url=live_server.url, timeout=120) as http:
        http.post("/inference/v1/generate", json=body).raise_for_status()
        usage = http.post("/inference/v1/generate", json=body).json()["usage"]
    if TEST_UPSTREAM == "vllm":  # whole blocks: a prompt of 2 blocks and a bit
        prompt = prompt * 5
        body["token_ids"] = prompt
        with httpx.Client(base_url=live_server.url, timeout=120) as http:
            http.post("/inference/v1/generate", json=body).raise_for_status()
            usage = http.post("/inference/v1/generate", json=body).json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 2 * VLLM_BLOCK
        return
    assert usage["prompt_tokens_details"]["cached_tokens"] == len(prompt) - 1
