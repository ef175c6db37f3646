"""Structured output: the embedded engine enforces what llguidance compiles and refuses the rest
by name and place; upstreams get schemas in their own terms, with what their backend would drop
refused first."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from tokenwire.engines.base import Grammar, SamplingParams, Thought
from tokenwire.engines.grammars.gbnf import tags_gbnf
from tokenwire.engines.grammars.guide import Guides, lark_of
from tokenwire.engines.grammars.upstream import (
    check_schema,
    llama_server_drops,
    vllm_drops,
    xgrammar_drops,
)
from tokenwire.engines.grammars.xgrammar import structural_tag
from tokenwire.engines.llamacpp import LlamaCppEngine
from tokenwire.errors import InvalidRequestError, UnsupportedParameterError
from tokenwire.serving import structured
from tokenwire.serving.toolcalls import HERMES

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "when": {"type": "string", "format": "date"},
        "pet": {"$ref": "#/$defs/pet"},
        "note": {"anyOf": [{"type": "null"}, {"type": "string"}]},
        "score": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.5},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
    "$defs": {"pet": {"type": "object", "properties": {"kind": {"const": "cat"}}}},
}


def _compile(engine: LlamaCppEngine, grammar: Grammar) -> None:
    """Admission, as a request meets it (the engine's own compile, errors as the client sees)."""
    engine._compile(grammar)


@pytest.mark.engine
@pytest.mark.parametrize(("schema", "param"), [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "s.uniqueItems"),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
     "s.properties.a.not"),
    ({"if": {"type": "string"}, "then": {"maxLength": 2}}, "s.if"),
    ({"type": "object", "properties": {"x": {"type": "array", "contains": {"const": 1}}}},
     "s.properties.x.contains"),
    ({"type": "string", "format": "credit-card"}, "s"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, "s"),
])
def test_what_llguidance_cannot_enforce_is_refused_by_name(
        engine: LlamaCppEngine, schema: dict[str, Any], param: str) -> None:
    with pytest.raises(UnsupportedParameterError) as exc:
        _compile(engine, structured.schema(schema, "s"))
    assert exc.value.param == param


