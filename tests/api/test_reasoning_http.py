"""Reasoning split out of chat output, in process, on a scripted engine with SmolLM2's real
tokenizer: its vocabulary has no `<think>` token, so the markers are matched as text over several
ids (the harder case; ids-as-markers run on the real thinking model in tests/e2e). The contract:
the reasoning, marker and content ids together are the sampled ids in order; a stream's pieces
join to the whole answer's; no marker's text ever shows."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine
from tokenwire.api.app import create_app
from tokenwire.config import Settings
from tokenwire.serving.loader import load_template
from tokenwire.serving.models import ModelRegistry, ServedModel
from tokenwire.serving.reasoning import reasoning_format
from tokenwire.tokenizers.registry import TokenizerRegistry
from tokenwire.tokenizers.source import TokenizerSource

pytestmark = pytest.mark.anyio

REASONING = "\nThe user adds 2 and 2: that is 4.\n"
ANSWER = "\n\nIt is 4 — quatre 🎉."
OUTPUT = f"<think>{REASONING}</think>{ANSWER}"


@pytest.fixture
async def client(gguf_info: TokenizerSource, registry: TokenizerRegistry,
                 tmp_path: Any) -> AsyncIterator[httpx.AsyncClient]:
    tok = gguf_info.tokenizer
    engine = FakeEngine(vocab_size=tok.vocab_size, eog_id=gguf_info.eos_id or 2,
                        script=tok.encode(OUTPUT))
    entry = registry.register(tok, aliases=[tok.family], chat_template=gguf_info.chat_template,
                              bos_id=gguf_info.bos_id, eos_id=gguf_info.eos_id,
                              add_bos=gguf_info.add_bos)
    settings = Settings(tokenizer_store=tmp_path / "store")
    models = ModelRegistry()
    models.add(ServedModel(id=MODEL, engine=engine, tokenizer_entry=entry,
                           template=load_template(settings, gguf_info),
                           reasoning=reasoning_format(None, tok, "deepseek_r1")))
    async with serve_in_process(create_app(settings, models=models, tokenizers=registry)) as c:
        yield c


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "2 + 2?"}], **kw}


async def chunks(client: httpx.AsyncClient, payload: dict[str, Any]) -> list[dict[str, Any]]:
    r = await client.post("/v1/chat/completions", json={**payload, "stream": True})
    assert r.status_code == 200, r.text
    frames = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


async def test_whole_answer_splits_reasoning_from_content_as_ids(
        client: httpx.AsyncClient, gguf_info: TokenizerSource) -> None:
    tok = gguf_info.tokenizer
    r = await client.post("/v1/chat/completions", json=body(response_format_tokens=True))
    assert r.status_code == 200, r.text
    out = r.json()
    msg = out["choices"][0]["message"]
    assert msg["reasoning"] == REASONING
    assert msg["content"] == ANSWER
    assert msg["token_ids"] == tok.encode(OUTPUT)  # every sampled id, the markers' included
    reasoning_ids = msg["reasoning_token_ids"]
    assert tok.decode(reasoning_ids) == REASONING
    # a run of token_ids: the ids before it and after it are the markers and the answer
    ids = msg["token_ids"]
    at = next(i for i in range(len(ids)) if ids[i:i + len(reasoning_ids)] == reasoning_ids)
    assert tok.decode(ids[:at]) == "<think>"
    assert out["usage"]["completion_tokens_details"] == {"reasoning_tokens": len(reasoning_ids)}


async def test_stream_pieces_join_to_the_whole_answer(client: httpx.AsyncClient,
                                                      gguf_info: TokenizerSource) -> None:
    tok = gguf_info.tokenizer
    got = await chunks(client, body(response_format_tokens=True,
                                    stream_options={"include_usage": True}))
    deltas = [c["choices"][0]["delta"] for c in got if c["choices"]]
    assert "".join(d.get("reasoning") or "" for d in deltas) == REASONING
    assert "".join(d.get("content") or "" for d in deltas) == ANSWER
    assert sum((d["token_ids"] for d in deltas), []) == tok.encode(OUTPUT)
    for d in deltas:  # never a marker's text, never reasoning and content in one delta
        shown = (d.get("reasoning") or "") + (d.get("content") or "")
        assert "<" not in shown and "think>" not in shown
        assert not (d.get("reasoning") and d.get("content"))
    usage = got[-1]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == len(tok.encode(REASONING))


async def test_openai_sdk_shape_without_ids(client: httpx.AsyncClient) -> None:
    """What a plain client gets: `reasoning` beside `content`, no ids."""
    r = await client.post("/v1/chat/completions", json=body())
    msg = r.json()["choices"][0]["message"]
    assert (msg["reasoning"], msg["content"]) == (REASONING, ANSWER)
    assert "token_ids" not in msg and "reasoning_token_ids" not in msg


async def test_length_cut_inside_the_reasoning(client: httpx.AsyncClient,
                                               gguf_info: TokenizerSource) -> None:
    tok = gguf_info.tokenizer
    n = len(tok.encode("<think>" + REASONING)) - 3
    r = await client.post("/v1/chat/completions",
                          json=body(max_tokens=n, response_format_tokens=True))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == ""
    assert choice["message"]["token_ids"] == tok.encode(OUTPUT)[:n]
    assert REASONING.startswith(choice["message"]["reasoning"])
    got = await chunks(client, body(max_tokens=n, response_format_tokens=True))
    deltas = [c["choices"][0]["delta"] for c in got]
    assert "".join(d.get("reasoning") or "" for d in deltas) == choice["message"]["reasoning"]
    assert sum((d["token_ids"] for d in deltas), []) == choice["message"]["token_ids"]


async def test_include_reasoning_false_hides_it_and_refuses_what_would_show_it(
        client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=body(include_reasoning=False))
    msg = r.json()["choices"][0]["message"]
    assert "reasoning" not in msg and msg["content"] == ANSWER
    got = await chunks(client, body(include_reasoning=False))
    assert not any(c["choices"][0]["delta"].get("reasoning") for c in got)
    r = await client.post("/v1/chat/completions",
                          json=body(include_reasoning=False, return_token_ids=True))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "include_reasoning"


async def test_stop_string_inside_the_reasoning_ends_the_choice(
        client: httpx.AsyncClient) -> None:
    """Stop strings match the whole output, reasoning included (vLLM's rule). Each part's text
    is its ids' text: the token " that", where the stop string begins, goes with its space."""
    r = await client.post("/v1/chat/completions", json=body(stop=["that is"]))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["reasoning"] == "\nThe user adds 2 and 2:"
    assert choice["message"]["content"] == ""


async def test_history_reasoning_content_is_read_as_reasoning(
        client: httpx.AsyncClient) -> None:
    """vLLM's deprecated `reasoning_content` on assistant history is accepted."""
    msgs = [{"role": "user", "content": "2 + 2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "adding"},
            {"role": "user", "content": "3 + 3?"}]
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs})
    assert r.status_code == 200, r.text


