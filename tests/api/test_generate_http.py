"""vLLM's token API, POST /inference/v1/generate, as tokenwire serves it (scripted engine);
the shapes are compared with vLLM's own, recorded from its source in tests/engines/shapes/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import MODEL, FakeEngine
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.anyio

SHAPES = Path(__file__).parents[1] / "engines" / "shapes" / "vllm"


def body(tok: HFTokenizer, **sampling: Any) -> dict[str, Any]:
    return {"token_ids": tok.encode("Say hi"), "sampling_params": {"max_tokens": 64,
                                                                  **sampling}}


async def generate(client: httpx.AsyncClient, payload: Any) -> httpx.Response:
    return await client.post("/inference/v1/generate", json=payload)


def events(r: httpx.Response) -> list[dict[str, Any]]:
    frames = [f[6:] for f in r.text.split("\n\n") if f.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


async def test_whole_response_has_vllm_shape(client: httpx.AsyncClient, tok: HFTokenizer,
                                             fake_engine: FakeEngine) -> None:
    r = await generate(client, {**body(tok, logprobs=1), "request_id": "r1", "model": MODEL})
    data = r.json()
    vllm = json.loads((SHAPES / "generate_response_nonstream_v034.json").read_text())
    # every field a vLLM client reads is there, with vLLM's types
    for key in ("request_id", "model", "created", "usage", "output_mode", "choices"):
        assert type(data[key]) is type(vllm[key]) or vllm[key] is None, key
    assert data["request_id"] == "generate-tokens-r1"
    [choice] = data["choices"]
    # vLLM's ids end with the id that ended the output; the main EOS has no stop_reason
    assert choice["token_ids"] == [*fake_engine.script, fake_engine.eog_id]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)
    assert data["usage"]["completion_tokens"] == len(fake_engine.script) + 1
    entries = choice["logprobs"]["content"]
    assert len(entries) == len(choice["token_ids"])
    for t, e in zip(choice["token_ids"], entries, strict=True):
        # both vLLM spellings of the id: token_id (0.32+) and "token_id:N" (older, verifiers)
        assert e["token_id"] == t and e["token"] == f"token_id:{t}"
        assert e["top_logprobs"][0]["token_id"] == t
    assert data["tokenizer_version"] == tok.version and data["token_ids_source"] == "sampled"


async def test_stream_is_deltas_then_usage(client: httpx.AsyncClient, tok: HFTokenizer,
                                           fake_engine: FakeEngine) -> None:
    whole = (await generate(client, body(tok))).json()
    r = await generate(client, {**body(tok), "stream": True, "return_token_ids": True,
                                "stream_options": {"include_usage": True}})
    evs = events(r)
    assert evs[0]["prompt_token_ids"] == tok.encode("Say hi")
    assert all("prompt_token_ids" not in e for e in evs[1:])
    *chunks, usage = evs
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    ids = [t for e in chunks for t in e["choices"][0]["token_ids"]]
    assert ids == whole["choices"][0]["token_ids"]
    assert [e["choices"][0]["finish_reason"] for e in chunks][-1] == "stop"
    assert all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1])


async def test_continuous_usage_counts_each_choice_so_far(client: httpx.AsyncClient,
                                                          tok: HFTokenizer) -> None:
    whole = (await generate(client, body(tok))).json()
    r = await generate(client, {**body(tok), "stream": True, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True}})
    *chunks, last = events(r)
    sent = [len(e["choices"][0]["token_ids"]) for e in chunks]
    counts = [e["usage"]["completion_tokens"] for e in chunks]
    assert counts[:-1] == [sum(sent[:i + 1]) for i in range(len(sent) - 1)]
    assert counts[-1] == last["usage"]["completion_tokens"] == \
        whole["usage"]["completion_tokens"]
    assert all(e["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] for e in chunks)


async def test_stop_ids_and_strings_end_as_vllm_ends_them(client: httpx.AsyncClient,
                                                          tok: HFTokenizer,
                                                          fake_engine: FakeEngine) -> None:
    script = fake_engine.script
    stop_id = script[3]
    data = (await generate(client, body(tok, stop_token_ids=[stop_id]))).json()
    [choice] = data["choices"]
    assert choice["token_ids"] == script[:4] and choice["stop_reason"] == stop_id
    # a stop string: the token that completes it is the last id (vLLM keeps it)
    data = (await generate(client, body(tok, stop=["tous"]))).json()
    [choice] = data["choices"]
    assert choice["stop_reason"] == "tous"
    assert tok.decode(choice["token_ids"]).endswith("tous")


async def test_more_than_the_context_leaves_ends_in_length(client: httpx.AsyncClient,
                                                            fake_engine: FakeEngine) -> None:
    """vLLM's rule: a fixed max_tokens beyond the room left is not an error."""
    fake_engine.script = [253] * 40
    data = (await generate(client, {"token_ids": [1] * 2040,
                                    "sampling_params": {"max_tokens": 100}})).json()
    [choice] = data["choices"]
    assert (choice["finish_reason"], len(choice["token_ids"])) == ("length", 8)  # 2048 - 2040


