"""The contenders of bench/compare.py as processes on loopback: each in a process group of its
own (and told to die with the benchmark), ready once its health route answers, stopped as a
whole group however the benchmark ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

__all__ = ["Server", "StartError", "clean_env", "free_port"]

_PR_SET_PDEATHSIG = 1
# inherited settings would configure a server behind the benchmark's back
_SETTING_PREFIXES = ("TOKENWIRE_", "LLAMA_ARG_")


class StartError(Exception):
    """A contender that did not come up; the message says why (the end of its log)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without tokenwire's or llama-server's settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SETTING_PREFIXES)}
    return {**env, **extra}


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the benchmark goes, even by SIGKILL (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


@dataclass
class Server:
    """One contender's server process. `ready` is a GET path that answers 200 once it serves."""

    name: str
    cmd: list[str]
    port: int
    ready: str
    log: Path
    env: dict[str, str] = field(default_factory=clean_env)
    proc: subprocess.Popen[bytes] | None = None
    model: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300) -> None:
        try:
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True,
                                             preexec_fn=_die_with_parent)
        except OSError as exc:
            raise StartError(f"cannot run {self.cmd[0]}: {exc}") from exc
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.url + self.ready, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace").strip().splitlines()[-12:]
                raise StartError("\n".join(tail) or f"exited with {self.proc.returncode}")
            time.sleep(0.25)
        models = httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"]
        self.model = models[0]["id"]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to the whole process group, SIGKILL after 15 s."""
        if self.proc is None or self.proc.returncode is not None:
            return
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 30.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue

    def _procs(self) -> list[psutil.Process]:
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def rss(self) -> int:
        """Resident bytes of the server and any children."""
        total = 0
        for p in self._procs():
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def cpu_seconds(self) -> float:
        total = 0.0
        for p in self._procs():
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total
