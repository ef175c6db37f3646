"""Engines: prompt ids in, sampled ids out (`Engine`); chosen by name in `registry`."""

from .base import (
    Engine,
    EngineEvent,
    EngineHealth,
    EngineInfo,
    EngineStartError,
    EventStream,
    FinishEvent,
    PromptLogprobsEvent,
    ReplicaHealth,
    ReplicaLostError,
    SamplingParams,
    TokenEvent,
    TokenRun,
)

__all__ = [
    "Engine",
    "EngineEvent",
    "EngineHealth",
    "EngineInfo",
    "EngineStartError",
    "EventStream",
    "FinishEvent",
    "PromptLogprobsEvent",
    "ReplicaHealth",
    "ReplicaLostError",
    "SamplingParams",
    "TokenEvent",
    "TokenRun",
]
