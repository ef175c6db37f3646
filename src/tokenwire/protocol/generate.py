"""Wire models of vLLM's tokens-in/tokens-out API, `POST /inference/v1/generate`.

Written from vLLM's own source (`vllm/entrypoints/scale_out/token_in_token_out/protocol.py`,
v0.34.0; the 0.13-0.24 layout is `vllm/entrypoints/serve/disagg/protocol.py`), see
docs/engines.md for what was checked how. tokenwire serves this API (so tooling written for
vLLM drops in) and speaks it to vLLM upstreams, with these same models on both sides.

Differences from vLLM, on purpose: a sampling key vLLM does not know is a 400 here (vLLM drops
it silently), and one tokenwire cannot honour is refused by name; logprob entries carry both
vLLM spellings of the id (`token_id`, 0.32+, and `token: "token_id:N"`, older releases and the
clients written for them).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictInt
from pydantic.json_schema import SkipJsonSchema

from ._base import OR_BASE64, RawJSON, RequestModel, ResponseModel
from .common import (
    Ids,
    IdsEncoding,
    Metadata,
    ResponseWarning,
    StopStrings,
    TokenId,
    Usage,
    WeightVersionSpan,
)
from .sampling import WeightBoundFields

__all__ = [
    "StructuredOutputs",
    "GenerateChoice",
    "GenerateLogprob",
    "GenerateLogprobEntry",
    "GenerateLogprobs",
    "GenerateRequest",
    "GenerateResponse",
    "GenerateSamplingParams",
    "GenerateStreamOptions",
    "GenerateStreamResponse",
    "WeightVersionSpan",
]


def _listify(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


class StructuredOutputs(RequestModel):
    """vLLM's `StructuredOutputsParams`: exactly one constraint. `json` (a schema), `json_object`,
    `grammar` (GBNF) and `structural_tag` (its legacy shape) are honoured; the others are
    refused by name."""

    json_: Annotated[dict[str, Any] | str | None, Field(alias="json")] = None
    grammar: str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {
        "regex": (None,),
        "choice": (None,),
        "disable_any_whitespace": (False,),
        "disable_additional_properties": (False,),
        "whitespace_pattern": (None,),
    }


class GenerateSamplingParams(RequestModel):
    """vLLM's `SamplingParams` as JSON: the fields tokenwire honours, and those it accepts
    because they cannot change the ids (`neutral` lists what the rest must be)."""

    n: Annotated[int, Field(ge=1)] = 1
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    seed: int | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    """None: as many as the context leaves (vLLM 0.22+)."""
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    stop: StopStrings | None = None
    """Stop strings; the token that completes one is the last in `token_ids` (vLLM's rule)."""
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    prompt_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    # text-only knobs: tokenwire returns ids, so they cannot change the output
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: Any = None
    stream_interval: int | None = None
    skip_clone: bool = False
    output_text_buffer_length: int = 0
    flat_logprobs: bool = False
    routed_experts_prompt_start: int = 0
    extra_args: dict[str, Any] | None = None
    top_k: StrictInt = 0
    """The k most likely ids only; 0 or -1 is off."""
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0)] = 1.0
    """Counts the prompt and the output (vLLM's)."""
    min_tokens: Annotated[int, Field(ge=0)] = 0
    logit_bias: dict[str, float] | None = None
    # vLLM features tokenwire does not implement: refused unless neutral
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_decoding: dict[str, Any] | None = None
    logprob_token_ids: list[int] | None = None
    prompt_logprob_token_ids: Any = None
    prompt_logprob_start: int | None = None
    thinking_token_budget: int | None = None
    repetition_detection: Any = None
    watermarking: Any = None
    truncate_prompt_tokens: int | None = None
    best_of: int | None = None
    skip_reading_prefix_cache: bool | None = None
    trace_decode_token_ids: list[int] | None = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {
        "allowed_token_ids": (None,),
        "bad_words": (None, []),
        "guided_decoding": (None,),
        "logprob_token_ids": (None,),
        "prompt_logprob_token_ids": (None,),
        "prompt_logprob_start": (None, 0),
        "thinking_token_budget": (None,),
        "repetition_detection": (None,),
        "watermarking": (None, False),
        "truncate_prompt_tokens": (None,),
        "best_of": (None, 1),
    }


