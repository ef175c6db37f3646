"""Wire models of POST /v1/responses (OpenAI's Responses API plus the token-native fields).

Requests are the shapes of the official SDK's `responses.create` params; items the SDK returns
(`response.output`) may be sent back as input as they are, their `id`, `status` and our
`token_ids` included. Fields that would change the output and cannot be honoured are declared
here and refused by name (`unsupported`); the rest of OpenAI's optional fields that cannot
change the output are accepted and ignored. Anything else is 400 `unknown_parameter`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Discriminator, Field, RootModel, Tag

from ._base import RequestModel, ResponseModel
from .common import Ids, IdsEncoding, ResponseWarning, TokenIds, TokenLogprob, WeightVersionSpan
from .sampling import WeightBoundFields
from .tools import FunctionName

__all__ = [
    "INPUT_TOKEN_IDS",
    "LOGPROBS",
    "OUTPUT_TOKEN_IDS",
    "ArgumentsDeltaEvent",
    "ArgumentsDoneEvent",
    "ContentPartEvent",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "FunctionTool",
    "FunctionToolChoice",
    "IncompleteDetails",
    "InputItem",
    "InputTextPart",
    "InputTokensDetails",
    "InputTokensPart",
    "MessageItem",
    "OtherTool",
    "OtherToolChoice",
    "OutputFunctionCall",
    "OutputItem",
    "OutputItemEvent",
    "OutputMessage",
    "OutputReasoning",
    "OutputTextInputPart",
    "OutputTextPart",
    "ReasoningDeltaEvent",
    "ReasoningDoneEvent",
    "ReasoningTextPart",
    "OutputTokensDetails",
    "Response",
    "ResponseErrorInfo",
    "ResponseEvent",
    "ResponseLifecycleEvent",
    "ResponseStreamEvent",
    "ResponseUsage",
    "ResponsesRequest",
    "TextConfig",
    "TextDeltaEvent",
    "TextDoneEvent",
    "TextFormatJsonObject",
    "TextFormatJsonSchema",
    "TextFormatText",
]

#: `include` entries this server fills (OpenAI's one, and the token-native two)
LOGPROBS = "message.output_text.logprobs"
OUTPUT_TOKEN_IDS = "output.token_ids"
"""`token_ids` on every output item and delta event, top-level `tokenizer_version`."""
INPUT_TOKEN_IDS = "input.token_ids"
"""Top-level `input_token_ids`: the exact ids the model was fed."""

ItemStatus = Literal["in_progress", "completed", "incomplete"]


def _tag(kinds: tuple[str, ...], default: str | None = None) -> Any:
    def tag(v: Any) -> str | None:
        kind = v.get("type", default) if isinstance(v, dict) else getattr(v, "type", None)
        return f"~{kind}" if kind in kinds else None
    return tag


# -- input -----------------------------------------------------------------------------------


class InputTextPart(RequestModel):
    type: Literal["input_text"]
    text: str


class OutputTextInputPart(RequestModel):
    """An assistant message's text, as a previous response returned it."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None
    """Returned earlier; not read."""


class InputTokensPart(RequestModel):
    """Token ids spliced into the prompt as they are: never decoded and re-encoded."""

    type: Literal["input_tokens"]
    token_ids: TokenIds


ContentPart = Annotated[
    Annotated[InputTextPart, Tag("~input_text")]
    | Annotated[OutputTextInputPart, Tag("~output_text")]
    | Annotated[InputTokensPart, Tag("~input_tokens")],
    Discriminator(
        _tag(("input_text", "output_text", "input_tokens")),
        custom_error_type="invalid_content_part",
        custom_error_message="content parts must have type 'input_text', 'output_text' or "
                             "'input_tokens'"),
]

ToolOutputPart = Annotated[
    Annotated[InputTextPart, Tag("~input_text")]
    | Annotated[InputTokensPart, Tag("~input_tokens")],
    Discriminator(
        _tag(("input_text", "input_tokens")),
        custom_error_type="invalid_content_part",
        custom_error_message="output parts must have type 'input_text' or 'input_tokens'"),
]


