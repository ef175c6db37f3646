"""Wire models of POST /v1/chat/completions (OpenAI's shape plus the token-native fields)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from ._base import RawJSON, RequestModel, ResponseModel
from .common import (
    Ids,
    IdsEncoding,
    Metadata,
    PromptLogprob,
    ResponseWarning,
    Stop,
    StreamOptions,
    TokenIds,
    TokenLogprob,
    Usage,
    WeightVersionSpan,
)
from .sampling import VllmSamplingFields
from .tools import (
    DeltaToolCall,
    ResponseFormat,
    ResponseToolCall,
    Tool,
    ToolCall,
    ToolChoice,
)

__all__ = [
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatDelta",
    "ChatMessage",
    "ChoiceLogprobs",
    "Content",
    "ContentBlock",
    "FinishReason",
    "InputDocumentBlock",
    "InputTokensBlock",
    "ResponseMessage",
    "TextBlock",
    "TokenFormat",
]


class TextBlock(RequestModel):
    type: Literal["text"]
    text: str


class InputTokensBlock(RequestModel):
    """Token ids spliced into the prompt as they are: never decoded and re-encoded."""

    type: Literal["input_tokens"]
    token_ids: TokenIds


class InputDocumentBlock(RequestModel):
    """A stored document's ids (`POST /v1/documents`) spliced into the prompt straight from
    storage; one of another tokenizer version is translated, with a warning."""

    type: Literal["input_document"]
    document_id: Annotated[str, Field(pattern=r"^[^\x00]*$")]


def _block_tag(v: Any) -> str | None:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return f"~{kind}" if kind in ("text", "input_tokens", "input_document") else None


def _content_tag(v: Any) -> str | None:
    if isinstance(v, str):
        return "~str"
    if isinstance(v, list):
        return "~list"
    if isinstance(v, dict | TextBlock | InputTokensBlock | InputDocumentBlock):
        return "~block"
    return None


# Tags start with "~" so that error locations can drop them (see api/validation.py).
ContentBlock = Annotated[
    Annotated[TextBlock, Tag("~text")] | Annotated[InputTokensBlock, Tag("~input_tokens")]
    | Annotated[InputDocumentBlock, Tag("~input_document")],
    Discriminator(
        _block_tag,
        custom_error_type="invalid_content_block",
        custom_error_message="content blocks must have type 'text', 'input_tokens' or "
                             "'input_document'",
    ),
]

Content = Annotated[
    Annotated[str, Tag("~str")]
    | Annotated[ContentBlock, Tag("~block")]
    | Annotated[list[ContentBlock], Tag("~list")],
    Discriminator(
        _content_tag,
        custom_error_type="invalid_content",
        custom_error_message=(
            "content must be a string, a content block, or an array of text, input_tokens "
            "and input_document blocks"
        ),
    ),
]


def _listify(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    token_ids: TokenIds | None = None
    """Assistant history only: the ids returned earlier, used verbatim instead of `content`."""
    name: str | None = None
    tool_call_id: str | None = None
    """Tool messages: the id of the call this is the result of."""
    tool_calls: list[ToolCall] | None = None
    """Assistant history: the calls it made. With `token_ids` the ids are the message (the
    calls are not rendered again); without, the calls are rendered in the tool format."""
    reasoning: str | None = None
    """Assistant history, vLLM's: the reasoning before `content`, for the template to render
    (as its `reasoning_content`); with `token_ids` the ids are the message. vLLM's deprecated
    `reasoning_content` is read as this."""

    @model_validator(mode="before")
    @classmethod
    def _reasoning_content(cls, data: Any) -> Any:
        """vLLM renames the deprecated `reasoning_content` to `reasoning` (its protocol.py)."""
        if isinstance(data, dict) and "reasoning_content" in data:
            data = dict(data)
            old = data.pop("reasoning_content")
            if data.get("reasoning") is None:
                data["reasoning"] = old
        return data


def _no_int_as_bool(v: Any) -> Any:
    if isinstance(v, int) and not isinstance(v, bool):
        raise ValueError("Input should be False, True or 'only'")
    return v


TokenFormat = Annotated[Literal[False, True, "only"], BeforeValidator(_no_int_as_bool)]


class ChatCompletionRequest(VllmSamplingFields, IdsEncoding):
    model: str
    messages: list[ChatMessage]
    tokenizer_version: str | None = None
    """The tokenizer version the request's ids belong to; required when it sends ids."""
    tokenizer_fallback: Literal["error", "translate"] = "error"
    """On a version that is not the model's: refuse (default) or go through text."""
    response_format_tokens: TokenFormat = False
    """`true`: `message.token_ids` beside `content`; `"only"`: ids and `content: null`."""
    return_token_ids: bool = False
    """vLLM dialect: `choices[i].token_ids` and top-level `prompt_token_ids`."""
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    seed: int | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: Stop | None = None
    """One string or up to four: generation ends before the first occurrence of any."""
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    """Default: "auto" with tools, "none" without (OpenAI's)."""
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    check_drift: bool | None = None
    """Warn when an assistant message's `content` encodes to other ids than its `token_ids`
    (default: the server's `check_drift` setting)."""
    prompt_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    """vLLM dialect: each prompt token's logprob and the k most likely tokens there."""
    return_tokens_as_token_ids: bool = False
    """vLLM dialect: logprob `token` strings spelled `token_id:<id>`."""
    logit_bias: dict[str, float] | None = None
    """OpenAI's: an id (as a decimal string) -> a bias from -100 to 100 added to its logit."""
    # vLLM's chat fields (its sampling fields come from `VllmSamplingFields`)
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra variables for the model's chat template (e.g. `enable_thinking`)."""
    add_generation_prompt: bool = True
    """Append the template's assistant header, so the model writes a new message."""
    continue_final_message: bool = False
    """The prompt ends inside the last message (no end of turn), so the model continues it;
    needs `add_generation_prompt: false`, as vLLM."""
    echo: bool = False
    """With a last message from the assistant: the response's content starts with its text."""
    include_reasoning: bool = True
    """vLLM's: false leaves the reasoning out of the response (where the model reasons)."""
    keep_reasoning: bool = True
    """Where the model reasons: false drops the reasoning from every assistant turn in the
    history (sent as ids: its reasoning's ids and markers; as text: its `reasoning`), as
    Qwen3's and DeepSeek-R1's templates drop earlier turns' reasoning; true (the default)
    feeds ids as sampled (docs/api/chat.md)."""
    add_special_tokens: bool | None = None
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    # accepted and ignored: they cannot change the output
    user: str | None = None
    safety_identifier: str | None = None
    metadata: Metadata | None = None
    """Kept with the completion when `store` is true (OpenAI's limits)."""
    store: bool | None = None
    """Keep the request, the response and the ids of both (`GET /v1/chat/completions`)."""
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    """OpenAI's cache routing hint: requests with the same key go to the same replica."""
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    # OpenAI fields tokenwire does not implement: a non-neutral value is refused by name
    verbosity: Literal["low", "medium", "high"] | None = None
    moderation: dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None \
        = None
    """vLLM's levels: a chat template that reads `reasoning_effort` (gpt-oss's, Cohere's) gets
    it; "none" is `enable_thinking: false` where the template has that switch; a level that the
    template cannot take is refused by name (serving/chat_reasoning.py `thinking_switch`)."""
    web_search_options: Any = None

    thinking_token_budget: Annotated[int, Field(ge=-1)] | None = None
    """vLLM's: most tokens of reasoning, then the end marker is forced (-1: no bound)."""

    @field_validator("thinking_token_budget")
    @classmethod
    def _unbounded(cls, v: int | None) -> int | None:
        return None if v == -1 else v  # vLLM's `validate_thinking_token_budget`

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {
        # field -> values that mean "feature off"
        **{k: v for k, v in VllmSamplingFields.unsupported.items()
           if k != "thinking_token_budget"},
        "add_special_tokens": (None, False),
        "documents": (None, []),
        "chat_template": (None,),
        "verbosity": (None, "medium"),
        "moderation": (None,),
        "functions": (None, []),
        "function_call": (None, "none", "auto"),
        "modalities": (None, ["text"]),
        "audio": (None,),
        "prediction": (None,),
        "web_search_options": (None,),
    }


