"""Wire models of Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`),
plus the token-native fields.

Written from the `anthropic` SDK 2.17's types and vLLM 0.32's `entrypoints/anthropic/protocol.py`.
What is token-native, and only there when asked (a plain request gets a plain response):
- in: a `{"type": "token_ids", "token_ids": [...]}` content block (in `system`, user content and
  `tool_result.content`; not `input_tokens`, which `usage.input_tokens` would shadow), and
  `token_ids` on an assistant turn's `text` / `tool_use` blocks as a response returned them;
- out: `token_ids` on every content block and every delta, the versions on the message.
Never on `content_block_start`'s block: the SDK's stream accumulator copies that block and
never appends a delta's extras, so a message rebuilt from a stream would carry `token_ids: []`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Discriminator, Field, RootModel, Tag

from ._base import RequestModel, ResponseModel
from .common import Ids, IdsEncoding, ResponseWarning, TokenIds, WeightVersionSpan
from .sampling import WeightBoundFields

__all__ = [
    "ERROR_TYPES",
    "AnthropicError",
    "AnthropicErrorBody",
    "AnthropicMessage",
    "AnthropicTool",
    "AnthropicUsage",
    "ContentBlockDeltaEvent",
    "ContentBlockStartEvent",
    "ContentBlockStopEvent",
    "CountTokensRequest",
    "CountTokensResponse",
    "DeltaUsage",
    "InputJsonDelta",
    "Message",
    "MessageDelta",
    "MessageDeltaEvent",
    "MessageEvent",
    "MessageStartEvent",
    "MessageStopEvent",
    "MessageStreamEvent",
    "MessagesRequest",
    "PingEvent",
    "ServerTool",
    "StopReason",
    "TextContent",
    "TextDelta",
    "TextParam",
    "TokenIdsParam",
    "ToolResultParam",
    "ToolUseContent",
    "ToolUseParam",
]


# -- request ----------------------------------------------------------------------------------

# Union tags start with "~" so that error locations can drop them (see api/validation.py).


def _content_tag(v: Any) -> str | None:
    return "~str" if isinstance(v, str) else "~list" if isinstance(v, list) else None


def _str_or_list(block: Any) -> Any:
    """A string, or an array of `block`s."""
    return Annotated[
        Annotated[str, Tag("~str")] | Annotated[list[block], Tag("~list")],
        Discriminator(_content_tag, custom_error_type="invalid_content",
                      custom_error_message="content must be a string or an array of content "
                                           "blocks"),
    ]


class TextParam(RequestModel):
    type: Literal["text"]
    text: str
    token_ids: TokenIds | None = None
    """Assistant turns only: the ids a response returned for this block, used verbatim."""
    cache_control: dict[str, Any] | None = None
    """Accepted: the prefix cache finds repeated prompts by itself."""
    citations: list[Any] | None = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {"citations": (None, [])}


class TokenIdsParam(RequestModel):
    """Token ids spliced into the prompt as they are: never decoded and re-encoded."""

    type: Literal["token_ids"]
    token_ids: TokenIds
    cache_control: dict[str, Any] | None = None


class ToolUseParam(RequestModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    token_ids: TokenIds | None = None
    """As a response returned them: the call's ids (its syntax included), used verbatim."""
    cache_control: dict[str, Any] | None = None
    caller: dict[str, Any] | None = None
    toolset_name: str | None = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {
        "caller": (None, {"type": "direct"}), "toolset_name": (None,)}


def _result_tag(v: Any) -> str | None:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return f"~{kind}" if kind in ("text", "token_ids") else None


ResultBlock = Annotated[
    Annotated[TextParam, Tag("~text")] | Annotated[TokenIdsParam, Tag("~token_ids")],
    Discriminator(_result_tag, custom_error_type="invalid_content_block",
                  custom_error_message="tool_result content blocks must have type 'text' or "
                                       "'token_ids'"),
]


