"""Wire models shared by several endpoints: usage, logprob entries, model cards, errors."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictInt, WithJsonSchema

from ._base import OR_BASE64, RequestModel, ResponseModel

__all__ = [
    "ErrorInfo",
    "ErrorResponse",
    "LogprobEntry",
    "ModelCard",
    "ModelList",
    "PromptLogprob",
    "PromptTokensDetails",
    "ResponseWarning",
    "StreamOptions",
    "Ids",
    "IdsEncoding",
    "TokenId",
    "TokenIds",
    "MAX_METADATA_PAIRS",
    "Metadata",
    "TokenLogprob",
    "Usage",
    "Stop",
    "StopStrings",
    "Version",
    "WeightVersionSpan",
]

#: A token id as a client may send it: a JSON integer, not negative. The upper bound depends on
#: the tokenizer version and is checked by serving code.
TokenId = Annotated[StrictInt, Field(ge=0)]
#: a request's ids: a JSON list of them, or base64 of little-endian int32 (`PackedIds`)
TokenIds = Annotated[list[TokenId], OR_BASE64]
#: a response's ids: a JSON list, or base64 where the request asked `encoding_format: "base64"`
Ids = Annotated[list[int], OR_BASE64]

MAX_METADATA_PAIRS = 16
_NO_NUL = r"^[^\x00]*$"
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64, pattern=_NO_NUL)],
         Annotated[str, Field(max_length=512, pattern=_NO_NUL)]],
    Field(max_length=MAX_METADATA_PAIRS),
]
"""OpenAI's limits: up to 16 pairs, keys of at most 64 characters, values of at most 512."""


def _listify(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


_ONE_OR_MANY = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}

#: a `stop` field: one string or a list of them, read as a list (the schema says both, as
#: OpenAI's does); `Stop` holds at most four, as OpenAI's
StopStrings = Annotated[list[str], BeforeValidator(_listify), WithJsonSchema(_ONE_OR_MANY)]
Stop = Annotated[list[str], BeforeValidator(_listify), Field(max_length=4), WithJsonSchema(
    {"anyOf": [{"type": "string"},
               {"type": "array", "items": {"type": "string"}, "maxItems": 4}]})]


class IdsEncoding(RequestModel):
    """The request fields of the answers that carry ids."""

    encoding_format: Literal["list", "base64"] = "list"
    """tokenwire's: `"base64"` writes every list of ids in the answer (`token_ids`,
    `prompt_token_ids`, ..., stream events too) as one string, base64 of little-endian int32,
    as OpenAI's embeddings write vectors. Ids sent may be base64 either way."""


class StreamOptions(RequestModel):
    include_usage: bool = False
    """Send a last chunk with `choices: []` and the request's `usage`."""
    continuous_usage_stats: bool = False
    """vLLM's: with `include_usage`, every chunk also carries the usage so far (its choice's
    completion tokens)."""
    include_obfuscation: bool | None = None
    """OpenAI's stream padding against length side channels: accepted, none is added (it
    cannot change the output)."""
    coalesce: bool | None = None
    """tokenwire's: tokens already at hand together go out as one chunk carrying them all
    (never waiting for more); None: the server's `stream_coalesce`."""


class WeightVersionSpan(ResponseModel):
    """Output tokens `[start, end)` were sampled by the weights labelled `version` (vLLM 0.32)."""

    version: str
    start: int
    end: int


class ResponseWarning(ResponseModel):
    """Something the server accepted but wants the client to know (e.g. non-canonical ids)."""

    omit_if_none = frozenset({"message_index", "position", "token_id", "canonical_token_id"})
    code: str
    param: str | None
    message: str
    message_index: int | None = None
    """`token_drift`: the message whose ids differ from its content's encoding."""
    position: int | None = None
    """`token_drift`: the first index (into the message's `token_ids`) where they differ."""
    token_id: int | None = None
    """`token_drift`: the sent id there (None: the sent ids end there)."""
    canonical_token_id: int | None = None
    """`token_drift`: the content's canonical id there (None: the encoding ends there)."""


class PromptLogprob(ResponseModel):
    """vLLM's `Logprob` of a prompt position's token or candidate."""

    logprob: float
    rank: int | None = None
    """1 for the most likely token (None when not known)."""
    decoded_token: str | None = None


class PromptTokensDetails(ResponseModel):
    cached_tokens: int
    """Prompt tokens whose KV came from the engine's prefix cache (not computed again)."""


class CompletionTokensDetails(ResponseModel):
    reasoning_tokens: int
    """Sampled ids that were reasoning (its markers not counted, as vLLM counts them)."""


class Usage(ResponseModel):
    omit_if_none = frozenset({"prompt_tokens_details", "completion_tokens_details"})
    prompt_tokens: int
    completion_tokens: int
    """Every token the model sampled, the end-of-generation token included."""
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    """OpenAI's: where the engine reports its prefix cache (the embedded one does)."""
    completion_tokens_details: CompletionTokensDetails | None = None
    """OpenAI's: where the model's reasoning is split out (a model that reasons)."""

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int | None = None,
           reasoning: int | None = None) -> Usage:
        return cls(prompt_tokens=prompt, completion_tokens=completion,
                   total_tokens=prompt + completion,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached)
                   if cached is not None else None,
                   completion_tokens_details=CompletionTokensDetails(
                       reasoning_tokens=reasoning) if reasoning is not None else None)


class LogprobEntry(ResponseModel):
    """One candidate token at a position: OpenAI's fields plus the integer `id`."""

    omit_if_none = frozenset({"id"})
    token: str
    """The token's text; `bytes:\\xNN...` when its bytes are not valid UTF-8 on their own."""
    bytes: list[int] | None
    logprob: float
    id: int | None = None
    """The vocabulary id: two ids can spell the same string, so `token` alone is ambiguous.
    Under `tokenizer_fallback: "translate"` the entry is still the model's token, and `id` is
    the client version's one id for its bytes, left out where that version has none."""


class TokenLogprob(LogprobEntry):
    top_logprobs: list[LogprobEntry]


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenwire"
    root: str | None = None
    """vLLM's: what the model was loaded from (the engine's own name for it: the GGUF's model
    name, or the upstream's served model)."""
    parent: str | None = None
    """vLLM's: the base model of an adapter (None: this is a base model)."""
    tokenizer_version: str
    """The full id of the tokenizer version this model reads and writes."""
    max_model_len: int
    """Most tokens (prompt + completion) one request may hold."""
    template_version: str | None = None
    """Content hash of the chat template and tool format in use (None: no chat template)."""


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Version(ResponseModel):
    """vLLM's `GET /version`."""

    version: str


class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    error: ErrorInfo
