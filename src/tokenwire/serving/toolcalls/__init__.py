"""Tool calls by family: each format in a module of its own, chosen from the model's chat
template (the first whose sign the template holds) or named by a setting (`tool_call_parser`,
vLLM's `--tool-call-parser` names), parsed on the sampled text with the ids kept exact
(parser.py), forced by a grammar where the request requires a call (format.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import regex

from .deepseek import DEEPSEEK_V3, DEEPSEEK_V31
from .format import ToolFormat
from .hermes import HERMES
from .llama3 import LLAMA3_JSON
from .mistral import MISTRAL, MISTRAL_ARGS
from .parser import CallParser, CallPiece, ParsedCall, ParsedDelta, ToolCallParser
from .qwen3_xml import QWEN3_XML

if TYPE_CHECKING:
    from ..template import ChatTemplate

__all__ = ["FORMATS", "HERMES", "PARSERS", "CallParser", "CallPiece", "ParsedCall", "ParsedDelta",
           "ToolCallParser", "ToolFormat", "template_version", "tool_format"]

FORMATS = (DEEPSEEK_V31, DEEPSEEK_V3, MISTRAL_ARGS, MISTRAL, QWEN3_XML, HERMES, LLAMA3_JSON)
"""In the order templates are matched against their signs (the more specific first)."""

PARSERS = tuple(dict.fromkeys(f.name for f in FORMATS))
"""The tool-call parsers there are (vLLM's names)."""


_UNPARSED = [regex.compile(p) for p in (
    r"<arg_key>",  # GLM 4.x: <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>
    r"<tool_call>'\s*[+~]\s*[\w.\[\]'\"]*name",  # the name right after the tag: GLM, Ling, Spark
    r"\byaml object",  # Apriel: YAML inside <tool_call>
    r"<invoke\b|invoke▁",  # MiniMax's and DeepSeek V3.2's <invoke name=...>
)]
"""Signs of formats not parsed here whose templates another's sign would match (most write
`<tool_call>`, as Hermes's do): such a template refuses `tools` unless a parser is named."""


def tool_format(template: str | None, name: str | None = None) -> ToolFormat | None:
    """The format `name`d (for a template of the family, the variant it writes), or the one
    the template writes calls in; None for a template that writes calls in no format here."""
    if name is None and template is not None and any(u.search(template) for u in _UNPARSED):
        return None
    named = [f for f in FORMATS if name is None or f.name == name]
    for f in named:
        if template is not None and f.sign in template:
            return f
    if name is not None:
        return named[-1]  # the family's first variant (Mistral's JSON list)
    return None


def template_version(template: ChatTemplate, fmt: ToolFormat | None = None) -> str:
    """What renders a prompt, hashed: the template, and the tool format used with it (the
    template's own, or the default, Hermes's)."""
    return template.version("template" if template.renders_tools else (fmt or HERMES).source)