def _str_or_list(what: str) -> Any:
    def tag(v: Any) -> str | None:
        return "~str" if isinstance(v, str) else "~list" if isinstance(v, list) else None
    return Discriminator(tag, custom_error_type="invalid_type",
                         custom_error_message=f"{what} must be a string or an array")


Parts = Annotated[Annotated[str, Tag("~str")] | Annotated[list[ContentPart], Tag("~list")],
                  _str_or_list("content")]
ToolOutput = Annotated[Annotated[str, Tag("~str")] | Annotated[list[ToolOutputPart], Tag("~list")],
                       _str_or_list("output")]


class MessageItem(RequestModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Parts
    token_ids: TokenIds | None = None
    """Assistant messages: the ids returned earlier, used verbatim instead of `content`."""
    id: str | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None
    """Accepted; SmolLM2-style templates have no phases."""


class FunctionCallItem(RequestModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    token_ids: TokenIds | None = None
    """As returned earlier: with every item of the turn carrying them, the turn's ids are
    spliced verbatim (the call is not rendered again)."""
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(RequestModel):
    type: Literal["function_call_output"]
    call_id: str
    output: ToolOutput
    id: str | None = None
    status: ItemStatus | None = None


InputItem = Annotated[
    Annotated[MessageItem, Tag("~message")]
    | Annotated[FunctionCallItem, Tag("~function_call")]
    | Annotated[FunctionCallOutputItem, Tag("~function_call_output")],
    Discriminator(
        _tag(("message", "function_call", "function_call_output"), default="message"),
        custom_error_type="invalid_input_item",
        custom_error_message="input items must have type 'message', 'function_call' or "
                             "'function_call_output'"),
]


class FunctionTool(RequestModel):
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class OtherTool(RequestModel):
    """A built-in tool (web_search, file_search, mcp, ...): refused by name."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str


ToolSpec = Annotated[
    Annotated[FunctionTool, Tag("~function")] | Annotated[OtherTool, Tag("~other")],
    Discriminator(lambda v: "~function" if (v.get("type") if isinstance(v, dict)
                                             else getattr(v, "type", None)) == "function"
                  else "~other"),
]


class FunctionToolChoice(RequestModel):
    type: Literal["function"]
    name: str


class OtherToolChoice(RequestModel):
    """`allowed_tools`, a built-in tool's type, ...: refused by name."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str


def _choice_tag(v: Any) -> str:
    if isinstance(v, str):
        return "~mode"
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return "~function" if kind == "function" else "~other"


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("~mode")]
    | Annotated[FunctionToolChoice, Tag("~function")]
    | Annotated[OtherToolChoice, Tag("~other")],
    Discriminator(_choice_tag),
]


class TextFormatText(RequestModel):
    type: Literal["text"]


class TextFormatJsonObject(RequestModel):
    type: Literal["json_object"]


class TextFormatJsonSchema(RequestModel):
    type: Literal["json_schema"]
    name: str
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[
    Annotated[TextFormatText, Tag("~text")] | Annotated[TextFormatJsonObject, Tag("~json_object")]
    | Annotated[TextFormatJsonSchema, Tag("~json_schema")],
    Discriminator(
        _tag(("text", "json_object", "json_schema")),
        custom_error_type="invalid_text_format",
        custom_error_message="text.format.type must be 'text', 'json_object' or 'json_schema'"),
]


