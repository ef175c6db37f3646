"""Schemas -> grammars: what cannot be enforced is refused by name; what is built, llama.cpp
parses."""

from __future__ import annotations

import ctypes
import json
from typing import Any

import pytest

from tokenwire.engines._llama import _grammar_sampler, check_grammar
from tokenwire.engines.base import Grammar
from tokenwire.engines.llamacpp import LlamaCppEngine
from tokenwire.errors import InvalidRequestError, UnsupportedParameterError
from tokenwire.serving.grammar import schema_grammar, tool_call_grammar

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "when": {"type": "string", "format": "date"},
        "pet": {"$ref": "#/$defs/pet"},
        "note": {"anyOf": [{"type": "null"}, {"type": "string"}]},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
    "$defs": {"pet": {"type": "object", "properties": {"kind": {"const": "cat"}}}},
}


@pytest.mark.parametrize(("schema", "param"), [
    ({"type": "integer", "minimum": 0}, "s.minimum"),
    ({"type": "string", "pattern": "^a$"}, "s.pattern"),
    ({"type": "string", "maxLength": 20000}, "s.maxLength"),
    ({"type": "array", "maxItems": 20000, "items": {"type": "integer"}}, "s.maxItems"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "s.required"),
    ({"type": "object", "additionalProperties": {"type": "integer"}},
     "s.additionalProperties"),
    ({"prefixItems": [{"type": "integer"}], "items": {"type": "string"}}, "s.items"),
    ({"$ref": "#/$defs/a", "maxLength": 3, "$defs": {"a": {"type": "string"}}},
     "s.maxLength"),
    ({"anyOf": [{"type": "string"}], "minLength": 2}, "s.minLength"),
    ({"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
      "$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}}}},
     "s.$defs.n"),
    ({"type": "object", "properties": {"x": {"type": "number", "multipleOf": 2}}},
     "s.properties.x.multipleOf"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "s.uniqueItems"),
    ({"not": {"type": "string"}}, "s.not"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "s.patternProperties"),
    ({"type": "string", "format": "email"}, "s.format"),
    ({"$ref": "https://example.com/schema"}, "s.$ref"),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "s.oneOf"),
    ({"if": {}, "then": {}}, "s.if"),
])
def test_unenforceable_keywords_are_refused_by_name(schema: dict[str, Any], param: str) -> None:
    with pytest.raises(UnsupportedParameterError) as exc:
        schema_grammar(schema, "s")
    assert exc.value.param == param


@pytest.mark.parametrize("schema", [
    {"type": [["string"]]}, {"type": {}},
    {"enum": []}, {"type": []}, {"type": "string", "maxLength": -1}, {"required": "a"},
])
def test_malformed_schemas_are_400s(schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError):
        schema_grammar(schema, "s")


def test_a_format_that_is_not_a_string_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedParameterError) as exc:
        schema_grammar({"type": "string", "format": ["date"]}, "s")
    assert exc.value.param == "s.format"


