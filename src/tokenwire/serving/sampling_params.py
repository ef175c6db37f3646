"""From a request's sampling fields to one `SamplingParams` per choice, within the context."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from ..engines.base import Grammar, SamplingParams
from ..engines.versions import WeightBound
from ..errors import ContextLengthExceededError, InvalidRequestError
from ..protocol.generate import GenerateSamplingParams
from ..protocol.sampling import VllmSamplingFields, WeightBoundFields

__all__ = ["VllmParams", "choice_params", "completion_budget", "truncate_prompt",
           "vllm_params", "weight_bound"]


_MASK64 = (1 << 64) - 1


def _seed32(seed: int) -> int:
    """A 64-bit seed mixed down (splitmix64) to the 32 bits llama.cpp takes, never its
    "random" value 0xFFFFFFFF. Reproducible, and nearby seeds (`seed + i` of a request's
    choices) land far apart; but 2^64 seeds cannot all stay distinct in 32 bits: two given
    seeds share a draw with a chance of about 2^-32."""
    z = (seed + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z = (z ^ (z >> 31)) & 0xFFFFFFFF
    return z if z != 0xFFFFFFFF else 0xFFFFFFFE


def completion_budget(*, prompt_len: int, max_model_len: int, requested: int | None,
                      prompt_param: str, limit_param: str, cap: int | None = None,
                      default: int | None = None) -> int:
    """How many tokens may be sampled: `requested`, or else `default` or all the room the
    prompt leaves, whichever is less (and within the server's `cap`)."""
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
        return min([room, *(c for c in (cap, default) if c)])
    if requested > room:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, "
            f"{requested} in the completion). Please reduce the length of the prompt or "
            "the completion.",
            param=limit_param if prompt_len < max_model_len else prompt_param,
        )
    return requested


def truncate_prompt(ids: list[int], keep: int | None, side: str | None, *,
                    max_model_len: int, reserve: int) -> list[int]:
    """vLLM's `truncate_prompt_tokens` (vllm/renderers/params.py): the last `keep` ids (the
    first, `side` "right"); -1 keeps as many as leave `reserve` tokens (the completion's
    limit) of room; more than that could never run."""
    if keep is None:
        return ids
    most = max_model_len - max(reserve, 1)
    if keep == 0 or keep > most:
        raise InvalidRequestError(
            f"truncate_prompt_tokens must be -1 or between 1 and {most} (the context, "
            f"{max_model_len}, less the completion's {max(reserve, 1)})",
            param="truncate_prompt_tokens", code="invalid_value")
    keep = most if keep == -1 else keep
    if len(ids) <= keep:
        return ids
    return ids[:keep] if side == "right" else ids[len(ids) - keep:]


def choice_params(*, n: int, max_tokens: int, temperature: float | None, top_p: float | None,
                  seed: int | None, logprobs: int | None, presence_penalty: float = 0.0,
                  frequency_penalty: float = 0.0, prompt_logprobs: int | None = None,
                  stop_token_ids: frozenset[int] = frozenset(), ignore_eos: bool = False,
                  cache_salt: str | None = None, grammar: Grammar | None = None,
                  extras: VllmParams | None = None,
                  ) -> list[SamplingParams]:
    """Choice i draws with `seed + i`, so a seeded request is reproducible and its choices
    differ; without a seed every choice is left to the engine's own randomness (seed None, so
    an engine can tell a seeded request, which it must reproduce, from one that is not)."""
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise InvalidRequestError("seed must fit in 64 bits", param="seed", code="invalid_value")
    fields: dict[str, Any] = {
        "max_tokens": max_tokens, "temperature": 1.0 if temperature is None else temperature,
        "top_p": 1.0 if top_p is None else top_p, "logprobs": logprobs,
        "presence_penalty": presence_penalty, "frequency_penalty": frequency_penalty,
        "prompt_logprobs": prompt_logprobs, "stop_token_ids": stop_token_ids,
        "ignore_eos": ignore_eos, "cache_salt": cache_salt, "grammar": grammar,
    }
    if extras is not None:
        fields.update(extras.engine_fields())
    return [SamplingParams(seed=_seed32(seed + i) if seed is not None else None, **fields)
            for i in range(n)]


