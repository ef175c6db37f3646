"""The embedded engine (llama.cpp) in a process of its own: `EmbeddedEngine` is what the HTTP
processes hold (engine.py), core.py the engine process, supervisor.py what starts and restarts
it, _wire.py the frames between them. docs/reliability.md says what a client sees when the
engine process dies."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from ...config import Settings
from ...tokenizers.hf import HFTokenizer
from .core import CoreConfig
from .engine import EmbeddedEngine

__all__ = ["ENGINE_DIR_ENV", "EmbeddedEngine", "core_config",
           "embedded_engine", "exit_on_give_up", "gave_up", "give_up", "status_path"]

ENGINE_DIR_ENV = "TOKENWIRE_ENGINE_DIR"
"""Set by `--workers`' supervisor, which runs the engine processes: its workers connect to the
sockets there instead of starting engines of their own."""

_gave_up: list[str] = []
_stop: list[Callable[[], None]] = []


def exit_on_give_up(stop: Callable[[], None]) -> None:
    """The serve command's: an engine process that cannot be restarted ends the server
    (`stop` asks it to shut down; the command then exits non-zero: `gave_up`)."""
    _stop[:] = [stop]


def gave_up() -> list[str]:
    """Why engines of this process could not be restarted."""
    return list(_gave_up)


def give_up(why: str) -> None:
    """A supervisor's `on_give_up` (from its thread): recorded, and the server asked to stop
    if the serve command said how (`exit_on_give_up`)."""
    _gave_up.append(why)
    for stop in _stop:
        stop()


def core_config(settings: Settings, run_dir: Path) -> CoreConfig:
    """The engine process's settings and files for one served model."""
    path = settings.model_path()
    name = hashlib.sha256(f"{path}\0{settings.served_model_name}".encode()).hexdigest()[:10]
    return CoreConfig(
        model=str(path), socket=str(run_dir / f"engine-{name}.sock"),
        state=str(run_dir / f"engine-{name}.state.json"), model_id=settings.served_model_name,
        max_model_len=settings.max_model_len, n_parallel=settings.n_parallel,
        n_batch=settings.n_batch, n_threads=settings.n_threads, max_queued=settings.max_queued,
        prefix_cache=settings.prefix_cache, deterministic=settings.deterministic,
        logprobs_mode=settings.logprobs_mode, sampling_mask=settings.return_sampling_mask,
        cpu_variant=settings.cpu_variant)


def status_path(config: CoreConfig) -> Path:
    return Path(config.socket).with_suffix(".status.json")


def embedded_engine(settings: Settings, tokenizer: HFTokenizer | None) -> EmbeddedEngine:
    shared = os.environ.get(ENGINE_DIR_ENV)
    run_dir = Path(shared) if shared else Path(tempfile.mkdtemp(prefix="tokenwire-engine-"))
    config = core_config(settings, run_dir)
    return EmbeddedEngine(config, status_path(config), own=not shared, tokenizer=tokenizer,
                          on_give_up=give_up)