async def test_n_choices(client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    data = (await generate(client, body(tok, n=3, seed=5, temperature=0.7))).json()
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]


@pytest.mark.parametrize(("payload", "status", "code", "param"), [
    ({"token_ids": [1], "sampling_params": {"bogus": 1}}, 400, "unknown_parameter",
     "sampling_params.bogus"),
    ({"token_ids": [1], "sampling_params": {"top_k": -2}}, 400, "invalid_value",
     "sampling_params.top_k"),
    ({"token_ids": [1], "sampling_params": {"logit_bias": {"99999": 1}}}, 400, "invalid_value",
     "sampling_params.logit_bias"),
    ({"token_ids": [1], "sampling_params": {"max_tokens": 3, "min_tokens": 4}}, 400,
     "invalid_value", "sampling_params.min_tokens"),
    ({"token_ids": [1], "sampling_params": {"bad_words": ["x"]}}, 400,
     "unsupported_parameter", "sampling_params.bad_words"),
    ({"token_ids": [1], "sampling_params": {}, "output_mode": "text"}, 400,
     "unsupported_parameter", "output_mode"),
    ({"token_ids": [1], "sampling_params": {}, "priority": 3}, 400, "unsupported_parameter",
     "priority"),
    ({"token_ids": [], "sampling_params": {}}, 400, "invalid_value", "token_ids"),
    ({"token_ids": [1, 99999], "sampling_params": {}}, 400, "invalid_token_id", "token_ids[1]"),
    ({"token_ids": [1, -2], "sampling_params": {}}, 400, "invalid_token_id", "token_ids[1]"),
    ({"token_ids": [1], "sampling_params": {"stop_token_ids": [99999]}}, 400,
     "invalid_token_id", "sampling_params.stop_token_ids[0]"),
    ({"token_ids": [1] * 2048, "sampling_params": {"max_tokens": 9}}, 400,
     "context_length_exceeded", "token_ids"),
    ({"token_ids": [1], "sampling_params": {"prompt_logprobs": 1}, "stream": True}, 400,
     "invalid_value", "sampling_params.prompt_logprobs"),
    ({"token_ids": [1], "sampling_params": {}, "model": "gpt-4o"}, 404, "model_not_found",
     "model"),
    ({"token_ids": [1], "sampling_params": {}, "tokenizer_version": "nope"}, 400,
     "unknown_tokenizer_version", "tokenizer_version"),
    ({"token_ids": [1]}, 400, "missing_required_parameter", "sampling_params"),
    ({"token_ids": [1], "sampling_params": {"n": 0}}, 400, "invalid_value", "sampling_params.n"),
])
async def test_bad_requests_name_the_field(client: httpx.AsyncClient, fake_engine: FakeEngine,
                                           payload: dict[str, Any], status: int, code: str,
                                           param: str) -> None:
    r = await generate(client, payload)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param)
    assert fake_engine.prompts == []


async def test_prompt_logprobs_in_vllm_shape(client: httpx.AsyncClient, tok: HFTokenizer,
                                             ) -> None:
    prompt = tok.encode("Say hi there")
    data = (await generate(client, {"token_ids": prompt, "sampling_params": {
        "max_tokens": 1, "prompt_logprobs": 2}})).json()
    rows = data["prompt_logprobs"]
    assert len(rows) == len(prompt) and rows[0] is None
    for pos, row in enumerate(rows[1:], start=1):
        assert str(prompt[pos]) in row  # the prompt token, then the most likely ones
        assert all(set(v) <= {"logprob", "rank"} for v in row.values())