class TextConfig(RequestModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    """Only the default ("medium") can be honoured: others are refused."""


class ResponsesRequest(WeightBoundFields, IdsEncoding):
    model: str
    input: Annotated[Annotated[str, Tag("~str")] | Annotated[list[InputItem], Tag("~list")],
                     _str_or_list("input")]
    instructions: str | None = None
    """A leading system message."""
    tokenizer_version: str | None = None
    """The tokenizer version the request's ids belong to; required when it sends ids."""
    tokenizer_fallback: Literal["error", "translate"] = "error"
    include: list[str] | None = None
    """OpenAI's `message.output_text.logprobs`, and ours: `output.token_ids`,
    `input.token_ids`. Other entries are refused by name."""
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    """With `include: ["message.output_text.logprobs"]` (as vLLM reads it)."""
    seed: int | None = None
    """vLLM's extension: reproducible sampling."""
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    """`include_obfuscation` accepted: events never carry an `obfuscation` field."""
    store: bool | None = None
    """Keep the response (OpenAI's default: true where the server has storage), to be read
    back (`GET /v1/responses/{id}`) and continued (`previous_response_id`). On a server without
    storage, omitted means not kept and true is refused."""
    previous_response_id: str | None = None
    """Continue a kept response of this API key: the prompt starts with that response's exact
    prompt and sampled ids (the history is not sent again). Its tools are kept (send the same,
    or none); its `instructions` are not carried over."""
    # accepted and ignored: they cannot change the output
    metadata: dict[str, str] | None = None
    """Echoed in the response."""
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    max_tool_calls: int | None = None
    """Limits built-in tool calls, of which there are none here."""
    # OpenAI fields tokenwire does not implement: a non-neutral value is refused by name
    conversation: Any = None
    background: bool | None = None
    prompt: Any = None
    reasoning: dict[str, Any] | None = None
    """`{"effort": ...}`: chat's `reasoning_effort` (its levels, what a template can take);
    summaries are not made (`summary` other than null is refused)."""
    truncation: Literal["auto", "disabled"] | None = None
    context_management: list[Any] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    moderation: Any = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {
        # field -> values that mean "feature off"
        "conversation": (None,),
        "background": (None, False),
        "prompt": (None,),
        "truncation": (None, "disabled"),
        "context_management": (None, []),
        "prompt_cache_options": (None, {}),
        "moderation": (None,),
    }

    def includes(self, entry: str) -> bool:
        return entry in (self.include or ())


# -- output ----------------------------------------------------------------------------------


class OutputTextPart(ResponseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[TokenLogprob] = Field(default_factory=list)
    """With `include: ["message.output_text.logprobs"]`; each entry has an integer `id`."""


class OutputMessage(ResponseModel):
    omit_if_none = frozenset({"token_ids"})
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputTextPart]
    token_ids: Ids | None = None
    """`output.token_ids`: the ids of this item, exactly as sampled."""


class OutputFunctionCall(ResponseModel):
    omit_if_none = frozenset({"token_ids"})
    id: str
    type: Literal["function_call"] = "function_call"
    status: ItemStatus
    call_id: str
    name: str
    arguments: str
    """Exactly as sampled."""
    token_ids: Ids | None = None
    """`output.token_ids`: the ids of this call, the tool format's syntax around it
    included."""


class ReasoningTextPart(ResponseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(ResponseModel):
    """The model's reasoning, where it reasons (vLLM's reasoning item: its text as
    `reasoning_text` content, no summary)."""

    omit_if_none = frozenset({"token_ids"})
    id: str
    type: Literal["reasoning"] = "reasoning"
    status: ItemStatus
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningTextPart] = Field(default_factory=list)
    token_ids: Ids | None = None
    """`output.token_ids`: the ids of this item, its markers (`<think>`, `</think>`)
    included."""


OutputItem = OutputReasoning | OutputMessage | OutputFunctionCall


class InputTokensDetails(ResponseModel):
    cached_tokens: int


class OutputTokensDetails(ResponseModel):
    reasoning_tokens: int = 0


class ResponseUsage(ResponseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    """Every token the model sampled, the end-of-generation token included."""
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int | None,
           reasoning: int | None = None) -> ResponseUsage:
        return cls(input_tokens=prompt,
                   input_tokens_details=InputTokensDetails(cached_tokens=cached or 0),
                   output_tokens=completion, total_tokens=prompt + completion,
                   output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning or 0))


