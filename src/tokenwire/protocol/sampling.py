"""vLLM's extra request fields, shared by chat and completions (its `ChatCompletionRequest`
and `CompletionRequest`, vllm/entrypoints/openai/{chat_completion,completion}/protocol.py).

Each is honoured, accepted because it cannot change the output, or refused by name unless it
holds its neutral value (`unsupported`); docs/api/chat.md has the table.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictInt

from ._base import RequestModel
from .common import TokenId

__all__ = ["VllmSamplingFields", "WeightBoundFields"]


class WeightBoundFields(RequestModel):
    """Which weights may serve the request (tokenwire's; smg's version policies as fields): a
    gateway routes it only to replicas within the bound, waiting up to the server's
    `weight_version_wait` for one, then 409 `weight_version_unavailable`."""

    min_weight_version: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """Weights labelled this version, or a later one (in the order the fleet was given them)."""
    max_staleness: Annotated[int, Field(ge=0)] | None = None
    """At most this many versions behind the newest a replica serves (0: the newest only)."""


class VllmSamplingFields(WeightBoundFields):
    # honoured
    top_k: StrictInt | None = None
    """Draw among the k most likely ids; 0 or -1 (vLLM's two spellings) is off."""
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    """Draw among ids at least this many times as likely as the most likely one."""
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    """vLLM's: ids seen in the prompt or the output get their logit divided by it (multiplied
    where negative); 1 is off."""
    stop_token_ids: list[TokenId] | None = None
    """Ids that end the output like the model's end-of-generation id."""
    ignore_eos: bool = False
    """Sample past the model's end-of-generation ids (`stop_token_ids` still stop)."""
    min_tokens: Annotated[int, Field(ge=0)] = 0
    """No stop id is sampled before this many tokens."""
    skip_special_tokens: bool | None = None
    """`true`: control tokens (other than the one that ended the output) are left out of the
    text (their ids stay in `token_ids`); default and `false`: the text is exactly the ids'."""
    include_stop_str_in_output: bool = False
    """The stop string that ended a choice stays in its text (and the token that completed it
    in its ids)."""
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    """Keep only this many prompt tokens (-1: the model's context), cut at `truncation_side`."""
    truncation_side: Literal["left", "right"] | None = None
    """Which end `truncate_prompt_tokens` cuts (default "left": the last tokens stay)."""
    request_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """The response `id` is built from it (`chatcmpl-<request_id>`, `cmpl-<request_id>`)."""
    # accepted: they cannot change the output
    cache_salt: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    """Requests reuse only cached prefixes of requests with the same salt."""
    spaces_between_special_tokens: bool = True
    """Only slow tokenizers' decoding reads it; tokenwire's text is byte-exact either way."""
    stream_interval: Annotated[int, Field(ge=1)] | None = None
    session_id: str | None = None
    routed_experts_prompt_start: Annotated[int, Field(ge=0)] = 0
    return_token_offsets: bool | None = None
    return_mm_kwargs: bool = True
    # refused unless neutral
    priority: StrictInt = 0
    """vLLM refuses a priority other than 0 without priority scheduling, which tokenwire does
    not have."""
    use_beam_search: bool = False
    length_penalty: float = 1.0
    allowed_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    logprob_token_ids: list[TokenId] | None = None
    structured_outputs: dict[str, Any] | None = None
    thinking_token_budget: int | None = None
    repetition_detection: dict[str, Any] | None = None
    watermarking: bool | None = None
    vllm_xargs: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    return_prompt_text: bool | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {
        "priority": (0,),
        "use_beam_search": (False,),
        "length_penalty": (1.0,),
        "allowed_token_ids": (None,),
        "bad_words": (None, []),
        "logprob_token_ids": (None,),
        "structured_outputs": (None,),
        "thinking_token_budget": (None,),
        "repetition_detection": (None,),
        "watermarking": (None, False),
        "vllm_xargs": (None, {}),
        "kv_transfer_params": (None,),
        "ec_transfer_params": (None,),
        "return_prompt_text": (None, False),
        "mm_processor_kwargs": (None, {}),
        "media_io_kwargs": (None, {}),
    }
