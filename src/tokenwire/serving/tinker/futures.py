"""Tinker's futures where every worker of the box sees them: files in the run directory.

`asample` answers at once with a future's id; the SDK then asks for it (`retrieve_future`) on
whichever worker its connection lands on. The worker that runs the sample writes the outcome
as a file (`<id>.pb`, the finished `SampleResponse` with `<id>.json` its headers; or `<id>.err`,
the failure), renamed into place so that a reader never sees half of one; `<id>.pending` says
the id is ours while it runs. A reader in the same worker is woken at once; one in another
worker looks again every `POLL` seconds. Outcomes are kept `KEEP` seconds after they are
written (the SDK may ask twice after a broken connection), then swept.

Without workers (one process) the directory is a temporary one of the app's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ...engines.upstream.board import RUN_DIR_ENV
from ...errors import TokenwireError

__all__ = ["Failed", "Finished", "FutureBox", "Pending"]

POLL = 0.02
"""Seconds between two looks at the directory for a future another worker runs."""
KEEP = 600.0
"""Seconds an outcome is kept after it is written."""
SWEEP_EVERY = 60.0


@dataclass(frozen=True)
class Finished:
    payload: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class Failed:
    error: str
    category: str


class Pending:
    """Not finished within the wait."""


class FutureBox:
    def __init__(self, directory: Path | None = None):
        run_dir = os.environ.get(RUN_DIR_ENV)
        self._own = directory is None and not run_dir
        if directory is None:
            directory = Path(run_dir) / "tinker-futures" if run_dir else \
                Path(tempfile.mkdtemp(prefix="tokenwire-tinker-"))
        directory.mkdir(parents=True, exist_ok=True)
        self._dir = directory
        self._done: dict[str, asyncio.Event] = {}
        """The futures this worker runs, set when their outcome is written."""
        self._swept = time.monotonic()

    def new(self) -> str:
        """A new future's id, known to every worker from now on."""
        self._sweep()
        fid = f"tw-{uuid.uuid4().hex}"
        (self._dir / f"{fid}.pending").touch()
        self._done[fid] = asyncio.Event()
        return fid

    def finish(self, fid: str, payload: bytes, headers: dict[str, str]) -> None:
        self._write(fid, ".json", json.dumps(headers).encode())
        self._write(fid, ".pb", payload)
        self._settled(fid)

    def fail(self, fid: str, error: str, category: str) -> None:
        self._write(fid, ".err", json.dumps({"error": error, "category": category}).encode())
        self._settled(fid)

    def fail_with(self, fid: str, exc: TokenwireError) -> None:
        """A refusal or failure on the future, in the SDK's categories: a full queue is the
        server's moment, not the request's fault ("retry": the SDK sends it again, a 410 on its
        future); other refusals are the request's ("user"), failures ours ("server")."""
        said = f"{exc.message} ({exc.param})" if exc.param else exc.message
        category = "retry" if exc.status_code == 429 else \
            "user" if exc.status_code < 500 else "server"
        self.fail(fid, said, category)

    def known(self, fid: str) -> bool:
        return "/" not in fid and any(
            (self._dir / f"{fid}{ext}").exists() for ext in (".pending", ".pb", ".err"))

    async def wait(self, fid: str, timeout: float) -> Finished | Failed | Pending:
        """The future's outcome, or `Pending` once `timeout` seconds have passed."""
        deadline = time.monotonic() + timeout
        event = self._done.get(fid)
        while True:
            outcome = self._read(fid)
            if outcome is not None:
                return outcome
            left = deadline - time.monotonic()
            if left <= 0:
                return Pending()
            if event is not None:
                try:
                    await asyncio.wait_for(event.wait(), left)
                except TimeoutError:
                    return Pending()
            else:
                await asyncio.sleep(min(POLL, left))

    def close(self) -> None:
        if self._own:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _read(self, fid: str) -> Finished | Failed | None:
        try:
            err = (self._dir / f"{fid}.err").read_bytes()
        except FileNotFoundError:
            pass
        else:
            body = json.loads(err)
            return Failed(body["error"], body["category"])
        try:
            payload = (self._dir / f"{fid}.pb").read_bytes()
        except FileNotFoundError:
            return None
        return Finished(payload, json.loads((self._dir / f"{fid}.json").read_bytes()))

    def _write(self, fid: str, ext: str, data: bytes) -> None:
        tmp = self._dir / f".{fid}{ext}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self._dir / f"{fid}{ext}")

    def _settled(self, fid: str) -> None:
        (self._dir / f"{fid}.pending").unlink(missing_ok=True)
        event = self._done.pop(fid, None)
        if event is not None:
            event.set()

    def _sweep(self) -> None:
        """Outcomes older than KEEP removed (at most once a minute, on a new future)."""
        now = time.monotonic()
        if now - self._swept < SWEEP_EVERY:
            return
        self._swept = now
        cutoff = time.time() - KEEP
        for path in self._dir.iterdir():
            if path.suffix in (".pb", ".json", ".err"):
                try:
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                except FileNotFoundError:
                    pass
