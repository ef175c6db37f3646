"""JSON schemas -> GBNF grammars, for `response_format` and for tool calls.

The converter is llama.cpp's own (`llama_cpp.llama_grammar.SchemaConverter`, the Python twin
of llama.cpp's json-schema-to-grammar), with two of its rules corrected: JSON strings exclude
raw control characters, and literals (enum values, property names) are escaped fully. It does
not enforce every JSON Schema keyword, and some combinations it silently drops (a keyword beside
`$ref`, `prefixItems` with `items`, a length on an untyped schema). So every schema is first
checked and normalised here: what the grammar enforces passes, annotations are dropped, and
everything else is refused by name (400 naming the keyword and where it is). The output then
parses and validates against the schema every time.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from llama_cpp import llama_grammar

from ..engines.base import Grammar, StructuralTag
from ..errors import InvalidRequestError, UnsupportedParameterError

__all__ = ["check_schema", "json_grammar", "schema_grammar", "tags_grammar", "tool_call_grammar"]

_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly",
})
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_ANY = {"type": list(_TYPES[:3]) + list(_TYPES[3:])}  # any JSON value
_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4",
                      "uuid5"})
_MAX_COUNT = 256
"""Largest length or item count a grammar spells out (each step nests one more rule: llama.cpp's
grammar parser recurses over them)."""
_MAX_GRAMMAR = 256 * 1024
# what each kind of schema may hold beside annotations
_OBJECT = frozenset({"type", "properties", "required", "additionalProperties"})
_ARRAY = frozenset({"type", "items", "minItems", "maxItems"})
_TUPLE = frozenset({"type", "prefixItems"})
_STRING = frozenset({"type", "minLength", "maxLength", "format"})
_JSON_CHAR = (r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] '
              r'[0-9a-fA-F] [0-9a-fA-F])')


def _refuse(keyword: str, at: str, why: str = "") -> UnsupportedParameterError:
    return UnsupportedParameterError(
        f"the JSON schema keyword {keyword!r} cannot be enforced by this server's grammar"
        + (f" ({why})" if why else ""), param=at)


def _invalid(message: str, at: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=at, code="invalid_value")


def _count(schema: dict[str, Any], key: str, at: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _invalid(f"{key!r} must be a non-negative integer", f"{at}.{key}")
    if value > _MAX_COUNT:
        raise _refuse(key, f"{at}.{key}", f"at most {_MAX_COUNT}")
    return value


def _conforms(value: Any, types: list[str]) -> bool:
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool,
             "null": type(None)}
    for t in types:
        if t in kinds and isinstance(value, kinds[t]):
            return True
        if t == "integer" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if t == "number" and isinstance(value, int | float) and not isinstance(value, bool):
            return True
    return False


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _prepare(schema: Any, at: str, defs: set[str]) -> Any:
    """A copy of `schema` the converter enforces exactly (annotations dropped, `true` as any
    value); raises a 400 naming the first keyword it could not enforce."""
    if schema is True:
        return dict(_ANY)
    if schema is False:
        raise UnsupportedParameterError("a schema of `false` admits no document", param=at)
    if not isinstance(schema, dict):
        raise _invalid("a JSON schema must be an object or a boolean", at)
    s = {k: v for k, v in schema.items() if k not in _ANNOTATIONS and k not in (
        "$defs", "definitions")}
    if "$ref" in s:
        ref = s.pop("$ref")
        if s:
            raise _refuse(next(iter(s)), f"{at}.{next(iter(s))}", "beside $ref")
        m = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", ref) if isinstance(ref, str) \
            else None
        if m is None:
            raise _refuse("$ref", f"{at}.$ref", "only '#/$defs/<name>' references")
        if m.group(2) not in defs:
            raise _invalid(f"$ref {ref!r} names no definition", f"{at}.$ref")
        return {"$ref": ref}
    for key in ("oneOf", "allOf"):
        if key in s:
            alts = s.pop(key)
            if not isinstance(alts, list) or len(alts) != 1:
                raise _refuse(key, f"{at}.{key}", "only with one subschema; use anyOf")
            if s:
                raise _refuse(next(iter(s)), f"{at}.{next(iter(s))}", f"beside {key}")
            return _prepare(alts[0], f"{at}.{key}[0]", defs)
    if "anyOf" in s:
        alts = s.pop("anyOf")
        if s:
            raise _refuse(next(iter(s)), f"{at}.{next(iter(s))}", "beside anyOf")
        if not isinstance(alts, list) or not alts:
            raise _invalid("'anyOf' must be a non-empty array", f"{at}.anyOf")
        return {"anyOf": [_prepare(a, f"{at}.anyOf[{i}]", defs) for i, a in enumerate(alts)]}
    types = s.get("type")
    if types is not None:
        listed = types if isinstance(types, list) else [types]
        if not listed or not all(isinstance(t, str) and t in _TYPES for t in listed):
            raise _invalid("'type' must be one of " + ", ".join(_TYPES) + " or a non-empty "
                           "array of them", f"{at}.type")
        types = listed
    for key in ("enum", "const"):
        if key in s:
            values = s[key] if key == "enum" else [s[key]]
            if key == "enum" and (not isinstance(values, list) or not values):
                raise _invalid("'enum' must be a non-empty array", f"{at}.enum")
            if not _finite(values):
                raise _invalid("values must be finite JSON numbers", f"{at}.{key}")
            rest = set(s) - {key, "type"}
            if rest:
                raise _refuse(sorted(rest)[0], f"{at}.{sorted(rest)[0]}", f"beside {key}")
            if types is not None and not all(_conforms(v, types) for v in values):
                raise _invalid(f"a {key} value is not of the schema's type", f"{at}.{key}")
            return {key: s[key]}
    kinds = set(types or [])
    if "prefixItems" in s:
        allowed, kinds = _TUPLE, kinds or {"array"}
    elif {"items", "minItems", "maxItems"} & set(s):
        allowed, kinds = _ARRAY, kinds or {"array"}
    elif {"properties", "required", "additionalProperties"} & set(s):
        allowed, kinds = _OBJECT, kinds or {"object"}
    elif {"minLength", "maxLength", "format"} & set(s):
        allowed, kinds = _STRING, kinds or {"string"}
    else:
        allowed = frozenset({"type"})
    plain = allowed == frozenset({"type"})
    for key in s:
        if key not in allowed:
            why = "" if key in _OBJECT | _ARRAY | _STRING | _TUPLE else "not supported"
            raise _refuse(key, f"{at}.{key}", why or "not in this combination")
    if not plain and len(kinds) != 1:
        raise _refuse("type", f"{at}.type", "one type with these keywords")
    out: dict[str, Any]
    if plain:
        out = dict(_ANY) if types is None else {"type": types if len(types) > 1 else types[0]}
    else:
        out = {"type": next(iter(kinds))}
    if allowed is _STRING:
        lo, hi = _count(s, "minLength", at), _count(s, "maxLength", at)
        if "format" in s:
            if lo is not None or hi is not None:
                raise _refuse("minLength" if lo is not None else "maxLength", at,
                              "beside format")
            if not isinstance(s["format"], str) or s["format"] not in _FORMATS:
                raise _refuse("format", f"{at}.format",
                              "supported: " + ", ".join(sorted(_FORMATS)))
            out["format"] = s["format"]
        if lo is not None and hi is not None and lo > hi:
            raise _invalid("minLength is above maxLength", f"{at}.minLength")
        out.update({k: s[k] for k in ("minLength", "maxLength") if k in s})
    elif allowed is _ARRAY:
        lo, hi = _count(s, "minItems", at), _count(s, "maxItems", at)
        if lo is not None and hi is not None and lo > hi:
            raise _invalid("minItems is above maxItems", f"{at}.minItems")
        out["items"] = _prepare(s.get("items", True), f"{at}.items", defs)
        out.update({k: s[k] for k in ("minItems", "maxItems") if k in s})
    elif allowed is _TUPLE:
        items = s["prefixItems"]
        if not isinstance(items, list) or not items:
            raise _invalid("'prefixItems' must be a non-empty array", f"{at}.prefixItems")
        out["prefixItems"] = [_prepare(x, f"{at}.prefixItems[{i}]", defs)
                              for i, x in enumerate(items)]
    elif allowed is _OBJECT:
        props = s.get("properties", {})
        if not isinstance(props, dict):
            raise _invalid("'properties' must be an object", f"{at}.properties")
        out["properties"] = {k: _prepare(v, f"{at}.properties.{k}", defs)
                             for k, v in props.items()}
        required = s.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise _invalid("'required' must be an array of strings", f"{at}.required")
        missing = [r for r in required if r not in props]
        if missing:
            raise _refuse("required", f"{at}.required",
                          f"{missing[0]!r} is not among the properties")
        out["required"] = required
        extra = s.get("additionalProperties", True)
        if not isinstance(extra, bool):
            raise _refuse("additionalProperties", f"{at}.additionalProperties",
                          "only true or false")
        # with properties, the grammar writes only those: the converter's extra keys could
        # repeat a property's name with a value of another shape
        out["additionalProperties"] = extra and not props
    return out


def _defs(schema: Any) -> dict[str, Any]:
    if not isinstance(schema, dict):
        return {}
    found: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        table = schema.get(key)
        if table is None:
            continue
        if not isinstance(table, dict):
            raise _invalid(f"{key!r} must be an object", key)
        found.update({name: (key, sub) for name, sub in table.items()})
    return found


def _refs(schema: Any) -> set[str]:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        out = {ref.rsplit("/", 1)[1]} if isinstance(ref, str) else set()
        for v in schema.values():
            out |= _refs(v)
        return out
    if isinstance(schema, list):
        return set().union(*(_refs(v) for v in schema)) if schema else set()
    return set()


def check_schema(schema: Any, param: str, *, prefix: str = "") -> Any:
    """The schema, normalised for the converter (its definitions renamed with `prefix`, so
    several tools' schemas can share one grammar); refuses (400, naming the keyword and where
    it is) what the grammar cannot enforce exactly."""
    table = _defs(schema)
    names = set(table)
    prepared = {name: _prepare(sub, f"{param}.{key}.{name}", names)
                for name, (key, sub) in table.items()}
    root = _prepare(schema, param, names)
    # recursive schemas: the converter's rules would recurse without consuming text
    graph = {name: _refs(sub) for name, sub in prepared.items()}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            n = todo.pop()
            if n == start:
                key = table[start][0]
                raise _refuse("$ref", f"{param}.{key}.{start}", "recursive definitions")
            if n not in seen:
                seen.add(n)
                todo += graph.get(n, ())
    return _rename({**root, "$defs": prepared} if prepared else root, prefix)


def _rename(schema: Any, prefix: str) -> Any:
    if isinstance(schema, list):
        return [_rename(v, prefix) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "$ref":
            out[k] = "#/$defs/" + prefix + v.rsplit("/", 1)[1]
        elif k == "$defs":
            out[k] = {prefix + name: _rename(sub, prefix) for name, sub in v.items()}
        elif k in ("properties",):
            out[k] = {name: _rename(sub, prefix) for name, sub in v.items()}
        else:
            out[k] = _rename(v, prefix)
    return out


class _Converter(llama_grammar.SchemaConverter):
    """llama.cpp's converter, with JSON strings and literals as JSON defines them."""

    def __init__(self) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False,  # type: ignore[no-untyped-call]
                         raw_pattern=False)

    def _format_literal(self, literal: str) -> str:
        out = []
        for c in literal:
            if c in '"\\':
                out.append("\\" + c)
            elif c == "\n":
                out.append("\\n")
            elif c == "\r":
                out.append("\\r")
            elif c == "\t":
                out.append("\\t")
            elif ord(c) < 0x20 or ord(c) == 0x7F:
                out.append(f"\\x{ord(c):02X}")
            else:
                out.append(c)
        return '"' + "".join(out) + '"'

    def _add_primitive(self, name: str, rule: Any) -> str:
        if name == "char":
            rule = llama_grammar.BuiltinRule(_JSON_CHAR, [])
        return str(super()._add_primitive(name, rule))