def test_only_the_converters_refusals_are_the_clients_fault(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the converter raises to refuse a schema is a 400 naming the field; a bug (any other
    exception) is not blamed on the client."""
    from tokenwire.serving import grammar

    def refuse(self: Any, schema: Any, name: str) -> str:
        raise AssertionError("Unrecognized schema")

    monkeypatch.setattr(grammar._Converter, "visit", refuse)
    with pytest.raises(UnsupportedParameterError) as refused:
        schema_grammar({"type": "object"}, "response_format.json_schema.schema")
    assert refused.value.param == "response_format.json_schema.schema"

    def bug(self: Any, schema: Any, name: str) -> str:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(grammar._Converter, "visit", bug)
    with pytest.raises(ZeroDivisionError):
        schema_grammar({"type": "object"}, "response_format.json_schema.schema")


def test_schemas_pydantic_writes_are_accepted() -> None:
    for schema in [
        {"type": "array", "items": {}},  # list[Any]
        {"title": "A"},  # Any
        {"type": "object", "properties": {"a": True, "b": {"items": True}}},
        {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "X"},
        {"allOf": [{"$ref": "#/definitions/M"}], "description": "pydantic 1",
         "definitions": {"M": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
        {"$defs": {"unused": {"type": "string"}}},
    ]:
        schema_grammar(schema, "s")


class Matcher:
    """Feeds text to llama.cpp's grammar sampler one character's tokens at a time (the real
    vocabulary), and says whether the grammar admits it whole."""

    def __init__(self, engine: LlamaCppEngine):
        self.llama = engine.llama

    def allowed(self, sampler: Any, token: int) -> bool:
        import llama_cpp as L
        arr = (L.llama_token_data * 1)()
        arr[0].id, arr[0].logit, arr[0].p = token, 0.0, 0.0
        cur = L.llama_token_data_array(arr, 1, -1, False)
        L.llama_sampler_apply(sampler, ctypes.byref(cur))
        return bool(arr[0].logit > -1e30)

    def accepts(self, grammar: Grammar, text: str) -> bool:
        import llama_cpp as L
        sampler = _grammar_sampler(self.llama.vocab, grammar)
        try:
            for ch in text:
                for t in self.llama.tokenize(ch):
                    if not self.allowed(sampler, t):
                        return False
                    L.llama_sampler_accept(sampler, t)
            eos = L.llama_vocab_eos(self.llama.vocab)
            return self.allowed(sampler, eos)
        finally:
            L.llama_sampler_free(sampler)


@pytest.mark.engine
def test_grammars_admit_json_and_only_json(engine: LlamaCppEngine) -> None:
    m = Matcher(engine)
    string = schema_grammar({"type": "string"}, "s")
    assert m.accepts(string, '"a\\nb"') and not m.accepts(string, '"a\nb"')  # raw newline
    odd = ["a\\b", 'x"y', "tab\there"]
    enum = schema_grammar({"enum": odd}, "s")
    assert all(m.accepts(enum, json.dumps(v)) for v in odd)
    assert not m.accepts(enum, '"a\bb"')
    names = schema_grammar({"type": "object", "properties": {'q"k': {"type": "integer"}},
                            "required": ['q"k'], "additionalProperties": False}, "s")
    assert m.accepts(names, json.dumps({'q"k': 1}))
    # two tools that both define $defs/Item, differently: each keeps its own
    a = {"type": "object", "properties": {"x": {"$ref": "#/$defs/Item"}}, "required": ["x"],
         "additionalProperties": False, "$defs": {"Item": {"type": "integer"}}}
    b = {"type": "object", "properties": {"x": {"$ref": "#/$defs/Item"}}, "required": ["x"],
         "additionalProperties": False, "$defs": {"Item": {"type": "string"}}}
    calls = tool_call_grammar([("a", a, "t0"), ("b", b, "t1")], parallel=False, lazy=False,
                              open_tag="<c>", close_tag="</c>")
    call = '<c>\n{{"name": "{}", "arguments": {}}}\n</c>'
    assert m.accepts(calls, call.format("a", '{"x": 1}'))
    assert m.accepts(calls, call.format("b", '{"x": "s"}'))
    assert not m.accepts(calls, call.format("b", '{"x": 1}'))
    assert m.accepts(schema_grammar({"type": "string", "maxLength": 256}, "s"), '"ok"')


@pytest.mark.engine
def test_built_grammars_parse_in_llama_cpp(engine: LlamaCppEngine) -> None:
    check_grammar(engine.llama, schema_grammar(SCHEMA, "s"))
    tools = [("f", SCHEMA, "t0"), ("g", None, "t1")]
    for lazy in (False, True):
        grammar = tool_call_grammar(tools, parallel=True, lazy=lazy, open_tag="<tool_call>",
                                    close_tag="</tool_call>")
        check_grammar(engine.llama, grammar)
        assert grammar.lazy == lazy
