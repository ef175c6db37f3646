"""Grammars in the upstreams' own terms, so that each upstream's grammar backend enforces them:
a JSON schema as itself, tagged spans (tool calls) as a `structural_tag` (vLLM, SGLang: both
compile it with xgrammar: engines/grammars/xgrammar.py), and the keywords a backend would silently
drop refused by name and place (an upstream that refuses a schema itself, as vLLM does,
answers with its own 400).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ...errors import UnsupportedParameterError
from ..base import Grammar

__all__ = ["LLAMA_SERVER_KEYWORDS", "check_schema", "client_param", "llama_server_drops",
           "vllm_drops", "xgrammar_drops"]

_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$anchor", "discriminator",
})
LLAMA_SERVER_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "enum", "const",
    "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum",
}) | _ANNOTATIONS
"""What llama.cpp's json-schema-to-grammar (llama-server's `json_schema`) turns into grammar
rules (common/json-schema-to-grammar.cpp); any other keyword it drops without a word. Its
`oneOf` is an `anyOf`, and its numeric bounds hold for integers only: both checked below."""
MAX_COUNT = 256
"""Largest length or item count llama.cpp's converter may spell out (a `maxLength` of 20000
crashes its grammar parser)."""
_SCHEMAS_IN = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then",
               "else")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def _walk(schema: Any, at: str, visit: Callable[[dict[str, Any], str], None]) -> None:
    """Call `visit` on every subschema (dicts), with its dotted path."""
    if not isinstance(schema, dict):
        return
    visit(schema, at)
    for key in _SCHEMAS_IN:
        if key in schema:
            _walk(schema[key], f"{at}.{key}", visit)
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                _walk(sub, f"{at}.{key}[{i}]", visit)
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                _walk(sub, f"{at}.{key}.{name}", visit)


def _refuse(key: str, at: str, upstream: str, why: str = "") -> UnsupportedParameterError:
    return UnsupportedParameterError(
        f"the JSON schema keyword {key!r} cannot be enforced by {upstream}'s grammar"
        + (f" ({why})" if why else ""), param=f"{at}.{key}")


def _types(schema: dict[str, Any]) -> set[str]:
    t = schema.get("type")
    return {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()


def llama_server_drops(schema: dict[str, Any], at: str) -> None:
    """Refuse what llama-server's converter would drop (LLAMA_SERVER_KEYWORDS), and counts it
    would spell out past what its grammar parser survives."""
    for key in schema:
        if key not in LLAMA_SERVER_KEYWORDS and not key.startswith("x-"):  # (extensions
            raise _refuse(key, at, "llama-server")                        # constrain nothing)
    for key in ("minLength", "maxLength", "minItems", "maxItems"):
        if isinstance(schema.get(key), int) and schema[key] > MAX_COUNT:
            raise _refuse(key, at, "llama-server", f"at most {MAX_COUNT}: each step is one "
                          "more nested rule, which llama.cpp's grammar parser recurses over")
    if "oneOf" in schema and len(schema["oneOf"]) > 1:
        raise _refuse("oneOf", at, "llama-server", "it reads oneOf as anyOf; use anyOf")
    bounds = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & set(schema)
    if bounds and _types(schema) != {"integer"}:
        raise _refuse(sorted(bounds)[0], at, "llama-server", "bounds hold for integers only")


def xgrammar_drops(schema: dict[str, Any], at: str) -> None:
    """Refuse what xgrammar would drop (SGLang's grammar backend): vLLM's own list of it
    (vllm/v1/structured_output/backend_xgrammar.py `has_xgrammar_unsupported_json_features`,
    which sends those schemas to llguidance instead; SGLang has no such fallback)."""
    types = _types(schema)
    if types & {"integer", "number"} and "multipleOf" in schema:
        raise _refuse("multipleOf", at, "SGLang")
    if "array" in types:
        for key in ("uniqueItems", "contains", "minContains", "maxContains"):
            if key in schema:
                raise _refuse(key, at, "SGLang")
    if "string" in types and ({"pattern", "format"} & set(schema)) \
            and ({"minLength", "maxLength"} & set(schema)):
        raise _refuse("minLength" if "minLength" in schema else "maxLength", at, "SGLang",
                      "beside pattern or format")
    if "object" in types:
        for key in ("propertyNames", "patternProperties", "minProperties", "maxProperties"):
            if key in schema:
                raise _refuse(key, at, "SGLang")
    for key in _XGRAMMAR_SKIPS:
        if key in schema:
            raise _refuse(key, at, "SGLang")


_XGRAMMAR_SKIPS = ("not", "if", "then", "else", "dependentRequired", "dependentSchemas",
                   "unevaluatedProperties", "unevaluatedItems")
"""Keywords xgrammar's schema converter skips without a word, which vLLM's routing to llguidance
(`has_xgrammar_unsupported_json_features`) does not catch: real vLLM 0.32 answers a schema with
`not` and ignores it (tests/e2e/test_structured.py)."""


def vllm_drops(schema: dict[str, Any], at: str) -> None:
    """Refuse what vLLM would take and drop (what it refuses, it answers with its own 400)."""
    for key in _XGRAMMAR_SKIPS:
        if key in schema:
            raise _refuse(key, at, "vLLM")


def check_schema(grammar: Grammar, drops: Callable[[dict[str, Any], str], None]) -> None:
    """Every schema of `grammar` through a backend's `drops` check."""
    if grammar.json_schema is not None:
        _walk(json.loads(grammar.json_schema), grammar.param, drops)
    for tag in grammar.tags:
        _walk(json.loads(tag.schema), tag.param or grammar.param, drops)


_SENT_AS = re.compile(r"^(?:sampling_params\.)?structured_outputs\.(?:json(?![\w])|structural_tag\."
                      r"(?:format\.tags|structures)\[(\d+)\](?:\.content\.json_schema|\.schema))")


def client_param(param: str, grammar: Grammar) -> str:
    """An upstream's 400 names the field we sent (a tokenwire upstream names the schema's
    keyword under `sampling_params.structured_outputs...`): the client's own field instead."""
    sent = _SENT_AS.match(param)
    if sent is None:
        return param
    tag = int(sent.group(1)) if sent.group(1) is not None else None
    field = grammar.param if tag is None or tag >= len(grammar.tags) \
        else grammar.tags[tag].param or grammar.param
    return field + param[sent.end():]