async def test_responses_api_has_a_reasoning_item_with_its_ids(
        client: httpx.AsyncClient, gguf_info: TokenizerSource) -> None:
    tok = gguf_info.tokenizer
    payload = {"model": MODEL, "input": "2 + 2?", "include": ["output.token_ids"]}
    r = await client.post("/v1/responses", json=payload)
    assert r.status_code == 200, r.text
    out = r.json()
    kinds = [item["type"] for item in out["output"]]
    assert kinds == ["reasoning", "message"]
    thought, message = out["output"]
    assert thought["content"] == [{"type": "reasoning_text", "text": REASONING}]
    assert message["content"][0]["text"] == ANSWER
    # the items' ids partition the sampled ids; the markers go with the reasoning
    assert thought["token_ids"] + message["token_ids"] == tok.encode(OUTPUT)
    assert tok.decode(thought["token_ids"]) == f"<think>{REASONING}</think>"
    assert out["usage"]["output_tokens_details"]["reasoning_tokens"] == len(
        tok.encode(REASONING))
    # the stream: reasoning deltas join to the item's text, every event's ids to all ids
    r = await client.post("/v1/responses", json={**payload, "stream": True})
    events = [json.loads(line[6:]) for line in r.text.split("\n") if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "response.reasoning_text.delta"]
    assert "".join(e["delta"] for e in deltas) == REASONING
    done = [e for e in events if e["type"] == "response.reasoning_text.done"]
    assert [e["text"] for e in done] == [REASONING]
    ids = [i for e in events if e["type"].endswith(".delta") for i in e.get("token_ids") or []]
    assert ids == tok.encode(OUTPUT)
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]


