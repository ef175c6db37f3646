"""The trainer process as the HTTP processes reach it (rl/trainer.py is the process): found on
its socket in the run directory, or started (once per box: a lock file says which worker goes),
and asked over the embedded engine's frames. A call is answered "queued" as soon as the
trainer has it, then with its outcome."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ...engines.embedded._wire import Failure, frame, read_frame
from ...engines.upstream.board import RUN_DIR_ENV
from ...errors import EngineError

__all__ = ["TrainerProcess"]

START_TIMEOUT = 180.0
"""Seconds the trainer process may take to listen (torch's import)."""
ACK_TIMEOUT = 30.0
"""Seconds the trainer may take to say it has a call in its queue."""


class TrainerProcess:
    """The trainer process: found on its socket, or started."""

    def __init__(self, model_dir: Path, checkpoints: Path, served: Path | None):
        run_dir = os.environ.get(RUN_DIR_ENV)
        self._dir = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="tokenwire-tr-"))
        self._own_dir = not run_dir
        self.socket = str(self._dir / "trainer.sock")
        self._args = [str(model_dir), str(checkpoints), *([str(served)] if served else [])]
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = asyncio.Lock()

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_unix_connection(self.socket)
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        async with self._lock:
            await asyncio.to_thread(self._start)
        try:
            return await asyncio.open_unix_connection(self.socket)
        except OSError as exc:
            raise EngineError("the trainer process stopped listening as it started") from exc

    def _start(self) -> None:
        """Start the process unless another worker has (the lock file says who goes)."""
        with open(self._dir / "trainer.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._listening():
                return
            Path(self.socket).unlink(missing_ok=True)
            self._stop()  # one that died is reaped; one that hangs, stopped
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tokenwire.rl.trainer", self.socket, *self._args])
            deadline = time.monotonic() + START_TIMEOUT
            while not self._listening():
                if self._proc.poll() is not None:
                    raise EngineError(f"the trainer process exited ({self._proc.returncode}) "
                                      "before it listened: see the server's log")
                if time.monotonic() > deadline:
                    self._stop()
                    raise EngineError("the trainer process did not start in time")
                time.sleep(0.1)

    def _stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def _listening(self) -> bool:
        import socket

        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(self.socket)
            except OSError:
                return False
            return True

    async def submit(self, op: str, body: dict[str, Any]) -> asyncio.Future[Any]:
        """Queue the operation; the returned future is its outcome."""
        reader, writer = await self._open()
        try:
            writer.write(frame((op, body)))
            await writer.drain()
            ack = await asyncio.wait_for(read_frame(reader), ACK_TIMEOUT)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
            writer.close()
            raise EngineError("the trainer process did not take the call") from exc
        if ack != "queued":
            writer.close()
            raise EngineError(f"the trainer answered {ack!r}")

        async def outcome() -> Any:
            try:
                answer = await read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                raise EngineError("the trainer process ended before the call finished") \
                    from exc
            finally:
                writer.close()
            if isinstance(answer, Failure):
                raise answer.error()
            return answer

        return asyncio.ensure_future(outcome())

    async def aclose(self) -> None:
        await asyncio.to_thread(self._stop)
        if self._own_dir:
            with contextlib.suppress(OSError):
                for p in self._dir.iterdir():
                    p.unlink()
                self._dir.rmdir()
