"""Start the engine process, and start it again when it dies.

`start` blocks until the process serves or has failed: a failure at the first start (the
self-check's crash included) is one `EngineStartError` line naming the CPU, the ggml variant
and the likely cause. Afterwards a thread waits on the process; when it dies (SIGSEGV, SIGILL,
SIGKILL, the OOM killer) it is started again after a back-off, and `MAX_FAILED_STARTS` failed
starts in a row give up: one error in the log, the state "failed", and `on_give_up` (the serve
command ends the server, which then exits non-zero). What the HTTP processes read about it
(`/health`, `/metrics`) is in the status file, written here and nowhere else.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import EngineStartError
from .core import START_ENV, CoreConfig

__all__ = ["MAX_FAILED_STARTS", "Supervisor", "exit_reason", "read_status"]

log = logging.getLogger(__name__)

MAX_FAILED_STARTS = 5
BACKOFF = (0.2, 0.5, 1.0, 2.0, 4.0)
"""Seconds before each try of a restart (the last one repeats)."""


def exit_reason(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def read_status(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {"state": "starting"}


def _hint(stage: str, backend: str, reason: str) -> str:
    if stage not in ("self-check", "loading") or reason not in ("SIGSEGV", "SIGILL", "SIGBUS"):
        return ""
    if reason == "SIGILL":
        return (" (an instruction this CPU lacks: a llama-cpp-python built for another CPU; "
                "`make install` builds one that picks its kernels at start)")
    return (" (the CPU kernels crash on this CPU: with `built-in` or `sapphirerapids` on an "
            "Intel Xeon with AMX, ggml's AMX path, llama.cpp #20824; `make install` builds "
            "llama-cpp-python without it, or set TOKENWIRE_CPU_VARIANT to zen4 or icelake)")


class Supervisor:
    def __init__(self, config: CoreConfig, status: Path,
                 on_give_up: Callable[[str], None] | None = None):
        self._config = config
        self._status_path = status
        self._on_give_up = on_give_up
        self._proc: subprocess.Popen[bytes] | None = None
        self._starts = 0
        self._restarts = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._status: dict[str, Any] = {}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """The first start (blocking): raises `EngineStartError` with the reason."""
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name="engine-supervisor",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        self._write(state="stopped")

    def _write(self, **fields: Any) -> None:
        self._status.update(fields, restarts=self._restarts)
        tmp = self._status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._status))
        tmp.replace(self._status_path)

    def _spawn(self) -> None:
        self._starts += 1
        Path(self._config.socket).unlink(missing_ok=True)
        env = {**os.environ, START_ENV: str(self._starts)}
        proc = subprocess.Popen([sys.executable, "-m", "tokenwire.engines.embedded",
                                 self._config.to_json()], stdout=subprocess.PIPE, env=env,
                                )
        self._proc = proc
        assert proc.stdout is not None
        stage, backend, error = "starting", "", ""
        for line in proc.stdout:
            said = json.loads(line)
            if said["stage"] == "failed":
                error = said["error"]
                continue
            stage = said["stage"]
            backend = said.get("backend", backend)
            if stage == "ready":
                proc.stdout.close()
                self._write(state="up", pid=proc.pid, backend=backend, since=time.time())
                log.info("engine process %d serves (%s)", proc.pid, backend)
                return
        code = proc.wait()
        reason = exit_reason(code)
        where = {"starting": "starting", "loading": "loading the model",
                 "self-check": "decoding its start-up check batch"}.get(stage, stage)
        raise EngineStartError(
            f"the engine process {'failed' if error else 'died'} ({error or reason}) while "
            f"{where} on {backend or 'this CPU'}{_hint(stage, backend, reason)}")

    def _watch(self) -> None:
        while not self._stopping.is_set():
            proc = self._proc
            assert proc is not None
            code = proc.wait()
            if self._stopping.is_set():
                return
            reason = exit_reason(code)
            self._restarts += 1
            log.error("the engine process %d died (%s); restarting it", proc.pid, reason)
            self._write(state="restarting", pid=None, last_exit=reason)
            failures = 0
            while not self._stopping.is_set():
                if self._stopping.wait(BACKOFF[min(failures, len(BACKOFF) - 1)]):
                    return
                try:
                    self._spawn()
                    break
                except (EngineStartError, OSError) as exc:
                    failures += 1
                    log.error("restarting the engine failed (%d of %d): %s", failures,
                              MAX_FAILED_STARTS, exc)
                    if failures >= MAX_FAILED_STARTS:
                        why = f"the engine failed to start {failures} times in a row: {exc}"
                        self._write(state="failed", last_exit=str(exc))
                        log.critical("giving up: %s", why)
                        if self._on_give_up is not None:
                            self._on_give_up(why)
                        return