@dataclass(frozen=True)
class VllmParams:
    """vLLM's sampling fields of a chat or completions request, checked."""

    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    cache_salt: str | None = None
    cache_key: str | None = None
    weight_bound: WeightBound | None = None
    adapter: str | None = None

    def engine_fields(self) -> dict[str, Any]:
        return {"top_k": self.top_k, "min_p": self.min_p,
                "repetition_penalty": self.repetition_penalty, "min_tokens": self.min_tokens,
                "logit_bias": self.logit_bias, "stop_token_ids": self.stop_token_ids,
                "ignore_eos": self.ignore_eos, "cache_salt": self.cache_salt,
                "cache_key": self.cache_key, "weight_bound": self.weight_bound,
                "adapter": self.adapter}


def vllm_params(req: VllmSamplingFields | GenerateSamplingParams,
                logit_bias: dict[str, float] | None, *, vocab_size: int, budget: int,
                cache_salt: str | None, cache_key: str | None = None,
                weight_bound: WeightBound | None = None, adapter: str | None = None,
                prefix: str = "") -> VllmParams:
    """Check vLLM's sampling fields (and OpenAI's `logit_bias`) against the model; `prefix`:
    where they sit in the request (`sampling_params.` on /inference/v1/generate)."""
    top_k = req.top_k or 0
    if top_k < -1:
        raise InvalidRequestError("top_k must be -1 or 0 (off) or at least 1",
                                  param=f"{prefix}top_k", code="invalid_value")
    if req.min_tokens > budget:
        raise InvalidRequestError(
            f"min_tokens ({req.min_tokens}) must be at most the completion's limit ({budget})",
            param=f"{prefix}min_tokens", code="invalid_value")
    return VllmParams(
        top_k=max(top_k, 0),
        min_p=req.min_p or 0.0,
        repetition_penalty=req.repetition_penalty if req.repetition_penalty is not None
        else 1.0,
        min_tokens=req.min_tokens,
        logit_bias=_logit_bias(logit_bias or {}, vocab_size, f"{prefix}logit_bias"),
        stop_token_ids=frozenset(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        cache_salt=cache_salt,
        cache_key=cache_key,
        weight_bound=weight_bound,
        adapter=adapter,
    )


def weight_bound(req: WeightBoundFields, settings: Settings) -> WeightBound | None:
    """The weights a request may be served by: its own bound, else the server's policy."""
    if req.min_weight_version is None and req.max_staleness is None:
        return settings.weight_bound
    return WeightBound(req.min_weight_version, req.max_staleness, settings.weight_version_wait)


_MAX_BIASES = 300  # OpenAI's limit


def _logit_bias(bias: dict[str, float], vocab_size: int,
                param: str) -> tuple[tuple[int, float], ...]:
    if len(bias) > _MAX_BIASES:
        raise InvalidRequestError(f"logit_bias holds at most {_MAX_BIASES} ids",
                                  param=param, code="invalid_value")
    out: dict[int, float] = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()) or len(key) > 10:
            raise InvalidRequestError(f"logit_bias keys are token ids in decimal, not {key!r}",
                                      param=param, code="invalid_value")
        token = int(key)
        if token >= vocab_size or token in out:
            raise InvalidRequestError(
                f"logit_bias id {key} is out of range (the vocabulary has {vocab_size} ids)"
                if token >= vocab_size else f"logit_bias names id {token} twice",
                param=param, code="invalid_value")
        if not (math.isfinite(value) and -100 <= value <= 100):
            raise InvalidRequestError(f"logit_bias values lie in [-100, 100], not {value}",
                                      param=f"{param}.{key}", code="invalid_value")
        out[token] = float(value)
    return tuple(sorted(out.items()))
