"""What a request asks of decoding, as a `Grammar` in the request's own terms: a JSON schema
(`response_format`, vLLM's `structured_outputs.json`), any JSON object, a client's GBNF, or tool
calls as tagged spans; and, for chat, whether tool calls are parsed out of the output.

Nothing here converts a schema: the engine's grammar library enforces it (the embedded engine's
llguidance, an upstream's own backend: engines/grammars/guide.py, engines/grammars/upstream.py), and
refuses by name and place what it cannot. Here only what no engine could read is refused: a
schema that is not a JSON object (or `true`), or one too large to compile at admission.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..engines.base import EngineInfo, Grammar
from ..errors import InvalidRequestError, UnsupportedParameterError
from ..protocol.chat import ChatCompletionRequest
from ..protocol.tools import JsonObjectFormat, JsonSchemaFormat, NamedToolChoice
from ._grammars import json_object, schema, tagged
from .toolcalls import PARSERS, ToolFormat

__all__ = ["Constraints", "from_structural_tag", "json_object", "resolve_constraints", "schema",
           "tagged"]

def _invalid(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code="invalid_value")


def _format_tags(fmt: dict[str, Any], param: str) -> list[tuple[str, Any, str, str]]:
    tags = fmt.get("tags")
    if not isinstance(tags, list) or not tags:
        raise _invalid("tags must be a non-empty list", f"{param}.tags")
    out = []
    for i, t in enumerate(tags):
        at = f"{param}.tags[{i}]"
        content = t.get("content") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "tag") != "tag" \
                or not isinstance(t.get("begin"), str) or not isinstance(t.get("end"), str) \
                or not isinstance(content, dict) or content.get("type") != "json_schema":
            raise UnsupportedParameterError(
                "only tags {type: tag, begin, content: {type: json_schema, json_schema}, end} "
                "are supported", param=at)
        out.append((t["begin"], content.get("json_schema", {}),
                    f"{at}.content.json_schema", t["end"]))
    return out


def from_structural_tag(tag: Any, param: str) -> Grammar:
    """vLLM's `structural_tag` (as vLLM and SGLang read it, and as a gateway's upstream
    adapters send it): the legacy shape (free text until a trigger, then the structures, a
    newline apart: tokenwire allows only further structures after the first; docs/api/chat.md), or
    xgrammar's `format` shape as far as tool calls use it: `triggered_tags` (lazy) and
    `tags_with_separator` with separator "\\n" and `at_least_one` (from the first token)."""
    if not isinstance(tag, dict):
        raise _invalid("structural_tag must be an object", param)
    fmt = tag.get("format")
    if isinstance(fmt, dict):
        at = f"{param}.format"
        kind = fmt.get("type")
        calls = _calls(fmt, at, param)
        if calls is not None:
            return calls
        if kind == "triggered_tags" and not fmt.get("excludes") \
                and not fmt.get("at_least_one"):
            triggers = fmt.get("triggers")
            if not isinstance(triggers, list) or not triggers \
                    or not all(isinstance(w, str) and w for w in triggers):
                raise _invalid("triggers must be a non-empty list of strings",
                               f"{at}.triggers")
            inner = fmt.get("tags")
            section = _calls(inner[0], f"{at}.tags[0]", param) \
                if isinstance(inner, list) and len(inner) == 1 and isinstance(inner[0], dict) \
                and inner[0].get("type") == "tag" else None
            if section is not None:  # the calls' section, opened by a trigger
                if not all(section.section[0].startswith(w) for w in triggers):
                    raise _invalid("each trigger must begin the section", f"{at}.triggers")
                return replace(section, triggers=tuple(triggers))
            if fmt.get("stop_after_first"):
                raise UnsupportedParameterError(
                    "triggered_tags with stop_after_first is supported around one section tag "
                    "only", param=f"{at}.stop_after_first")
            return _lazy(_format_tags(fmt, at), triggers, param, f"{at}.tags")
        raise UnsupportedParameterError(
            "of xgrammar's formats, only tags_with_separator (at_least_one), a tag around one, "
            "and triggered_tags are supported", param=at)
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not structures or not all(
            isinstance(s, dict) and isinstance(s.get("begin"), str)
            and isinstance(s.get("end"), str) for s in structures) \
            or not isinstance(triggers, list) or not triggers \
            or not all(isinstance(t, str) and t for t in triggers):
        raise _invalid("structural_tag needs structures [{begin, schema, end}] and triggers "
                       "[strings], or a format", param)
    return _lazy([(s["begin"], s.get("schema", {}), f"{param}.structures[{i}].schema",
                   s["end"]) for i, s in enumerate(structures)],
                 triggers, param, f"{param}.structures")


def _calls(fmt: dict[str, Any], at: str, param: str) -> Grammar | None:
    """xgrammar's `tags_with_separator` (at least one), alone or as the content of a `tag` (the
    calls' section); None for other shapes."""
    section = ("", "")
    if fmt.get("type") == "tag" and isinstance(fmt.get("content"), dict) \
            and isinstance(fmt.get("begin"), str) and isinstance(fmt.get("end"), str):
        section, fmt, at = (fmt["begin"], fmt["end"]), fmt["content"], f"{at}.content"
    if fmt.get("type") != "tags_with_separator" or fmt.get("at_least_one") is not True:
        return None
    separator = fmt.get("separator", "")
    if not isinstance(separator, str):
        raise _invalid("separator must be a string", f"{at}.separator")
    return tagged(_format_tags(fmt, at), parallel=not fmt.get("stop_after_first"), param=param,
                  separator=separator, section=section)


