"""Tagged spans (tool calls) in GBNF, for llama-server: the one upstream whose API takes them
only as a grammar (its `json_schema` is for a whole output, and its lazy grammars are GBNF).

Each tag's schema is converted by llama.cpp's own converter (`llama_cpp.llama_grammar`, the
Python twin of the json-schema-to-grammar llama-server runs), with two of its rules corrected:
JSON strings exclude raw control characters, and literals are escaped fully. What it would drop
is refused first (grammar.py `llama_server_drops`, which the twin's missing integer bounds join).
"""

from __future__ import annotations

import json
import re
from typing import Any

from llama_cpp import llama_grammar

from ...errors import UnsupportedParameterError
from ..base import Grammar
from .upstream import check_schema, llama_server_drops

__all__ = ["tags_gbnf"]

_JSON_CHAR = (r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] '
              r'[0-9a-fA-F] [0-9a-fA-F])')
_REFUSALS = (AssertionError, ValueError, KeyError, TypeError, IndexError, RecursionError,
             re.error)
"""How the converter refuses a schema it cannot convert (its asserts, lookups of missing keys, a
pattern it cannot parse, a schema nested too deep)."""


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


def _twin_drops(schema: dict[str, Any], at: str) -> None:
    llama_server_drops(schema, at)
    bounds = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & set(schema)
    if bounds:  # the C++ converter has integer bounds, its Python twin not yet
        key = sorted(bounds)[0]
        raise UnsupportedParameterError(
            f"the JSON schema keyword {key!r} cannot be enforced in llama-server's tool-call "
            "grammar", param=f"{at}.{key}")


def tags_gbnf(grammar: Grammar) -> str:
    """Exactly one tagged span (`parallel`: one or more, `separator` apart) inside the
    `section`, as GBNF's `root`."""
    check_schema(grammar, _twin_drops)
    conv: Any = _Converter()
    alts = []
    for i, tag in enumerate(grammar.tags):
        try:
            schema = conv.resolve_refs(json.loads(tag.schema), "")
            value = conv.visit(schema, f"tag-{i}-value")
        except _REFUSALS as exc:
            raise UnsupportedParameterError(
                f"this schema cannot be turned into llama-server's grammar: {exc}",
                param=tag.param or grammar.param) from exc
        alts.append(f"{conv._format_literal(tag.begin)} {value} "
                    f"{conv._format_literal(tag.end)}")
    conv._add_rule("tagged", " | ".join(alts))
    lit = conv._format_literal
    sep = f"{lit(grammar.separator)} " if grammar.separator else ""
    body = f"tagged ({sep}tagged)*" if grammar.parallel else "tagged"
    opening, closing = grammar.section
    conv._add_rule("root", " ".join(
        p for p in (lit(opening) if opening else "", body, lit(closing) if closing else "") if p))
    return str(conv.format_grammar())
