"""What a chat request's `tools`, `tool_choice` and `response_format` ask of decoding: the
grammar to run (if any) and whether tool calls are parsed out of the output."""

from __future__ import annotations

from dataclasses import dataclass

from ..engines.base import EngineInfo, Grammar
from ..errors import InvalidRequestError, UnsupportedParameterError
from ..protocol.chat import ChatCompletionRequest
from ..protocol.tools import JsonObjectFormat, JsonSchemaFormat, NamedToolChoice
from .grammar import json_grammar, schema_grammar, tool_call_grammar
from .toolformat import HERMES

__all__ = ["Constraints", "resolve_constraints"]


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


def resolve_constraints(req: ChatCompletionRequest, info: EngineInfo, model: str
                        ) -> Constraints:
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
            schema = fmt.json_schema.schema_
            grammar = schema_grammar(schema if schema is not None else {},
                                     "response_format.json_schema.schema")
        else:
            grammar = json_grammar()
        return Constraints(grammar=grammar)
    if choice == "none":
        return Constraints()
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
            # the model may still call: its output is parsed, unconstrained (docs/api.md)
            return Constraints(parse_tools=True, unconstrained=True)
        grammar = tool_call_grammar(specs, parallel=parallel, lazy=True,
                                    open_tag=HERMES.open_tag, close_tag=HERMES.close_tag)
        return Constraints(grammar=grammar, parse_tools=True)
    if not info.supports_grammar:
        raise UnsupportedParameterError(
            f"model {model!r} cannot guarantee a tool call (its engine has no grammar "
            "support); use tool_choice 'auto'", param="tool_choice")
    grammar = tool_call_grammar(specs, parallel=parallel, lazy=False,
                                open_tag=HERMES.open_tag, close_tag=HERMES.close_tag)
    return Constraints(grammar=grammar, parse_tools=True,
                       named=isinstance(choice, NamedToolChoice))
