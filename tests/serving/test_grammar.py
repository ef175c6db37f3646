"""Schemas -> grammars: what cannot be enforced is refused by name; what is built, llama.cpp
parses."""

from __future__ import annotations

from typing import Any

import pytest

from tokenwire.engines._llama import check_grammar
from tokenwire.engines.llamacpp import LlamaCppEngine
from tokenwire.errors import UnsupportedParameterError
from tokenwire.serving.grammar import check_schema, schema_grammar, tool_call_grammar

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
        check_schema(schema, "s")
    assert exc.value.param == param


@pytest.mark.engine
def test_built_grammars_parse_in_llama_cpp(engine: LlamaCppEngine) -> None:
    check_grammar(engine.llama, schema_grammar(SCHEMA, "s"))
    tools = [("f", SCHEMA, "t0"), ("g", None, "t1")]
    for lazy in (False, True):
        grammar = tool_call_grammar(tools, parallel=True, lazy=lazy, open_tag="<tool_call>",
                                    close_tag="</tool_call>")
        check_grammar(engine.llama, grammar)
        assert grammar.lazy == lazy