# -- responses --------------------------------------------------------------------------------


class ChoiceLogprobs(ResponseModel):
    # a whole answer's entries come written in bulk (RawJSON: the same JSON, not in the schema)
    content: list[TokenLogprob] | SkipJsonSchema[RawJSON] | None
    refusal: None = None


FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "abort"]
""""abort": the engine was paused with `pause?mode=abort` (vLLM's finish reason)."""


class ResponseMessage(ResponseModel):
    omit_if_none = frozenset({"token_ids", "tool_calls", "reasoning", "reasoning_token_ids"})
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ResponseToolCall] | None = None
    reasoning: str | None = None
    """vLLM's: the model's reasoning, where it reasons (its markers' text not included)."""
    token_ids: Ids | None = None
    """The ids the model sampled (`response_format_tokens`), reasoning and markers included:
    the message as history sends it back."""
    reasoning_token_ids: Ids | None = None
    """With `token_ids`, where the model reasoned: the reasoning's ids (a run of `token_ids`,
    between its markers)."""


class ChatChoice(ResponseModel):
    omit_if_none = frozenset({"token_ids", "stop_reason", "stop_logprob", "weight_versions"})
    index: int
    message: ResponseMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None
    token_ids: Ids | None = None
    """vLLM dialect (`return_token_ids`): the ids the model sampled."""
    stop_reason: int | str | None = None
    """vLLM dialect: the end-of-generation id or the stop string that ended the choice."""
    stop_logprob: float | None = None
    """With `logprobs` and ids asked for: the logprob of the id in `stop_reason`, when the model
    sampled it (`token_ids + [stop_reason]` with `logprobs + [stop_logprob]` is vLLM's
    `token_ids` and logprobs: what a trainer trains on, the end of turn included)."""
    weight_versions: list[WeightVersionSpan] | None = None
    """Which weights sampled which output tokens (vLLM 0.32's spans over output indexes, the
    stop id's included), where the engine says."""