@pytest.mark.engine
def test_ordinary_schemas_compile(engine: LlamaCppEngine) -> None:
    """What the hand-written converter refused (bounds, patterns, multipleOf, disjoint oneOf,
    formats, patternProperties) and what pydantic writes."""
    for schema in [
        SCHEMA,
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": "^a+$"},
        {"type": "string", "format": "email"},
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        {"type": "object", "patternProperties": {"^a": {"type": "integer"}}},
        {"type": "array", "items": {}},
        {"title": "A"},
        {"type": "object", "properties": {"a": True, "b": {"items": True}}},
        {"allOf": [{"$ref": "#/definitions/M"}], "description": "pydantic 1",
         "definitions": {"M": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
        {"type": "string", "maxLength": 20000},
    ]:
        _compile(engine, structured.schema(schema, "s"))


@pytest.mark.parametrize("schema", [[1], "x", None, {"a": float("nan")}])
def test_what_is_no_schema_at_all_is_a_400(schema: Any) -> None:
    with pytest.raises(InvalidRequestError) as exc:
        structured.schema(schema, "s")
    assert exc.value.param == "s"


@pytest.mark.engine
@pytest.mark.parametrize("schema", [{"type": "strin"}, {"$ref": "#/$defs/missing"},
                                    {"type": "array", "minItems": 3, "maxItems": 1}])
def test_malformed_schemas_are_400s_naming_the_field(engine: LlamaCppEngine,
                                                     schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError) as exc:
        _compile(engine, structured.schema(schema, "response_format.json_schema.schema"))
    assert exc.value.param == "response_format.json_schema.schema"


@pytest.mark.engine
@pytest.mark.parametrize("gbnf", ["root ::= (", "root ::= item", 'start ::= "a"'])
def test_a_grammar_that_does_not_parse_is_a_400(engine: LlamaCppEngine, gbnf: str) -> None:
    with pytest.raises(InvalidRequestError) as exc:  # (an undefined rule, no root)
        _compile(engine, Grammar(gbnf=gbnf, param="sampling_params.grammar"))
    assert exc.value.param == "sampling_params.grammar"


@pytest.mark.engine
def test_llguidance_options_are_the_servers(engine: LlamaCppEngine) -> None:
    """A client's `x-guidance` (`lenient` would drop keywords silently) is refused by name."""
    for options in ({"lenient": True}, "x"):
        with pytest.raises(UnsupportedParameterError) as exc:
            _compile(engine, structured.schema({"type": "object", "x-guidance": options}, "s"))
        assert exc.value.param == "s.x-guidance"
    _compile(engine, structured.schema({"type": "array", "uniqueItems": False}, "s"))


@pytest.mark.engine
def test_min_tokens_never_outlasts_a_finished_grammar(engine: LlamaCppEngine) -> None:
    """A document that can only end, under min_tokens: it ends (the stop ids stay allowed),
    and a sequence running beside it is untouched."""
    prompt = engine.llama.tokenize("<|im_start|>user\nTrue or false?<|im_end|>\n"
                                   "<|im_start|>assistant\n", parse_special=True)

    async def both() -> tuple[list[Any], list[Any]]:
        strict = await engine.submit(prompt, SamplingParams(
            max_tokens=20, temperature=0.0, min_tokens=10,
            grammar=structured.schema({"type": "boolean"}, "s")))
        free = await engine.submit(prompt, SamplingParams(max_tokens=12, temperature=0.0,
                                                          ignore_eos=True))
        return [ev async for ev in strict], [ev async for ev in free]

    strict, free = asyncio.run(both())
    text = b"".join(engine.llama.piece(ev.token_id) for ev in strict[:-1]).decode()
    assert text in ("true", "false") and strict[-1].reason == "stop"
    assert len(free) == 13 and free[-1].reason == "length"


def _accepts(guides: Guides, engine: LlamaCppEngine, grammar: Grammar, text: str) -> bool:
    """The grammar admits `text` whole (as the model's own tokens spell it), and may end there."""
    m = guides.compile(grammar).deep_copy()
    ids = engine.llama.tokenize(text, parse_special=False)
    return bool(m.consume_tokens(ids)) and not m.is_error() and m.is_accepting()


@pytest.fixture(scope="module")
def guides(engine: LlamaCppEngine) -> Guides:
    llama = engine.llama
    return Guides(llama.vocab, llama.n_vocab, sorted(llama.eog_ids()))


@pytest.mark.engine
def test_grammars_admit_json_and_only_json(engine: LlamaCppEngine, guides: Guides) -> None:
    ok = lambda g, t: _accepts(guides, engine, g, t)  # noqa: E731
    string = structured.schema({"type": "string"}, "s")
    assert ok(string, '"a\\nb"') and not ok(string, '"a\nb"')  # a raw newline
    odd = ["a\\b", 'x"y', "tab\there"]
    enum = structured.schema({"enum": odd}, "s")
    assert all(ok(enum, json.dumps(v)) for v in odd) and not ok(enum, '"a\bb"')
    bounded = structured.schema(SCHEMA["properties"]["age"], "s")  # type: ignore[index]
    assert ok(bounded, "130") and not ok(bounded, "131") and not ok(bounded, "-1")
    code = structured.schema(SCHEMA["properties"]["code"], "s")  # type: ignore[index]
    assert ok(code, '"ABC"') and not ok(code, '"ABCD"') and not ok(code, '"abc"')
    # two tools that both define $defs/Item, differently: each keeps its own
    a = {"type": "object", "properties": {"x": {"$ref": "#/$defs/Item"}}, "required": ["x"],
         "additionalProperties": False, "$defs": {"Item": {"type": "integer"}}}
    b = {**a, "$defs": {"Item": {"type": "string"}}}
    calls = HERMES.grammar([("a", a, "t0"), ("b", b, "t1")], parallel=False, lazy=False)
    call = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>'
    assert ok(calls, call.format("a", '{"x": 1}')) and ok(calls, call.format("b", '{"x": "s"}'))
    assert not ok(calls, call.format("b", '{"x": 1}'))
    assert not ok(calls, call.format("a", '{"x": 1}') + "\n" + call.format("a", '{"x": 2}'))
    parallel = HERMES.grammar([("a", a, "t0")], parallel=True, lazy=False)
    assert ok(parallel, call.format("a", '{"x": 1}') + "\n" + call.format("a", '{"x": 2}'))


@pytest.mark.engine
def test_a_lazy_grammar_holds_from_its_trigger_on(engine: LlamaCppEngine,
                                                  guides: Guides) -> None:
    ok = lambda t: _accepts(guides, engine, lazy, t)  # noqa: E731
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    lazy = HERMES.grammar([("w", schema, "t0")], parallel=True, lazy=True)
    call = '<tool_call>\n{"name": "w", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert ok("Free text, <b>tags</b> and all.")
    assert ok("Let me look." + call) and ok(call + "\n" + call)
    assert not ok('Let me look.<tool_call>\n{"name": "x"}')  # an unknown tool
    assert not ok(call + " and prose after it")


@pytest.mark.engine
def test_the_engine_samples_inside_the_grammar(engine: LlamaCppEngine) -> None:
    """Sampled at temperature 1 under the schema: every document parses and validates."""
    import jsonschema
    schema = {"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "ok": {"type": "boolean"}}, "required": ["age", "code", "ok"],
        "additionalProperties": False}
    prompt = engine.llama.tokenize("<|im_start|>user\nA person as JSON<|im_end|>\n"
                                   "<|im_start|>assistant\n", parse_special=True)

    async def one(seed: int) -> str:
        stream = await engine.submit(prompt, SamplingParams(
            max_tokens=64, temperature=1.0, seed=seed,
            grammar=structured.schema(schema, "s")))
        ids = [ev.token_id async for ev in stream if hasattr(ev, "token_id")]
        return b"".join(engine.llama.piece(t) for t in ids).decode()

    for seed in range(5):
        jsonschema.validate(json.loads(asyncio.run(one(seed))), schema)


def test_lark_spells_each_kind() -> None:
    assert lark_of(structured.json_object()).startswith("start: %json")
    tags = HERMES.grammar([("f", None, "t0")], parallel=True, lazy=True)
    text = lark_of(tags)
    assert "[lazy]" in text and '"<tool_call>"' in text and '("\\n" tagged)*' in text


@pytest.mark.parametrize(("drops", "schema", "param"), [
    # llama-server's converter
    (llama_server_drops, {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
     "s.uniqueItems"),
    (llama_server_drops, {"type": "number", "minimum": 0}, "s.minimum"),
    (llama_server_drops, {"type": "integer", "multipleOf": 2}, "s.multipleOf"),
    (llama_server_drops, {"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 20000}}}, "s.properties.a.maxLength"),
    (llama_server_drops, {"oneOf": [{"type": "string"}, {"type": "integer"}]}, "s.oneOf"),
    # SGLang's xgrammar
    (xgrammar_drops, {"type": "array", "uniqueItems": True}, "s.uniqueItems"),
    (xgrammar_drops, {"type": "number", "multipleOf": 2}, "s.multipleOf"),
    (xgrammar_drops, {"type": "string", "pattern": "^a+$", "maxLength": 3}, "s.maxLength"),
])
def test_what_a_backend_would_drop_is_refused_by_name(drops: Any, schema: dict[str, Any],
                                                      param: str) -> None:
    with pytest.raises(UnsupportedParameterError) as exc:
        check_schema(structured.schema(schema, "s"), drops)
    assert exc.value.param == param


def test_what_llama_server_enforces_passes() -> None:
    without = {**SCHEMA, "properties": {k: v for k, v in SCHEMA["properties"].items()  # type: ignore[attr-defined]
                                        if k != "score"}}
    check_schema(structured.schema(without, "s"), llama_server_drops)


def test_what_vllm_would_take_and_drop_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedParameterError) as exc:
        check_schema(structured.schema({"type": "object", "properties": {
            "n": {"type": "integer", "not": {"const": 3}}}}, "s"), vllm_drops)
    assert exc.value.param == "s.properties.n.not"
    check_schema(structured.schema({"type": "array", "uniqueItems": True}, "s"), vllm_drops)
    # (vLLM refuses uniqueItems itself: its 400 is passed on)


def test_an_upstreams_field_is_renamed_to_the_clients() -> None:
    from tokenwire.engines.grammars.upstream import client_param
    doc = structured.schema({"type": "object"}, "response_format.json_schema.schema")
    assert client_param("sampling_params.structured_outputs.json.properties.a.not", doc) == \
        "response_format.json_schema.schema.properties.a.not"
    assert client_param("sampling_params.structured_outputs.json_object", doc) == \
        "sampling_params.structured_outputs.json_object"  # another field: as it was
    calls = HERMES.grammar([("f", {"type": "object"}, "tools[0].function.parameters"),
                                   ("g", {"type": "object"}, "tools[1].function.parameters")],
                                  parallel=False, lazy=False)
    assert client_param("sampling_params.structured_outputs.structural_tag.format.tags[1]"
                        ".content.json_schema.not", calls) == "tools[1].function.parameters.not"


def test_a_trigger_that_begins_no_structure_is_a_400() -> None:
    tag = {"type": "structural_tag", "triggers": ["<f>", "<g>"], "structures": [
        {"begin": "<f>", "schema": {}, "end": "</f>"}]}
    with pytest.raises(InvalidRequestError) as exc:
        structured.from_structural_tag(tag, "st")
    assert exc.value.param == "st.triggers[1]"


def test_structural_tags_in_vllms_and_sglangs_shapes() -> None:
    tools = [("f", {"type": "object"}, "t0")]
    lazy = json.loads(structural_tag(HERMES.grammar(tools, parallel=True, lazy=True)))
    assert lazy["triggers"] == ["<tool_call>"] and lazy["structures"][0]["schema"] == {
        "type": "object"}
    forced = json.loads(structural_tag(HERMES.grammar(tools, parallel=False, lazy=False)))
    fmt = forced["format"]
    assert fmt["type"] == "tags_with_separator" and fmt["at_least_one"] is True
    assert fmt["stop_after_first"] is True
    assert fmt["tags"][0]["content"] == {"type": "json_schema", "json_schema": {"type": "object"}}


def test_llama_server_tool_calls_are_gbnf_with_their_schemas() -> None:
    tools = [("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}},
              "tools[0].function.parameters")]
    gbnf = tags_gbnf(HERMES.grammar(tools, parallel=True, lazy=True))
    assert "get_weather" in gbnf and gbnf.count("root ::=") == 1
    with pytest.raises(UnsupportedParameterError) as exc:
        tags_gbnf(HERMES.grammar([("f", {"type": "integer", "minimum": 0}, "t0")],
                                        parallel=False, lazy=False))
    assert exc.value.param == "t0.minimum"


@pytest.mark.engine
def test_a_grammar_with_reasoning_holds_after_the_thought(engine: LlamaCppEngine,
                                                          guides: Guides) -> None:
    """The thought is free text up to its end marker (a call's tag inside it is thought, not a
    call); from the end marker on the grammar holds; a model may also answer at once."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    required = HERMES.grammar([("w", schema, "t0")], parallel=False, lazy=False)
    call = '<tool_call>\n{"name": "w", "arguments": {"city": "Paris"}}\n</tool_call>'
    after = dataclasses.replace(required, reasoning=Thought("<think>", "</think>", False))
    ok = lambda g, t: _accepts(guides, engine, g, t)  # noqa: E731
    assert ok(after, f"<think>\nI should call <tool_call> w.\n</think>\n\n{call}")
    assert ok(after, call) and not ok(required, f"<think>\nhm\n</think>\n\n{call}")
    assert not ok(after, "<think>\nhm\n</think>\n\nIt is sunny.")  # the answer is still bound
    inside = dataclasses.replace(structured.schema(schema, "s"),
                                 reasoning=Thought("<think>", "</think>", True))
    assert ok(inside, 'The prompt opened it.</think>\n{"city": "Rome"}')
    assert not ok(inside, '{"city": "Rome"}')  # the prompt opened the thought: it must end


@pytest.mark.engine
def test_control_token_markers_are_matched_as_their_ids(engine: LlamaCppEngine,
                                                        guides: Guides) -> None:
    """A format whose markers are control tokens (SmolLM2's `<|im_end|>` stands in for
    DeepSeek's `<｜tool▁calls▁begin｜>`): the grammar forces the id; no text spells it."""
    grammar = structured.tagged([("<|im_end|>f:", {"type": "integer"}, "t", "")],
                                parallel=False, param="tools")
    m = guides.compile(grammar).deep_copy()
    assert "<[2]>" in lark_of(grammar, guides._specials)
    ids = [2, *engine.llama.tokenize("f:7", parse_special=False)]
    assert m.consume_tokens(ids) and m.is_accepting()
    text = guides.compile(grammar).deep_copy()
    assert not text.consume_tokens(engine.llama.tokenize("<|im_end|>f:7", parse_special=False))


@pytest.mark.engine
def test_a_reasoning_budget_forces_the_end_marker(engine: LlamaCppEngine,
                                                  guides: Guides) -> None:
    """vLLM's `thinking_token_budget` on the embedded engine: after that many tokens of thought
    the end marker is all the grammar allows; an answer of any text follows."""
    budget = Grammar(reasoning=Thought("<think>", "</think>", False, budget=5))
    ok = lambda t: _accepts(guides, engine, budget, t)  # noqa: E731
    assert ok("<think>a b</think>\n\nAny answer, free.") and ok("<think></think>Quick.")
    assert not ok("No thought at all.")  # bounded, the thought is required (it may be empty)
    assert not ok("<think>one two three four five six</think>ok")  # six tokens of thought
    m = guides.compile(budget).deep_copy()
    assert m.consume_tokens(engine.llama.tokenize("<think>one two three four five",
                                                  parse_special=False))
    forced = m.compute_ff_tokens()
    head = b"".join(engine.llama.piece(i) for i in forced)
    assert len(head) > 1 and b"</think>".startswith(head)  # its last byte may merge onward
    assert m.consume_tokens(forced) and not m.consume_tokens(
        engine.llama.tokenize(" six", parse_special=False))


@pytest.mark.engine
def test_a_recursive_client_grammar_after_a_thought(engine: LlamaCppEngine,
                                                    guides: Guides) -> None:
    """A client's GBNF whose root recurses keeps recursing into itself, not into the thought
    the reasoning prefix puts before it."""
    nested = Grammar(gbnf='root ::= "[" root "]" | "x"', param="structured_outputs.grammar",
                     reasoning=Thought("<think>", "</think>", True))
    ok = lambda t: _accepts(guides, engine, nested, t)  # noqa: E731
    assert ok("Let me nest.</think>\n[[x]]") and not ok("Let me nest.</think>\n[[y]]")


def test_qwen_xml_grammar_takes_any_schema_shape() -> None:
    """Boolean subschemas, a list where properties belong, an enum that is not a list: the
    XML grammar is still made (those parameters are free text), never a 500."""
    from tokenwire.serving.toolcalls.qwen3_xml import QWEN3_XML

    for schema in ({"type": "object", "properties": {"q": True}}, {"properties": ["a"]},
                   {"properties": {"a": {"enum": 5}}, "required": "a"}, None):
        g = QWEN3_XML.grammar([("f", schema, "t")], parallel=False, lazy=False)
        assert g is not None and g.gbnf is not None and "<function=f>" in g.gbnf