async def test_structured_outputs_reach_the_engine_or_are_refused_by_name(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    """vLLM's `structured_outputs`: a grammar, a schema or any JSON object is honoured (a
    gateway's vLLM adapter sends the grammar this way); what is not, is refused by name."""
    gbnf = 'root ::= "yes"'
    r = await generate(client, body(tok, structured_outputs={"grammar": gbnf}))
    assert r.status_code == 200, r.text
    assert fake_engine.params[-1].grammar is not None
    assert fake_engine.params[-1].grammar.gbnf == gbnf
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for so, want in (({"json": schema}, schema), ({"json": json.dumps(schema)}, schema),
                     ({"json_object": True}, {"type": "object"})):
        r = await generate(client, body(tok, structured_outputs=so))
        assert r.status_code == 200, (so, r.text)
        got = fake_engine.params[-1].grammar
        assert got is not None and json.loads(got.json_schema or "") == want  # as sent
    for so, param in [
        ({"regex": "a+"}, "sampling_params.structured_outputs.regex"),
        ({"grammar": gbnf, "json_object": True}, "sampling_params.structured_outputs"),
        ({"json": "[1]"}, "sampling_params.structured_outputs.json"),  # no schema at all
    ]:
        r = await generate(client, body(tok, structured_outputs=so))
        assert r.status_code == 400, so
        assert r.json()["error"]["param"] == param


async def test_a_structural_tag_is_a_lazy_grammar(client: httpx.AsyncClient, tok: HFTokenizer,
                                                  fake_engine: FakeEngine) -> None:
    """vLLM's legacy structural tag (what a gateway's vLLM adapter sends for tool_choice
    "auto"): free text until a trigger, then the tagged structures."""
    tag = {"type": "structural_tag", "triggers": ["<f>"], "structures": [
        {"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}]}
    r = await generate(client, body(tok, structured_outputs={"structural_tag": json.dumps(tag)}))
    assert r.status_code == 200, r.text
    grammar = fake_engine.params[-1].grammar
    assert grammar is not None and grammar.triggers == ("<f>",) and grammar.tags
    # xgrammar's format shape, as a gateway's vLLM adapter sends a call from the first token
    calls = {"type": "structural_tag", "format": {
        "type": "tags_with_separator", "separator": "\n", "at_least_one": True,
        "stop_after_first": True, "tags": [{"type": "tag", "begin": "<f>", "end": "</f>",
                                            "content": {"type": "json_schema",
                                                        "json_schema": {"type": "object"}}}]}}
    r = await generate(client, body(tok, structured_outputs={"structural_tag": json.dumps(calls)}))
    assert r.status_code == 200, r.text
    grammar = fake_engine.params[-1].grammar
    assert grammar is not None and not grammar.lazy and not grammar.parallel
    assert [t.begin for t in grammar.tags] == ["<f>"]
    # a family's calls (Mistral's): a separator, and a tag around them that opens the section
    listed = {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["[TOOL_CALLS]"], "tags": [{
            "type": "tag", "begin": "[TOOL_CALLS][", "end": "]",
            "content": {**calls["format"], "separator": ", ", "stop_after_first": False}}]}}
    r = await generate(client, body(tok, structured_outputs={"structural_tag": json.dumps(listed)}))
    assert r.status_code == 200, r.text
    grammar = fake_engine.params[-1].grammar
    assert grammar is not None and grammar.triggers == ("[TOOL_CALLS]",) and grammar.parallel
    assert (grammar.separator, grammar.section) == (", ", ("[TOOL_CALLS][", "]"))
    for bad, param in [
        ({**tag, "triggers": ["<g>"]}, ".structures[0].begin"),
        ({"type": "structural_tag", "format": {}}, ".format"),
        ({"type": "structural_tag", "format": {**calls["format"], "at_least_one": False}},
         ".format"),
        ({**tag, "structures": [{"begin": "<f>", "end": "</f>", "schema": [1]}]},
         ".structures[0].schema"),
    ]:
        r = await generate(client, body(tok, structured_outputs={
            "structural_tag": json.dumps(bad)}))
        assert r.status_code == 400, bad
        assert r.json()["error"]["param"] == \
            "sampling_params.structured_outputs.structural_tag" + param