class ToolResultParam(RequestModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: _str_or_list(ResultBlock) | None = None  # type: ignore[valid-type]
    is_error: bool | None = None
    """Rendered as the result's text says it; the chat template has no field for it."""
    cache_control: dict[str, Any] | None = None
    toolset_name: str | None = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {"toolset_name": (None,)}


def _block_tag(v: Any) -> str | None:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return f"~{kind}" if kind in ("text", "token_ids", "tool_use", "tool_result") else None


InputBlock = Annotated[
    Annotated[TextParam, Tag("~text")] | Annotated[TokenIdsParam, Tag("~token_ids")]
    | Annotated[ToolUseParam, Tag("~tool_use")] | Annotated[ToolResultParam, Tag("~tool_result")],
    Discriminator(_block_tag, custom_error_type="invalid_content_block",
                  custom_error_message="content blocks must have type 'text', 'token_ids', "
                                       "'tool_use' or 'tool_result' (this server reads no "
                                       "images, documents or thinking blocks)"),
]

SystemBlock = Annotated[
    Annotated[TextParam, Tag("~text")] | Annotated[TokenIdsParam, Tag("~token_ids")],
    Discriminator(_result_tag, custom_error_type="invalid_content_block",
                  custom_error_message="system blocks must have type 'text' or 'token_ids'"),
]


class AnthropicMessage(RequestModel):
    role: Literal["user", "assistant"]
    content: _str_or_list(InputBlock)  # type: ignore[valid-type]


class AnthropicTool(RequestModel):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")]
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    strict: bool | None = None
    """Accepted: a forced call's input always follows `input_schema` here."""
    cache_control: dict[str, Any] | None = None
    eager_input_streaming: bool | None = None
    """Accepted: a call's input always streams as it is sampled."""
    defer_loading: bool | None = None
    allowed_callers: list[str] | None = None
    input_examples: list[Any] | None = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {
        "defer_loading": (None, False), "allowed_callers": (None, ["direct"]),
        "input_examples": (None, [])}


class ServerTool(RequestModel):
    """Anthropic's server tools (bash, web search, ...): they run on Anthropic's side, not
    here; refused by name (`tools[i].type`)."""

    model_config = ConfigDict(extra="allow")
    type: str


def _tool_tag(v: Any) -> str:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return "~custom" if kind in (None, "custom") else "~server"


ToolSpec = Annotated[
    Annotated[AnthropicTool, Tag("~custom")] | Annotated[ServerTool, Tag("~server")],
    Discriminator(_tool_tag),
]


def _choice_tag(v: Any) -> str | None:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return f"~{kind}" if kind in ("auto", "any", "tool", "none") else None


class _ToolChoiceAuto(RequestModel):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class _ToolChoiceAny(RequestModel):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class _ToolChoiceTool(RequestModel):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class _ToolChoiceNone(RequestModel):
    type: Literal["none"]


ToolChoice = Annotated[
    Annotated[_ToolChoiceAuto, Tag("~auto")] | Annotated[_ToolChoiceAny, Tag("~any")]
    | Annotated[_ToolChoiceTool, Tag("~tool")] | Annotated[_ToolChoiceNone, Tag("~none")],
    Discriminator(_choice_tag, custom_error_type="invalid_tool_choice",
                  custom_error_message="tool_choice type must be 'auto', 'any', 'tool' or "
                                       "'none'"),
]


class _Metadata(RequestModel):
    user_id: str | None = None


class _OutputFormat(RequestModel):
    type: Literal["json_schema"]
    schema_: Annotated[dict[str, Any], Field(alias="schema")]


class _OutputConfig(RequestModel):
    format: _OutputFormat | None = None
    """The answer follows this JSON schema (as OpenAI's `response_format`)."""
    effort: str | None = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {"effort": (None,)}


class CountTokensRequest(RequestModel):
    model: str
    tokenizer_version: str | None = None
    """tokenwire's (sent through the SDK's `extra_body`): the tokenizer version the request's
    ids belong to; required when it sends ids."""
    messages: list[AnthropicMessage]
    system: _str_or_list(SystemBlock) | None = None  # type: ignore[valid-type]
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    """Checked by /v1/messages; a count reads it not (it does not change the prompt)."""
    thinking: dict[str, Any] | None = None
    """`{"type": "enabled", "budget_tokens": N}` (vLLM's `thinking_token_budget`), `disabled`
    (the template's `enable_thinking: false`), `adaptive` (the model's own depth): checked by
    serving/anthropic/input.py."""
    cache_control: dict[str, Any] | None = None
    output_config: _OutputConfig | None = None
    """Checked by /v1/messages; a count reads it not (it does not change the prompt)."""
    speed: str | None = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {
        "speed": (None, "standard"),
    }


class MessagesRequest(CountTokensRequest, WeightBoundFields, IdsEncoding):
    max_tokens: Annotated[int, Field(ge=1)]
    tokenizer_fallback: Literal["error", "translate"] = "error"
    """On a version that is not the model's: refuse (default) or go through text."""
    stop_sequences: Annotated[list[str], Field(max_length=4)] | None = None
    """Up to four (the chat service's limit, OpenAI's): generation ends before the first."""
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    """0: off."""
    metadata: _Metadata | None = None
    """`user_id` is accepted: it cannot change the output."""
    stream: bool = False
    seed: int | None = None
    """tokenwire's (vLLM's) extension: reproducible sampling."""
    response_format_tokens: bool = False
    """`true`: `token_ids` on every content block and delta, the versions on the message."""
    return_token_ids: bool = False
    """`prompt_token_ids` on the message (and on `message_start`'s)."""
    # accepted and ignored: they cannot change the output
    service_tier: str | None = None
    diagnostics: Any = None
    # Anthropic's fields tokenwire does not implement: a non-neutral value is refused by name
    container: Any = None
    mcp_servers: list[Any] | None = None
    context_management: Any = None
    inference_geo: str | None = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {
        **CountTokensRequest.unsupported,
        "container": (None,),
        "mcp_servers": (None, []),
        "context_management": (None,),
        "inference_geo": (None,),
    }


# -- response ---------------------------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn",
                     "refusal"]


