"""From a request's sampling fields to one `SamplingParams` per choice, within the context."""

from __future__ import annotations

import secrets

from ..engines.base import SamplingParams
from ..errors import ContextLengthExceededError, InvalidRequestError

__all__ = ["choice_params", "completion_budget"]


def completion_budget(*, prompt_len: int, max_model_len: int, requested: int | None,
                      prompt_param: str, limit_param: str) -> int:
    """How many tokens may be sampled: `requested`, or all the room the prompt leaves."""
    room = max_model_len - prompt_len
    if requested is None:
        if room <= 0:
            raise ContextLengthExceededError(
                f"This model's maximum context length is {max_model_len} tokens. However, "
                f"your prompt resulted in {prompt_len} tokens, which leaves no room for a "
                "completion. Please reduce the length of the prompt.",
                param=prompt_param,
            )
        return room
    if requested > room:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, "
            f"{requested} in the completion). Please reduce the length of the prompt or "
            "the completion.",
            param=limit_param if prompt_len < max_model_len else prompt_param,
        )
    return requested


def choice_params(*, n: int, max_tokens: int, temperature: float | None, top_p: float | None,
                  seed: int | None, logprobs: int | None, presence_penalty: float = 0.0,
                  frequency_penalty: float = 0.0,
                  prompt_logprobs: int | None = None) -> list[SamplingParams]:
    """Choice i draws with `seed + i`, so a seeded request is reproducible and its choices
    differ; without a seed every choice gets a fresh random one."""
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise InvalidRequestError("seed must fit in 64 bits", param="seed", code="invalid_value")
    base = seed if seed is not None else secrets.randbits(32)
    return [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            seed=(base + i) & 0xFFFFFFFF,
            logprobs=logprobs,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            prompt_logprobs=prompt_logprobs,
        )
        for i in range(n)
    ]