class GenerateStreamOptions(RequestModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False
    coalesce: bool | None = None
    """tokenwire's: tokens already at hand together go out as one event carrying them all
    (never waiting for more); None: the server's `stream_coalesce`."""


class GenerateRequest(WeightBoundFields, IdsEncoding):
    token_ids: Annotated[list[TokenId], Field(min_length=1), OR_BASE64]
    """The whole prompt, rendered by the client (template control ids included)."""
    sampling_params: GenerateSamplingParams
    model: str | None = None
    """None: the server's only model."""
    stream: bool | None = False
    stream_options: GenerateStreamOptions | None = None
    request_id: str | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    priority: int = 0
    return_token_ids: bool | None = None
    """Echo the prompt ids as `prompt_token_ids` (first chunk when streaming)."""
    output_mode: Literal["tokens", "text", "derender"] = "tokens"
    tokenizer_version: str | None = None
    """tokenwire's addition: the version the ids belong to, checked when sent (vLLM clients
    do not send it; their ids then mean the model's own tokenizer)."""
    store: bool | None = None
    """tokenwire's addition (vLLM's request has no such field): keep the rollout, as chat's
    `store` keeps a completion: the prompt ids, each choice's sampled ids and the id that
    ended it, the request and the response, as `generate-tokens-<request_id>`; read, given a
    reward (its metadata) and deleted at `/v1/chat/completions/{id}`, exported by `tokenwire
    export-rollouts`."""
    metadata: Metadata | None = None
    """tokenwire's addition: kept with the rollout when `store` is true (OpenAI's limits)."""
    # vLLM features tokenwire does not implement: refused unless neutral
    features: Any = None
    content_parts: Any = None
    token_offsets: Any = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: Any = None
    parse_context: Any = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {
        "priority": (0,),
        "output_mode": ("tokens",),
        "features": (None,),
        "content_parts": (None,),
        "token_offsets": (None,),
        "kv_transfer_params": (None,),
        "ec_transfer_params": (None,),
        "reasoning_parser_kwargs": (None,),
        "parse_context": (None,),
    }


# -- responses --------------------------------------------------------------------------------


class GenerateLogprob(ResponseModel):
    omit_if_none = frozenset({"token_id", "token", "rank"})
    token_id: int | None = None
    """vLLM 0.32+."""
    token: str | None = None
    """`token_id:<id>`: vLLM up to 0.31, and the clients written for it (verifiers)."""
    logprob: float
    rank: int | None = None
    """1 for the most likely token (None when not known)."""


class GenerateLogprobEntry(GenerateLogprob):
    top_logprobs: list[GenerateLogprob] = []
    """The sampled token first, then the most likely ones (vLLM's order)."""


class GenerateLogprobs(ResponseModel):
    # a whole answer's entries come written in bulk (RawJSON: the same JSON, not in the schema)
    content: list[GenerateLogprobEntry] | SkipJsonSchema[RawJSON] | None = None


class GenerateChoice(ResponseModel):
    omit_if_none = frozenset({"sampling_mask", "routed_experts"})
    index: int
    finish_reason: str | None = None
    """"stop", "length" (or vLLM's "abort", "repetition"); on the last chunk of a stream."""
    stop_reason: int | str | None = None
    """The stop id or string that ended the choice; None for the model's main EOS."""
    token_ids: Ids | None = None
    """The sampled ids, the one that ended the output included (vLLM's convention); deltas
    when streaming."""
    logprobs: GenerateLogprobs | None = None
    weight_versions: list[WeightVersionSpan] | None = None
    """Which weights sampled which output tokens (indexes over the choice's whole output),
    where the engine says; on the finishing chunk of a stream (vLLM 0.32's convention)."""
    sampling_mask: list[list[int]] | None = None
    """Per output token (the one that ended the output included), the ids the sampler could
    have drawn it from, where the engine says (vLLM's `--return-sampling-mask`; tokenwire's
    `return_sampling_mask`); for the chunk's tokens when streaming."""
    routed_experts: str | None = None
    """An MoE model's expert choices (base64 `.npy`, vLLM's `--enable-return-routed-experts`),
    passed on from the upstream; on the finishing chunk of a stream."""


class _GenerateBase(ResponseModel):
    omit_if_none = frozenset({"prompt_token_ids", "tokenizer_version", "token_ids_source",
                              "usage", "model", "created", "prompt_logprobs", "warnings",
                              "logprobs_mode"})
    request_id: str
    model: str | None = None
    created: int | None = None
    usage: Usage | None = None
    prompt_token_ids: Ids | None = None
    output_mode: Literal["tokens"] = "tokens"
    choices: list[GenerateChoice]
    tokenizer_version: str | None = None
    """tokenwire's addition: the full version every id here belongs to."""
    token_ids_source: Literal["sampled", "translated", "retokenized"] | None = None
    warnings: list[ResponseWarning] | None = None
    logprobs_mode: str | None = None
    """When logprobs were asked for: what they are (vLLM's `--logprobs-mode` names:
    `raw_logprobs`, the model's distribution; `processed_logprobs`, the one the sampler drew
    from), where the engine says."""


class GenerateResponse(_GenerateBase):
    carries_raw = True
    prompt_logprobs: list[dict[str, GenerateLogprob] | None] | None = None
    """Per prompt position (the first is null): the prompt token and the most likely ones,
    keyed by id, as vLLM sends them."""


class GenerateStreamResponse(_GenerateBase):
    """One event: one choice's new ids; a last event with `choices: []` carries usage."""

    carries_raw = True
