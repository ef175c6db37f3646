"""Engines: prompt ids in, sampled ids out (`Engine`); the embedded one is `llamacpp`."""

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
    "Engine",
    "EngineEvent",
    "EngineInfo",
    "FinishEvent",
    "PromptLogprobsEvent",
    "SamplingParams",
    "TokenEvent",
]