class IncompleteDetails(ResponseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseErrorInfo(ResponseModel):
    code: str | None
    message: str
    param: str | None = None
    type: str | None = None


class Response(ResponseModel):
    omit_if_none = frozenset({"tokenizer_version", "template_version", "token_ids_source",
                              "input_token_ids", "warnings", "completed_at", "weight_versions"})
    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]
    """"cancelled": the engine was paused with `pause?mode=abort` mid-response (vLLM's)."""
    error: ResponseErrorInfo | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    instructions: str | None = None
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    tool_choice: Any = "auto"
    tools: list[Any] = Field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    truncation: Literal["disabled"] = "disabled"
    store: bool = False
    """Whether the response is kept (readable and continuable by its id)."""
    metadata: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    usage: ResponseUsage | None = None
    tokenizer_version: str | None = None
    """Full id of the version every id in this response belongs to."""
    template_version: str | None = None
    token_ids_source: Literal["sampled", "translated", "retokenized"] | None = None
    input_token_ids: Ids | None = None
    """`input.token_ids`: the exact ids the model was fed."""
    weight_versions: list[WeightVersionSpan] | None = None
    """With `output.token_ids`: which weights sampled which output ids (vLLM 0.32's spans over
    the output's indexes, across its items), where the engine says; once finished."""
    warnings: list[ResponseWarning] | None = None


# -- stream events ---------------------------------------------------------------------------


class _Event(ResponseModel):
    type: str
    sequence_number: int = 0
    """Set when the event is sent: 0, 1, 2, ... within a stream."""


class ResponseLifecycleEvent(_Event):
    """`response.created`, `.in_progress`, `.completed`, `.incomplete`, `.failed`."""

    response: Response


class OutputItemEvent(_Event):
    """`response.output_item.added` / `.done`."""

    output_index: int
    item: OutputItem


class ContentPartEvent(_Event):
    """`response.content_part.added` / `.done`."""

    item_id: str
    output_index: int
    content_index: int = 0
    part: OutputTextPart | ReasoningTextPart


class TextDeltaEvent(_Event):
    omit_if_none = frozenset({"token_ids"})
    type: str = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    """Never splits a UTF-8 character: may be "" while ids of a partial character arrive."""
    logprobs: list[TokenLogprob] = Field(default_factory=list)
    token_ids: Ids | None = None
    """`output.token_ids`: the ids of this delta (concatenated: the item's `token_ids`)."""


class TextDoneEvent(_Event):
    type: str = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int = 0
    text: str
    logprobs: list[TokenLogprob] = Field(default_factory=list)


class ArgumentsDeltaEvent(_Event):
    omit_if_none = frozenset({"token_ids"})
    type: str = "response.function_call_arguments.delta"
    item_id: str
    output_index: int
    delta: str
    token_ids: Ids | None = None
    """`output.token_ids`: the ids of this delta, the tool format's syntax included."""


class ArgumentsDoneEvent(_Event):
    type: str = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    name: str
    arguments: str


class ReasoningDeltaEvent(_Event):
    omit_if_none = frozenset({"token_ids"})
    type: str = "response.reasoning_text.delta"
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    token_ids: Ids | None = None
    """`output.token_ids`: the ids of this delta (a marker's: with `delta` "")."""


class ReasoningDoneEvent(_Event):
    type: str = "response.reasoning_text.done"
    item_id: str
    output_index: int
    content_index: int = 0
    text: str


ResponseEvent = (ResponseLifecycleEvent | OutputItemEvent | ContentPartEvent | TextDeltaEvent
                 | TextDoneEvent | ArgumentsDeltaEvent | ArgumentsDoneEvent
                 | ReasoningDeltaEvent | ReasoningDoneEvent)


class ResponseStreamEvent(RootModel[ResponseEvent]):
    """One typed event of a Responses stream (`event: <type>`, `data: <this>`), as a model: what
    the served schema describes each event's data with."""
