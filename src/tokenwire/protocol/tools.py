"""Wire models of function calling and structured output (OpenAI's shapes)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from ._base import RequestModel, ResponseModel

__all__ = [
    "DeltaFunction",
    "DeltaToolCall",
    "FunctionCall",
    "FunctionDefinition",
    "JsonObjectFormat",
    "JsonSchemaFormat",
    "JsonSchemaSpec",
    "NamedToolChoice",
    "ResponseFormat",
    "ResponseFunction",
    "ResponseToolCall",
    "TextFormat",
    "Tool",
    "ToolCall",
    "ToolChoice",
]

# OpenAI's rule for function names
FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class FunctionDefinition(RequestModel):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON schema of the arguments object; absent: any object."""
    strict: bool | None = None
    """Accepted: with a `required` or named tool_choice the arguments always follow the
    schema; with `auto` too, once the model opens a call (a lazy grammar)."""


class Tool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class _NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: _NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(RequestModel):
    name: str
    arguments: str
    """The arguments as a JSON text, exactly as sampled (OpenAI's shape)."""


class ToolCall(RequestModel):
    """An assistant message's call (request side, as a client sends history back)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TextFormat(RequestModel):
    type: Literal["text"]


class JsonObjectFormat(RequestModel):
    type: Literal["json_object"]


class JsonSchemaSpec(RequestModel):
    name: str
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class JsonSchemaFormat(RequestModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


def _format_tag(v: Any) -> str | None:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return f"~{kind}" if kind in ("text", "json_object", "json_schema") else None


ResponseFormat = Annotated[
    Annotated[TextFormat, Tag("~text")] | Annotated[JsonObjectFormat, Tag("~json_object")]
    | Annotated[JsonSchemaFormat, Tag("~json_schema")],
    Discriminator(
        _format_tag, custom_error_type="invalid_response_format",
        custom_error_message="response_format.type must be 'text', 'json_object' or "
                             "'json_schema'"),
]


# -- responses --------------------------------------------------------------------------------


class ResponseFunction(ResponseModel):
    name: str
    arguments: str


class ResponseToolCall(ResponseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunction


class DeltaFunction(ResponseModel):
    omit_if_none = frozenset({"name", "arguments"})
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(ResponseModel):
    """A piece of a streamed call: the first piece has `id`, `type` and `function.name`, the
    next ones pieces of `function.arguments`, as OpenAI streams them."""

    omit_if_none = frozenset({"id", "type"})
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction

