"""A JSON schema and tagged spans as a `Grammar`: what every grammar here is built of, below the
tool formats (toolcalls/, which force their calls with `tagged`) and the request's constraints
(structured.py, which re-exports these)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..engines.base import Grammar, StructuralTag
from ..errors import InvalidRequestError, UnsupportedParameterError

__all__ = ["MAX_SCHEMA", "json_object", "schema", "tagged"]

MAX_SCHEMA = 256 * 1024
"""Largest schema (bytes of JSON) compiled at admission."""


def _text(value: Any, param: str) -> str:
    """A schema as JSON text; refuses what is not a schema at all."""
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise InvalidRequestError("a JSON schema must be an object (or true)", param=param,
                                  code="invalid_value")
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise InvalidRequestError(f"the schema is not JSON: {exc}", param=param,
                                  code="invalid_value") from exc
    if len(text.encode()) > MAX_SCHEMA:
        raise UnsupportedParameterError(
            f"this schema is {len(text.encode())} bytes of JSON (at most {MAX_SCHEMA})",
            param=param)
    return text


def schema(value: Any, param: str) -> Grammar:
    """One JSON value valid against `value`."""
    return Grammar(json_schema=_text(value, param), param=param)


def json_object(param: str = "response_format") -> Grammar:
    """Any JSON object (`response_format: {"type": "json_object"}`)."""
    return Grammar(json_schema='{"type": "object"}', param=param)


def tagged(tags: Sequence[tuple[str, Any, str, str]], *, parallel: bool, param: str,
           triggers: tuple[str, ...] = (), separator: str = "\n",
           section: tuple[str, str] = ("", "")) -> Grammar:
    """Tagged spans, each (begin, its schema, the schema's param path, end): exactly one
    (`parallel`: one or more, `separator` apart), inside `section`; `triggers`: lazy, free text
    until one of them (the section's opening, or each tag's begin, starts with one)."""
    return Grammar(tags=tuple(StructuralTag(begin, _text(s, at), end, at)
                              for begin, s, at, end in tags),
                   triggers=triggers, parallel=parallel, param=param, separator=separator,
                   section=section)