async def test_messages_api_has_a_thinking_block_with_its_ids(
        client: httpx.AsyncClient, gguf_info: TokenizerSource) -> None:
    tok = gguf_info.tokenizer
    payload = {"model": MODEL, "max_tokens": 100, "response_format_tokens": True,
               "messages": [{"role": "user", "content": "2 + 2?"}]}
    r = await client.post("/v1/messages", json=payload)
    assert r.status_code == 200, r.text
    msg = r.json()
    assert [b["type"] for b in msg["content"]] == ["thinking", "text"]
    thinking, text = msg["content"]
    assert thinking["thinking"] == REASONING and thinking["signature"]
    assert text["text"] == ANSWER
    assert thinking["token_ids"] + text["token_ids"] == tok.encode(OUTPUT)
    r = await client.post("/v1/messages", json={**payload, "stream": True})
    events = [json.loads(line[6:]) for line in r.text.split("\n") if line.startswith("data: ")]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == REASONING
    signatures = [d["signature"] for d in deltas if d["type"] == "signature_delta"]
    assert len(signatures) == 1 and signatures[0]  # once, before the block stops
    assert sum((d.get("token_ids") or [] for d in deltas), []) == tok.encode(OUTPUT)


def _contains(ids: list[int], run: list[int]) -> bool:
    return any(ids[i:i + len(run)] == run for i in range(len(ids) - len(run) + 1))


async def test_history_as_ids_keeps_its_reasoning_unless_asked_to_drop_it(
        client: httpx.AsyncClient, gguf_info: TokenizerSource) -> None:
    """The sampled turn goes back verbatim by default; `keep_reasoning: false` cuts the
    markers, the reasoning and the newlines after it out, as ids (the answer's ids untouched),
    and the render's mask marks exactly the ids kept as sampled."""
    tok = gguf_info.tokenizer
    sampled = tok.encode(OUTPUT) + [gguf_info.eos_id]
    answer = tok.encode(ANSWER.lstrip("\n"))
    assert _contains(sampled, answer)  # the answer's ids are a run of the sampled ids
    msgs = [{"role": "user", "content": "2 + 2?"},
            {"role": "assistant", "token_ids": sampled},
            {"role": "user", "content": "And 3 + 3?"}]
    base = {"model": MODEL, "messages": msgs, "tokenizer_version": tok.version}
    kept = (await client.post("/v1/chat/completions/render", json=base)).json()
    assert _contains(kept["token_ids"], sampled)
    dropped = (await client.post("/v1/chat/completions/render",
                                 json={**base, "keep_reasoning": False})).json()
    ids, mask = dropped["token_ids"], dropped["sampled_mask"]
    assert _contains(ids, answer + [gguf_info.eos_id])
    assert not _contains(ids, tok.encode(REASONING))
    assert [i for i, m in zip(ids, mask, strict=True) if m] == answer + [gguf_info.eos_id]
    assert len(kept["token_ids"]) - len(ids) == len(sampled) - len(answer) - 1


