"""The `Engine` protocol: prompt ids and sampling parameters in, sampled ids out.

Engines know nothing of HTTP, chat templates or text: serving code hands them token ids and
consumes a stream of domain events. Closing the iterator early (a client went away, a stop
string matched) cancels the sequence and frees its slot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "Engine",
    "EngineEvent",
    "EngineInfo",
    "FinishEvent",
    "PromptLogprobsEvent",
    "SamplingParams",
    "TokenEvent",
]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    """Most tokens to sample, the end-of-generation token included (0: only score the prompt)."""
    temperature: float = 1.0
    """0 means greedy (argmax)."""
    top_p: float = 1.0
    seed: int | None = None
    """Seed of the sampler's random generator; None: a random seed."""
    logprobs: int | None = None
    """None: no logprobs; k >= 0: the chosen token's logprob and the k most likely tokens'."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    prompt_logprobs: int | None = None
    """None: none; k >= 0: each prompt token's logprob given its prefix, and the k most likely
    tokens there (scoring, `echo` with logprobs). Delivered in one `PromptLogprobsEvent`."""


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One sampled token. Logprobs are of the model's raw distribution (before temperature)."""

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class FinishEvent:
    reason: Literal["stop", "length"]
    stop_token: TokenEvent | None = None
    """The end-of-generation token the model sampled ("stop"); it is not part of the output."""


@dataclass(frozen=True, slots=True)
class PromptLogprobsEvent:
    """Logprobs of prompt tokens 1..n-1 (the first has no prefix to be predicted from)."""

    entries: tuple[TokenEvent, ...]


EngineEvent = TokenEvent | FinishEvent | PromptLogprobsEvent


@dataclass(frozen=True)
class EngineInfo:
    model: str
    """The served model's id (`model` in requests)."""
    max_model_len: int
    """Most tokens (prompt + output) one sequence may hold."""
    vocab_size: int
    eog_ids: frozenset[int] = field(default_factory=frozenset)
    """End-of-generation tokens: sampling one ends the output with finish_reason "stop"."""
    max_sequences: int | None = None
    """Most sequences the engine holds at once, running and waiting (None: no fixed bound)."""


@runtime_checkable
class Engine(Protocol):
    @property
    def info(self) -> EngineInfo: ...

    def generate(self, prompt: Sequence[int], params: SamplingParams) -> AsyncIterator[EngineEvent]:
        """Sample a continuation of `prompt`; ends after exactly one `FinishEvent`."""
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...