def _lazy(tags: list[tuple[str, Any, str, str]], triggers: list[str], param: str,
          where: str) -> Grammar:
    for i, (begin, _, _, _) in enumerate(tags):
        if not any(begin.startswith(w) for w in triggers):
            raise _invalid("each structure's begin must start with a trigger",
                           f"{where}[{i}].begin")
    for k, word in enumerate(triggers):
        if not any(begin.startswith(word) for begin, _, _, _ in tags):
            raise _invalid("each trigger must begin a structure", f"{param}.triggers[{k}]"
                           if where.endswith(".structures") else f"{param}.format.triggers[{k}]")
    return tagged(tags, parallel=True, param=param, triggers=tuple(triggers))


@dataclass(frozen=True)
class Constraints:
    grammar: Grammar | None = None
    parse_tools: bool = False
    """Tool calls are parsed out of the output (tool_choice other than "none")."""
    named: bool = False
    """A named tool_choice: the finish reason stays "stop", as OpenAI's."""
    unconstrained: bool = False
    """tool_choice "auto" on an engine without lazy grammars: calls are parsed, not enforced
    (the response says so in a warning)."""


def _choice(req: ChatCompletionRequest) -> str | NamedToolChoice:
    if req.tool_choice is None:
        return "auto" if req.tools else "none"
    if not req.tools and req.tool_choice != "none":
        raise InvalidRequestError("tool_choice needs tools", param="tool_choice",
                                  code="invalid_value")
    return req.tool_choice


def resolve_constraints(req: ChatCompletionRequest, info: EngineInfo, model: str,
                        calls: ToolFormat | None = None) -> Constraints:
    """`calls`: the model's tool-call format (None: its template writes calls in a format no
    parser here reads, so tools are refused)."""
    tools = req.tools or []
    choice = _choice(req)
    fmt = req.response_format
    wants_json = isinstance(fmt, JsonObjectFormat | JsonSchemaFormat)
    if wants_json and choice != "none":
        raise UnsupportedParameterError(
            "response_format json_object/json_schema cannot be combined with tool calls "
            "(set tool_choice to 'none', or leave out tools)", param="response_format")
    if wants_json:
        if not info.supports_grammar:
            raise UnsupportedParameterError(
                f"model {model!r} cannot constrain its output (its engine has no grammar "
                "support)", param="response_format")
        if isinstance(fmt, JsonSchemaFormat):
            given = fmt.json_schema.schema_
            return Constraints(grammar=schema(given if given is not None else {},
                                              "response_format.json_schema.schema"))
        return Constraints(grammar=json_object())
    if choice == "none":
        return Constraints()
    if calls is None:
        raise UnsupportedParameterError(
            f"model {model!r}'s chat template writes tool calls in a format tokenwire does not "
            f"parse (its parsers: {', '.join(PARSERS)}; the server's tool_call_parser setting "
            "names one); tool_choice 'none' renders the tools without parsing calls, as vLLM "
            "does without a tool parser", param="tools")
    specs = [(t.function.name, t.function.parameters, f"tools[{i}].function.parameters")
             for i, t in enumerate(tools)]
    if isinstance(choice, NamedToolChoice):
        names = [n for n, _, _ in specs]
        if choice.function.name not in names:
            raise InvalidRequestError(
                f"tool_choice names {choice.function.name!r}, which is not among the tools",
                param="tool_choice.function.name", code="invalid_value")
        k = names.index(choice.function.name)
        specs, parallel = [specs[k]], False
    else:
        parallel = req.parallel_tool_calls
    if choice == "auto":
        if not info.supports_lazy_grammar:
            # the model may still call: its output is parsed, unconstrained (docs/api/chat.md)
            return Constraints(parse_tools=True, unconstrained=True)
        # a format whose calls have no lazy grammar (Qwen's XML) is parsed, not enforced
        lazy = calls.grammar(specs, parallel=parallel, lazy=True)
        return Constraints(grammar=lazy, parse_tools=True, unconstrained=lazy is None)
    if not info.supports_grammar:
        raise UnsupportedParameterError(
            f"model {model!r} cannot guarantee a tool call (its engine has no grammar "
            "support); use tool_choice 'auto'", param="tool_choice")
    return Constraints(grammar=calls.grammar(specs, parallel=parallel, lazy=False),
                       parse_tools=True, named=isinstance(choice, NamedToolChoice))
