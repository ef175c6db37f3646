"""Wire models of the legacy POST /v1/completions (OpenAI's shape plus token-native fields)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, Tag

from ._base import ResponseModel
from .common import (
    Ids,
    IdsEncoding,
    ResponseWarning,
    Stop,
    StreamOptions,
    TokenId,
    Usage,
    WeightVersionSpan,
)
from .sampling import VllmSamplingFields

__all__ = [
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionLogprobs",
    "CompletionRequest",
    "Prompt",
    "TopTokenLogprob",
]


def _prompt_tag(v: Any) -> str | None:
    if isinstance(v, str):
        return "~str"
    if isinstance(v, list):
        first = v[0] if v else 0
        if isinstance(first, str):
            return "~strs"
        if isinstance(first, list):
            return "~batch"
        return "~ids"
    return None


Prompt = Annotated[
    Annotated[str, Tag("~str")]
    | Annotated[list[str], Tag("~strs")]
    | Annotated[list[TokenId], Tag("~ids")]
    | Annotated[list[list[TokenId]], Tag("~batch")],
    Discriminator(
        _prompt_tag,
        custom_error_type="invalid_prompt",
        custom_error_message="prompt must be a string, an array of strings, an array of token "
        "ids, or an array of arrays of token ids",
    ),
]


def _listify(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


class CompletionRequest(VllmSamplingFields, IdsEncoding):
    model: str
    prompt: Prompt
    """One choice set per prompt; token prompts need `tokenizer_version`."""
    tokenizer_version: str | None = None
    tokenizer_fallback: Literal["error", "translate"] = "error"
    return_token_ids: bool = False
    """vLLM dialect: `choices[i].token_ids` and `choices[i].prompt_token_ids`."""
    echo: bool = False
    """Prefix each choice's text (and logprobs) with its prompt."""
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    """Legacy logprobs: the chosen token's and the `logprobs` most likely tokens'."""
    max_tokens: Annotated[int, Field(ge=0)] | None = 16
    """OpenAI's legacy default is 16; null: as many as the context leaves; 0: score only."""
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop | None = None
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    logit_bias: dict[str, float] | None = None
    """OpenAI's: an id (as a decimal string) -> a bias from -100 to 100 added to its logit."""
    prompt_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    """vLLM's: each prompt token's logprob and the k most likely there (non-streaming), as
    `choices[i].prompt_logprobs`."""
    return_tokens_as_token_ids: bool = False
    """vLLM's: logprob `tokens` spelled `token_id:<id>`."""
    add_special_tokens: bool | None = None
    user: str | None = None
    # OpenAI fields tokenwire does not implement: a non-neutral value is refused by name
    suffix: str | None = None
    best_of: int | None = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {
        **VllmSamplingFields.unsupported,
        "suffix": (None, ""),
        "prompt_logprobs": (None,),
        "return_tokens_as_token_ids": (False,),
        "add_special_tokens": (None, True),
    }


class TopTokenLogprob(ResponseModel):
    omit_if_none = frozenset({"id"})
    id: int | None
    """None (left out) under `tokenizer_fallback: "translate"` where the client's version has
    no one id for the model's token (its `LogprobEntry.id` rule)."""
    token: str
    logprob: float


class CompletionLogprobs(ResponseModel):
    """OpenAI's legacy shape, plus ids: `token_ids` parallel to `tokens`, and
    `top_token_logprobs` parallel to `top_logprobs` (two ids can spell one string, which a
    string-keyed `top_logprobs` object cannot hold)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]
    token_ids: list[int | None]
    """The ids of `tokens` (under translate, the client version's: null where it has none)."""
    top_token_logprobs: list[list[TopTokenLogprob] | None]


class CompletionChoice(ResponseModel):
    omit_if_none = frozenset({"token_ids", "prompt_token_ids", "stop_reason",
                              "weight_versions"})
    text: str
    index: int
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "content_filter", "abort"] | None = None
    token_ids: Ids | None = None
    """vLLM dialect (`return_token_ids`): the ids the model sampled for this choice."""
    prompt_token_ids: Ids | None = None
    """vLLM dialect: the ids this choice's prompt fed the model (first chunk when streaming)."""
    stop_reason: int | str | None = None
    weight_versions: list[WeightVersionSpan] | None = None
    """Which weights sampled which output tokens (vLLM 0.32's spans), where the engine says;
    on the finishing chunk of a stream."""


class _CompletionBase(ResponseModel):
    omit_if_none = frozenset({"tokenizer_version", "token_ids_source", "usage",
                              "system_fingerprint", "warnings", "logprobs_mode"})
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    tokenizer_version: str | None = None
    token_ids_source: Literal["sampled", "translated", "retokenized"] | None = None
    warnings: list[ResponseWarning] | None = None
    logprobs_mode: str | None = None
    """When logprobs were asked for: what they are (vLLM's `--logprobs-mode` names:
    `raw_logprobs`, the model's distribution; `processed_logprobs`, the one the sampler drew
    from), where the engine says."""


class Completion(_CompletionBase):
    pass


class CompletionChunk(_CompletionBase):
    """A streamed piece; OpenAI's legacy stream reuses the `text_completion` object."""
