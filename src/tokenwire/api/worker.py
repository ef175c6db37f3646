"""`tokenwire serve --workers N`: N serving processes on one port, and what they share.

The parent binds the port, checks that the models load (one clear line if not), and hands the
socket to uvicorn's supervisor, which starts N processes (spawned: nothing of the parent's
state is inherited by accident), restarts one that dies and stops them all on SIGINT/SIGTERM.
Each worker builds the app from the same settings (`app`, uvicorn's factory) with its own event
loop, connections and tokenizers. What must not diverge lives in the run directory, a fresh
one per start, removed at the end:
- each engine's board (engines/upstream/board.py): load, replicas found down, the fleet's
  control state;
- prometheus_client's multiprocess files, so one scrape of `/metrics` at any worker counts every
  worker's requests (metrics.py).
The kernel spreads connections over the workers (one accept queue); a client's keep-alive
connection stays with one worker.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from ..config import Settings
from ..engines.embedded import (
    ENGINE_DIR_ENV,
    core_config,
    exit_on_give_up,
    gave_up,
    give_up,
    status_path,
)
from ..engines.embedded.supervisor import Supervisor
from ..engines.upstream.board import RUN_DIR_ENV
from ..errors import EngineStartError
from ..metrics import SHARED_DIR_ENV
from .startup import configure_logging, preload

__all__ = ["SETTINGS_ENV", "app", "supervise"]

SETTINGS_ENV = "TOKENWIRE_WORKER_SETTINGS"
"""The serve command's own settings (JSON), for its workers; the environment carries the rest."""

log = logging.getLogger(__name__)


def supervise(settings: Settings, overrides: dict[str, Any]) -> int:
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    run_dir = Path(tempfile.mkdtemp(prefix="tokenwire-"))
    (run_dir / "metrics").mkdir()
    engines: list[Supervisor] = []
    try:
        if not _start_engines(settings, run_dir, engines) or not asyncio.run(_check(settings)):
            return 1
        os.environ.update({RUN_DIR_ENV: str(run_dir), SHARED_DIR_ENV: str(run_dir / "metrics"),
                           SETTINGS_ENV: json.dumps(overrides, default=str)})
        config = uvicorn.Config("tokenwire.api.worker:app", factory=True, host=settings.host,
                                port=settings.port, workers=settings.max_workers,
                                log_level=settings.log_level, timeout_graceful_shutdown=30)
        supervisor = Multiprocess(config, sockets=[config.bind_socket()])
        # an engine process that cannot be restarted ends the server (then exit 1)
        exit_on_give_up(supervisor.should_exit.set)
        if gave_up():
            return 1
        supervisor.run()
        failed = any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes)
        return 1 if failed or gave_up() else 0
    finally:
        for engine in engines:
            engine.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def _start_engines(settings: Settings, run_dir: Path, started: list[Supervisor]) -> bool:
    """The embedded models' engine processes, run here for every worker (which connect to
    their sockets in `run_dir`); False after one clear line when one cannot start."""
    for model in settings.model_settings():
        if model.engine != "embedded":
            continue
        config = core_config(model, run_dir)
        engine = Supervisor(config, status_path(config), on_give_up=give_up)
        try:
            engine.start()
        except EngineStartError as exc:
            print(f"tokenwire serve: not starting: {exc}", file=sys.stderr)
            return False
        started.append(engine)
    if started:
        os.environ[ENGINE_DIR_ENV] = str(run_dir)
    return True


async def _check(settings: Settings) -> bool:
    """The models load and their engines start (upstreams verified), or one clear line says
    why not; then they are closed: each worker loads its own."""
    loaded = await preload(settings)
    if loaded is None:
        return False
    for m in loaded[0].all():
        await m.engine.aclose()
    return True


def _die_with_parent() -> None:
    """A worker whose supervisor is killed (SIGKILL: no chance to stop it) must not keep the
    port: Linux's parent-death signal ends it."""
    if sys.platform != "linux":
        return
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the parent died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def app() -> Starlette:
    """One worker's app (uvicorn's factory): the models load in its lifespan."""
    from .app import create_app

    _die_with_parent()
    settings = Settings(**json.loads(os.environ[SETTINGS_ENV]))
    configure_logging(settings)
    return create_app(settings)