async def test_turning_reasoning_off_needs_a_template_switch(client: httpx.AsyncClient) -> None:
    """`reasoning_effort: "none"` (and its Messages and Responses spellings) is the template's
    `enable_thinking: false`; SmolLM2's template has none, so each is refused by its own name
    (the real switch runs on the thinking model, tests/e2e/test_reasoning_model.py)."""
    r = await client.post("/v1/chat/completions", json=body(reasoning_effort="none"))
    assert (r.status_code, r.json()["error"]["param"]) == (400, "reasoning_effort")
    r = await client.post("/v1/messages", json={
        "model": MODEL, "max_tokens": 10, "thinking": {"type": "disabled"},
        "messages": [{"role": "user", "content": "hi"}]})
    assert (r.status_code, r.json()["error"]["details"]["param"]) == (400, "thinking")
    r = await client.post("/v1/responses", json={
        "model": MODEL, "input": "hi", "reasoning": {"effort": "none"}})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "reasoning.effort")


async def test_history_reasoning_is_client_text(client: httpx.AsyncClient) -> None:
    """A template prints history's `reasoning`: characters tokenwire marks text with are
    refused there as in every other field a template prints."""
    msgs = [{"role": "user", "content": "2 + 2?"},
            {"role": "assistant", "content": "4", "reasoning": "a\ue000tw0\ue001b"},
            {"role": "user", "content": "3 + 3?"}]
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs})
    assert r.status_code == 400
    assert r.json()["error"]["param"].startswith("messages[1].reasoning")


LEVELS_TEMPLATE = (
    "{% if reasoning_effort is defined %}<|im_start|>system\nReasoning: {{ reasoning_effort }}"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}")
"""A template that takes reasoning levels (as gpt-oss's "Reasoning: high") and the switch."""


async def test_reasoning_levels_go_to_a_template_that_takes_them(
        client: httpx.AsyncClient, gguf_info: TokenizerSource, registry: TokenizerRegistry,
        tmp_path: Any) -> None:
    """vLLM's mapping: `reasoning_effort` to a template that reads it, and `enable_thinking`
    (false only for "none"); a level the template cannot take is refused by name, never
    dropped; Responses' `reasoning.effort` is the same field, and summaries are refused."""
    r = await client.post("/v1/chat/completions", json=body(reasoning_effort="high"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", r.text
    r = await client.post("/v1/chat/completions", json=body(reasoning_effort="ultra"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", r.text
    for bad, param in (({"effort": "high"}, "reasoning.effort"),
                       ({"effort": None, "summary": "auto"}, "reasoning.summary")):
        r = await client.post("/v1/responses", json={"model": MODEL, "input": "2 + 2?",
                                                     "reasoning": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text

    path = tmp_path / "levels.jinja"
    path.write_text(LEVELS_TEMPLATE)
    tok = gguf_info.tokenizer
    settings = Settings(tokenizer_store=tmp_path / "store2", chat_template=path)
    entry = registry.register(tok, aliases=[tok.family], chat_template=gguf_info.chat_template,
                              bos_id=gguf_info.bos_id, eos_id=gguf_info.eos_id,
                              add_bos=gguf_info.add_bos)
    models = ModelRegistry()
    template = load_template(settings, gguf_info)
    models.add(ServedModel(id=MODEL, engine=FakeEngine(vocab_size=tok.vocab_size, eog_id=2,
                                                       script=tok.encode(OUTPUT)),
                           tokenizer_entry=entry, template=template,
                           reasoning=reasoning_format(None, tok, "qwen3")))
    async with serve_in_process(create_app(settings, models=models, tokenizers=registry)) as c:
        for effort, shown in (("high", "Reasoning: high"), ("none", "<think>\n\n</think>")):
            r = await c.post("/v1/chat/completions/render", json=body(reasoning_effort=effort))
            assert r.status_code == 200, r.text
            assert shown in tok.decode(r.json()["token_ids"])
        r = await c.post("/v1/chat/completions/render", json=body())
        assert "Reasoning:" not in tok.decode(r.json()["token_ids"])  # unset: not sent
