"""From a request's sampling fields to one `SamplingParams` per choice, within the context."""

from __future__ import annotations

from ..engines.base import Grammar, SamplingParams
from ..errors import ContextLengthExceededError, InvalidRequestError

__all__ = ["choice_params", "completion_budget"]


_MASK64 = (1 << 64) - 1


def _seed32(seed: int) -> int:
    """A 64-bit seed mixed down (splitmix64) to the 32 bits llama.cpp takes, never its
    "random" value 0xFFFFFFFF: every distinct seed stays distinct and reproducible."""
    z = (seed + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z = (z ^ (z >> 31)) & 0xFFFFFFFF
    return z if z != 0xFFFFFFFF else 0xFFFFFFFE


def completion_budget(*, prompt_len: int, max_model_len: int, requested: int | None,
                      prompt_param: str, limit_param: str, cap: int | None = None) -> int:
    """How many tokens may be sampled: `requested`, or all the room the prompt leaves (within
    the server's `cap`)."""
    if cap is not None and requested is not None and requested > cap:
        raise InvalidRequestError(f"{limit_param} must be at most {cap} on this server",
                                  param=limit_param, code="invalid_value")
    room = max_model_len - prompt_len
    if requested is None:
        if room <= 0:
            raise ContextLengthExceededError(
                f"This model's maximum context length is {max_model_len} tokens. However, "
                f"your prompt resulted in {prompt_len} tokens, which leaves no room for a "
                "completion. Please reduce the length of the prompt.",
                param=prompt_param,
            )
        return room if cap is None else min(room, cap)
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
                  frequency_penalty: float = 0.0, prompt_logprobs: int | None = None,
                  stop_token_ids: frozenset[int] = frozenset(), ignore_eos: bool = False,
                  cache_salt: str | None = None, grammar: Grammar | None = None,
                  ) -> list[SamplingParams]:
    """Choice i draws with `seed + i`, so a seeded request is reproducible and its choices
    differ; without a seed every choice is left to the engine's own randomness (seed None, so
    an engine can tell a seeded request, which it must reproduce, from one that is not)."""
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise InvalidRequestError("seed must fit in 64 bits", param="seed", code="invalid_value")
    return [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            seed=_seed32(seed + i) if seed is not None else None,
            logprobs=logprobs,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            prompt_logprobs=prompt_logprobs,
            stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos,
            cache_salt=cache_salt,
            grammar=grammar,
        )
        for i in range(n)
    ]
