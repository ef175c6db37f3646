"""Engines: prompt ids in, sampled ids out. A name -> factory registry picks one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import (
    Engine,
    EngineEvent,
    EngineInfo,
    FinishEvent,
    PromptLogprobsEvent,
    SamplingParams,
    TokenEvent,
)

__all__ = [
    "ENGINES",
    "Engine",
    "EngineEvent",
    "EngineInfo",
    "FinishEvent",
    "PromptLogprobsEvent",
    "SamplingParams",
    "TokenEvent",
]


def _llamacpp(**kwargs: Any) -> Engine:
    from .llamacpp import LlamaCppEngine

    return LlamaCppEngine(**kwargs)


#: engine name -> factory (imports stay lazy: an engine's library loads only when it is used)
ENGINES: dict[str, Callable[..., Engine]] = {"llamacpp": _llamacpp}