_REFUSALS = (AssertionError, ValueError, KeyError, TypeError, IndexError, RecursionError,
             re.error)
"""How llama.cpp's schema converter refuses a schema it cannot convert (its asserts, lookups
of missing keys, a pattern it cannot parse, a schema nested too deep); anything else is a bug
here, not the client's schema."""


def _visit(conv: Any, schema: Any, name: str, param: str) -> str:
    try:
        resolved = conv.resolve_refs(schema, "")
        return str(conv.visit(resolved, name))
    except _REFUSALS as exc:
        raise UnsupportedParameterError(f"this schema cannot be turned into a grammar: {exc}",
                                        param=param) from exc


def _grammar(conv: Any, param: str, **kw: Any) -> Grammar:
    gbnf = str(conv.format_grammar())
    if len(gbnf) > _MAX_GRAMMAR:
        raise UnsupportedParameterError(
            f"this schema makes a grammar of {len(gbnf)} bytes (at most {_MAX_GRAMMAR})",
            param=param)
    return Grammar(gbnf, param=param, **kw)


def json_grammar() -> Grammar:
    """Any JSON object (`response_format: {"type": "json_object"}`)."""
    return Grammar(llama_grammar.JSON_GBNF, param="response_format",
                   json_schema=json.dumps({"type": "object"}))


