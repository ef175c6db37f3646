"""Engines by name: `--engine NAME` picks one factory here, and nothing else chooses.

Each engine lives in one module; the factories import it only when chosen, so a gateway in
front of vLLM never loads llama.cpp and the embedded default never imports an HTTP engine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config import ENGINE_NAMES
from .base import Engine
from .spec import EngineSpec

__all__ = ["ENGINES", "EngineSpec", "create_engine"]


def _embedded(spec: EngineSpec) -> Engine:
    s = spec.settings
    if s.engine_process:
        from .embedded import embedded_engine

        return embedded_engine(s, spec.source.tokenizer)
    from .cpu import load_cpu_backend
    from .embedded import core_config
    from .embedded.core import llama_engine

    load_cpu_backend(s.cpu_variant)
    config = core_config(s, Path())  # no socket nor state file: the engine runs in this process
    return llama_engine(config, spec.source.tokenizer)


def _vllm(spec: EngineSpec) -> Engine:
    from .vllm import VllmEngine

    return VllmEngine(spec)


def _sglang(spec: EngineSpec) -> Engine:
    from .sglang import SGLangEngine

    return SGLangEngine(spec)


def _llama_server(spec: EngineSpec) -> Engine:
    from .llama_server import LlamaServerEngine

    return LlamaServerEngine(spec)


def _openai(spec: EngineSpec) -> Engine:
    from .openai import OpenAITextEngine

    return OpenAITextEngine(spec)


ENGINES: dict[str, Callable[[EngineSpec], Engine]] = {
    "embedded": _embedded,
    "vllm": _vllm,
    "sglang": _sglang,
    "llama-server": _llama_server,
    "openai": _openai,
}
assert tuple(ENGINES) == ENGINE_NAMES, "Settings.engine and the registry list the same names"


def create_engine(name: str, spec: EngineSpec) -> Engine:
    try:
        factory = ENGINES[name]
    except KeyError:
        raise ValueError(f"no engine {name!r}; known: {', '.join(ENGINES)}") from None
    return factory(spec)