class TextContent(ResponseModel):
    type: Literal["text"] = "text"
    text: str
    token_ids: Ids | None = None
    """The ids this block was sampled as (with `response_format_tokens`)."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset({"token_ids"})


class ToolUseContent(ResponseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]
    token_ids: Ids | None = None
    """The call's ids, its syntax (tags, the name) included."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset({"token_ids"})


class ThinkingContent(ResponseModel):
    """The model's reasoning, where it reasons. `signature` is an opaque id, as vLLM's (no
    signed claim: this server keeps the ids, not a signature, as what proves a turn)."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str
    token_ids: Ids | None = None
    """The reasoning's ids, its markers (`<think>`, `</think>`) included."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset({"token_ids"})


ContentBlock = ThinkingContent | TextContent | ToolUseContent


class AnthropicUsage(ResponseModel):
    input_tokens: int
    """Prompt tokens the prefix cache did not serve (Anthropic's and vLLM's meaning)."""
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    """Prompt tokens the engine's prefix cache served, when it says."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset(
        {"cache_creation_input_tokens", "cache_read_input_tokens"})


class Message(ResponseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock]
    model: str
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: AnthropicUsage
    tokenizer_version: str | None = None
    template_version: str | None = None
    token_ids_source: Literal["sampled", "translated", "retokenized"] | None = None
    prompt_token_ids: Ids | None = None
    """With `return_token_ids`: the prompt as the model read it."""
    weight_versions: list[WeightVersionSpan] | None = None
    warnings: list[ResponseWarning] | None = None

    omit_if_none: ClassVar[frozenset[str]] = frozenset(
        {"tokenizer_version", "template_version", "token_ids_source", "prompt_token_ids",
         "weight_versions", "warnings"})


class CountTokensResponse(ResponseModel):
    input_tokens: int
    tokenizer_version: str | None = None

    omit_if_none: ClassVar[frozenset[str]] = frozenset({"tokenizer_version"})


# -- stream events (`event: <type>` / `data: <json>`) ------------------------------------------


class MessageStartEvent(ResponseModel):
    type: Literal["message_start"] = "message_start"
    message: Message


class PingEvent(ResponseModel):
    type: Literal["ping"] = "ping"


class ContentBlockStartEvent(ResponseModel):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: ContentBlock


class TextDelta(ResponseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str
    token_ids: Ids | None = None
    """This delta's ids (`text` may be "" while a character's bytes are still arriving)."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset({"token_ids"})


class InputJsonDelta(ResponseModel):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str
    token_ids: Ids | None = None

    omit_if_none: ClassVar[frozenset[str]] = frozenset({"token_ids"})


class ThinkingDelta(ResponseModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str
    token_ids: Ids | None = None
    """This delta's ids (a marker's: with `thinking` "")."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset({"token_ids"})


class SignatureDelta(ResponseModel):
    type: Literal["signature_delta"] = "signature_delta"
    signature: str


class ContentBlockDeltaEvent(ResponseModel):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: TextDelta | InputJsonDelta | ThinkingDelta | SignatureDelta


class ContentBlockStopEvent(ResponseModel):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDelta(ResponseModel):
    stop_reason: StopReason | None
    stop_sequence: str | None = None


class DeltaUsage(ResponseModel):
    output_tokens: int
    """Cumulative, as Anthropic's."""
    input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None

    omit_if_none: ClassVar[frozenset[str]] = frozenset(
        {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"})


class MessageDeltaEvent(ResponseModel):
    type: Literal["message_delta"] = "message_delta"
    delta: MessageDelta
    usage: DeltaUsage
    weight_versions: list[WeightVersionSpan] | None = None
    warnings: list[ResponseWarning] | None = None

    omit_if_none: ClassVar[frozenset[str]] = frozenset({"weight_versions", "warnings"})


class MessageStopEvent(ResponseModel):
    type: Literal["message_stop"] = "message_stop"


# -- errors -----------------------------------------------------------------------------------

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               409: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}
"""Anthropic's error `type` by status; any other status is `api_error`."""


class AnthropicError(ResponseModel):
    type: str
    message: str
    details: dict[str, Any] | None = None
    """tokenwire's `error_code` (the SDK's `exc.error_code`) and the `param` it names."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset({"details"})


class AnthropicErrorBody(ResponseModel):
    """The body of an error answer, and the data of an in-stream `error` event."""

    type: Literal["error"] = "error"
    error: AnthropicError


MessageEvent = (MessageStartEvent | PingEvent | ContentBlockStartEvent | ContentBlockDeltaEvent
                | ContentBlockStopEvent | MessageDeltaEvent | MessageStopEvent
                | AnthropicErrorBody)


class MessageStreamEvent(RootModel[MessageEvent]):
    """One typed event of a Messages stream (`event: <type>`, `data: <this>`), as a model: what
    the served schema describes each event's data with."""