def schema_grammar(schema: Any, param: str) -> Grammar:
    conv: Any = _Converter()
    _visit(conv, check_schema(schema, param), "", param)
    return _grammar(conv, param, json_schema=json.dumps(schema, ensure_ascii=False))


def tool_call_grammar(tools: Sequence[tuple[str, Mapping[str, Any] | None, str]], *,
                      parallel: bool, lazy: bool, open_tag: str, close_tag: str) -> Grammar:
    """One or more (`parallel`) calls of the named tools, each
    `<open>\\n{"name": "<name>", "arguments": <its schema>}\\n<close>`; `lazy`: free text until
    the model writes `open_tag` (tool_choice "auto"). Each tool: (name, its parameters schema,
    the param path of that schema for errors)."""
    tags = []
    for name, schema, at in tools:
        schema = schema if schema is not None else {"type": "object"}
        tags.append((StructuralTag(
            begin=f'{open_tag}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": ',
            schema=json.dumps(schema, ensure_ascii=False), end="}\n" + close_tag), at))
    return tags_grammar(tags, parallel=parallel, param="tools",
                        triggers=(open_tag,) if lazy else ())


def tags_grammar(tags: Sequence[tuple[StructuralTag, str]], *, parallel: bool, param: str,
                 triggers: tuple[str, ...] = ()) -> Grammar:
    """Exactly one tagged span (`parallel`: one or more, a newline apart), each `begin`, a
    value valid against its schema, `end`; (tag, the param path of its schema). `triggers`:
    a lazy grammar, free text until one of them (which the tags then carry too)."""
    conv: Any = _Converter()
    alts = []
    for i, (tag, at) in enumerate(tags):
        schema = check_schema(json.loads(tag.schema), at, prefix=f"t{i}-")
        value = _visit(conv, schema, f"tag-{i}-value", at)
        alts.append(f"{conv._format_literal(tag.begin)} {value} "
                    f"{conv._format_literal(tag.end)}")
    conv._add_rule("tagged", " | ".join(alts))
    conv._add_rule("root", 'tagged ("\\n" tagged)*' if parallel else "tagged")
    return _grammar(conv, param, triggers=triggers,
                    tags=tuple(t for t, _ in tags) if triggers else ())