class _TokenNative(ResponseModel):
    omit_if_none = frozenset(
        {"prompt_token_ids", "tokenizer_version", "template_version", "token_ids_source",
         "usage", "system_fingerprint", "warnings", "prompt_logprobs", "logprobs_mode"}
    )
    id: str
    created: int
    model: str
    system_fingerprint: str | None = None
    prompt_token_ids: Ids | None = None
    """vLLM dialect (`return_token_ids`): the exact ids the model was fed."""
    tokenizer_version: str | None = None
    """Full id of the version every id in this response belongs to."""
    template_version: str | None = None
    """Content hash of the chat template and tool format that rendered the prompt."""
    token_ids_source: Literal["sampled", "translated", "retokenized"] | None = None
    """Provenance of the output ids: "sampled" only when they are the ones the model sampled."""
    logprobs_mode: str | None = None
    """When logprobs were asked for: what they are (vLLM's `--logprobs-mode` names:
    `raw_logprobs`, the model's distribution; `processed_logprobs`, the one the sampler drew
    from), where the engine says."""
    warnings: list[ResponseWarning] | None = None
    """E.g. ids flagged as non-canonical (streams: on the first chunk)."""


class ChatCompletion(_TokenNative):
    omit_if_none = _TokenNative.omit_if_none | {"metadata"}
    carries_raw = True
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage | None = None
    metadata: dict[str, str] | None = None
    """A stored completion's metadata (`GET /v1/chat/completions/{id}`)."""
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None
    """vLLM dialect: per prompt position (the first is null), the prompt token and the most
    likely ones, keyed by id."""


class ChatDelta(ResponseModel):
    omit_if_none = frozenset({"role", "content", "token_ids", "tool_calls", "reasoning"})
    role: Literal["assistant"] | None = None
    content: str | None = None
    """Never splits a UTF-8 character: may be "" while ids of a partial character arrive."""
    reasoning: str | None = None
    """vLLM's: a piece of the model's reasoning (never with `content` in one delta)."""
    tool_calls: list[DeltaToolCall] | None = None
    token_ids: Ids | None = None
    """The ids of the text this delta carries, in `content`, in `reasoning` or in a call's
    `arguments` (or in the syntax around them: a tool format's, reasoning markers)."""


class ChatChunkChoice(ResponseModel):
    omit_if_none = frozenset({"token_ids", "stop_reason", "stop_logprob", "weight_versions"})
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None
    token_ids: Ids | None = None
    stop_reason: int | str | None = None
    stop_logprob: float | None = None
    weight_versions: list[WeightVersionSpan] | None = None
    """On the finishing chunk: the whole output's spans (as vLLM sends them)."""


class ChatCompletionChunk(_TokenNative):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
