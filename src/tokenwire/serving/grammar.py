"""JSON schemas -> GBNF grammars, for `response_format` and for tool calls.

The converter is llama.cpp's own (`llama_cpp.llama_grammar.SchemaConverter`, the Python twin
of llama.cpp's json-schema-to-grammar). It does not enforce every JSON Schema keyword, and a
keyword it would skip could let through a document the schema rejects. So a schema is first
checked against the keywords the grammar enforces (or that cannot constrain a document), and
any other is refused by name: the output then validates against the schema every time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from llama_cpp import llama_grammar

from ..engines.base import Grammar
from ..errors import InvalidRequestError, UnsupportedParameterError

__all__ = ["check_schema", "json_grammar", "schema_grammar", "tool_call_grammar"]

_SchemaConverter: Any = llama_grammar.SchemaConverter  # untyped upstream

# keywords whose meaning the grammar enforces
_ENFORCED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "pattern",
    "format", "minLength", "maxLength",
})
# keywords that never constrain a document, or hold subschemas reached only through $ref
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "$defs", "definitions",
})
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4",
                      "uuid5"})


def check_schema(schema: Any, param: str) -> None:
    """Refuse (400, naming the keyword and where it is) what the grammar cannot enforce."""
    if isinstance(schema, bool):
        if schema:
            return
        raise UnsupportedParameterError("a schema of `false` admits no document", param=param)
    if not isinstance(schema, dict):
        raise InvalidRequestError("a JSON schema must be an object", param=param,
                                  code="invalid_value")
    for key, value in schema.items():
        at = f"{param}.{key}"
        if key not in _ENFORCED and key not in _ANNOTATIONS:
            raise UnsupportedParameterError(
                f"the JSON schema keyword {key!r} cannot be enforced by this server's grammar "
                "(supported: " + ", ".join(sorted(_ENFORCED)) + ")", param=at)
        if key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise InvalidRequestError(f"{key!r} must be an object", param=at,
                                          code="invalid_value")
            for name, sub in value.items():
                check_schema(sub, f"{at}.{name}")
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if not isinstance(value, list) or not value:
                raise InvalidRequestError(f"{key!r} must be a non-empty array", param=at,
                                          code="invalid_value")
            for i, sub in enumerate(value):
                check_schema(sub, f"{at}[{i}]")
        elif key in ("items", "additionalProperties"):
            if value is not False:  # false: nothing more (a closed object or tuple)
                check_schema(value, at)
        elif key == "type":
            types = value if isinstance(value, list) else [value]
            bad = [t for t in types if t not in _TYPES]
            if bad:
                raise InvalidRequestError(f"unknown type {bad[0]!r}", param=at,
                                          code="invalid_value")
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#/")):
            raise UnsupportedParameterError(
                "only local references ('#/...') are supported; nothing is fetched", param=at)
        elif key == "format" and value not in _FORMATS:
            raise UnsupportedParameterError(
                f"the string format {value!r} cannot be enforced (supported: "
                + ", ".join(sorted(_FORMATS)) + ")", param=at)
    if "oneOf" in schema and len(schema["oneOf"]) > 1:
        # the grammar admits any alternative; "exactly one" is not enforceable
        raise UnsupportedParameterError(
            "'oneOf' with several alternatives cannot be enforced (use 'anyOf')",
            param=f"{param}.oneOf")


def _converter() -> Any:
    return _SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def _visit(conv: Any, schema: Any, name: str, param: str) -> str:
    try:
        resolved = conv.resolve_refs(schema, "")
        return str(conv.visit(resolved, name))
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise UnsupportedParameterError(f"this schema cannot be turned into a grammar: {exc}",
                                        param=param) from exc


def json_grammar() -> Grammar:
    """Any JSON object (`response_format: {"type": "json_object"}`)."""
    return Grammar(llama_grammar.JSON_GBNF)


def schema_grammar(schema: Any, param: str) -> Grammar:
    check_schema(schema, param)
    conv = _converter()
    _visit(conv, schema, "", param)
    return Grammar(conv.format_grammar())


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def tool_call_grammar(tools: Sequence[tuple[str, Mapping[str, Any] | None, str]], *,
                      parallel: bool, lazy: bool, open_tag: str, close_tag: str) -> Grammar:
    """One or more (`parallel`) calls of the named tools, each
    `<open>\\n{"name": "<name>", "arguments": <its schema>}\\n<close>`; `lazy`: free text until
    the model writes `open_tag` (tool_choice "auto"). Each tool: (name, its parameters schema,
    the param path of that schema for errors)."""
    conv = _converter()
    alts = []
    for i, (name, schema, at) in enumerate(tools):
        schema = schema if schema is not None else {"type": "object"}
        check_schema(schema, at)
        args = _visit(conv, dict(schema), f"tool-{i}-args", at)
        head = _literal(f'{open_tag}\n{{"name": {json.dumps(name, ensure_ascii=False)}, '
                        '"arguments": ')
        alts.append(f"{head} {args} {_literal('}' + chr(10) + close_tag)}")
    conv._add_rule("tool-call", " | ".join(alts))
    conv._add_rule("root", 'tool-call ("\\n" tool-call)*' if parallel else "tool-call")
    gbnf = conv.format_grammar()
    if not re.search(r"^root ::= ", gbnf, re.M):  # pragma: no cover - the converter's contract
        raise RuntimeError("the tool grammar has no root")
    return Grammar(gbnf, triggers=(open_tag,) if lazy else ())
