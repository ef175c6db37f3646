"""What the serving processes of one box (`tokenwire serve --workers N`) know of a fleet together.

Each worker has its own event loop, connections, router and health checks; what must not
diverge between them lives here, in one small memory-mapped file per engine in the server's run
directory (`TOKENWIRE_RUN_DIR`, made by the supervising process):
- the requests in flight and served per replica: each worker writes only its own row (no lock,
  one writer per cell), readers sum the rows, so the load guard sees the box's load;
- a replica found down: one worker's finding (a failed request, a broken stream) takes it out
  of every worker's rotation at once; each worker brings it back by its own health check, which
  verifies it again (each needs the replica's answers anyway);
- the fleet's control state (paused and how, the weight version), which a control call sets
  through whichever worker took it and every worker's health check applies to a rejoining
  replica; and the replicas a rolling update holds out of routing while it updates them.
Strings and worker slots change under an `flock`; counters do not. A worker's row is claimed by
its pid at start; a dead worker's row is taken over by the next worker to start (uvicorn
restarts it). One worker (no run directory): the same layout in anonymous memory.

Nothing is shared across boxes: several boxes behind a load balancer agree by construction
where they must (prefix affinity is rendezvous hashing of the prompt's leading ids; the fleet's
state is each replica's own, re-read at join) and otherwise each box guards its own load.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["MAX_LABEL", "RUN_DIR_ENV", "Board"]

RUN_DIR_ENV = "TOKENWIRE_RUN_DIR"
"""Where the supervising process keeps what its workers share (boards, metrics)."""

_MAGIC = 0x74776272_64000002  # "twbrd" and the layout's version
_TEXT = 1024  # bytes of a reason or a version label (with its length)
MAX_LABEL = _TEXT - 2
"""The longest weight version label (bytes of UTF-8) the fleet remembers."""
_PAUSE_MODES = ("", "abort", "wait", "keep")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Board:
    """One engine's shared fleet state, for `n_replicas` replicas and up to `max_workers`
    workers."""

    def __init__(self, key: Sequence[str], n_replicas: int, max_workers: int = 1):
        run_dir = os.environ.get(RUN_DIR_ENV)
        self._n = n_replicas
        self._w = max(1, max_workers)
        # cells (int64): magic, fleet paused mode, version length, then per worker: pid,
        # in flight [n], served [n]; then per replica: down count; then per replica: held
        self._row = 1 + 2 * n_replicas
        self._down_at = 3 + self._w * self._row
        self._held_at = self._down_at + n_replicas
        cells = self._held_at + n_replicas
        self._text_at = cells * 8
        size = self._text_at + _TEXT * (1 + n_replicas)
        self._fd: int | None = None
        if run_dir:
            name = hashlib.blake2b("\0".join(key).encode(), digest_size=8).hexdigest()
            self._fd = os.open(Path(run_dir) / f"board-{name}", os.O_RDWR | os.O_CREAT, 0o600)
            with self._locked():
                if os.fstat(self._fd).st_size < size:
                    os.ftruncate(self._fd, size)
            self._map = mmap.mmap(self._fd, size)
        else:
            self._map = mmap.mmap(-1, size)
        self._cells = memoryview(self._map).cast("B").cast("q")
        with self._locked():
            if self._cells[0] != _MAGIC:  # the first worker to open it: all zeros
                self._cells[0] = _MAGIC
            self._slot = self._claim()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._fd is None:
            yield
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _claim(self) -> int:
        """This process's row: its own from before, else a free one, else a dead worker's
        (its counts go with it: its connections closed when it died)."""
        c, me = self._cells, os.getpid()
        rows = [3 + w * self._row for w in range(self._w)]
        for at in rows:
            if c[at] == me:
                return at
        free = next((at for at in rows if c[at] == 0), None)
        if free is None:
            free = next((at for at in rows if not _alive(c[at])), None)
        if free is None:
            raise RuntimeError(f"more than {self._w} workers share this server's run directory")
        c[free:free + self._row] = memoryview(bytes(8 * self._row)).cast("q")
        c[free] = me
        return free

    def close(self) -> None:
        """This worker stops: its row (and its counts) free for the next."""
        with self._locked():
            self._cells[self._slot:self._slot + self._row] = memoryview(
                bytes(8 * self._row)).cast("q")

    # -- load ----------------------------------------------------------------------------------

    def enter(self, replica: int) -> None:
        """A request of this worker is in flight on `replica`."""
        self._cells[self._slot + 1 + replica] += 1

    def leave(self, replica: int) -> None:
        self._cells[self._slot + 1 + replica] -= 1

    def count_served(self, replica: int) -> None:
        self._cells[self._slot + 1 + self._n + replica] += 1

    def _total(self, offset: int) -> int:
        c = self._cells
        return sum(c[3 + w * self._row + offset] for w in range(self._w))

    def in_flight(self, replica: int) -> int:
        """Requests in flight on `replica` from every worker of the box."""
        return self._total(1 + replica)

    def served(self, replica: int) -> int:
        return self._total(1 + self._n + replica)

    # -- health --------------------------------------------------------------------------------

    def downs(self, replica: int) -> int:
        """How often `replica` was found down (by any worker): a worker that saw it up at an
        older count must check it again."""
        return self._cells[self._down_at + replica]

    def found_down(self, replica: int, reason: str) -> int:
        with self._locked():
            self._cells[self._down_at + replica] += 1
            self._write_text(1 + replica, reason)
            return self._cells[self._down_at + replica]

    def down_reason(self, replica: int) -> str:
        with self._locked():
            return self._read_text(1 + replica)

    def held(self, replica: int) -> bool:
        """Held out of routing by a rolling update (whichever worker runs it)."""
        return bool(self._cells[self._held_at + replica])

    def hold(self, replica: int, held: bool) -> None:
        self._cells[self._held_at + replica] = int(held)

    # -- the fleet's control state -------------------------------------------------------------

    @property
    def paused(self) -> str | None:
        return _PAUSE_MODES[self._cells[1]] or None

    @paused.setter
    def paused(self, mode: str | None) -> None:
        self._cells[1] = _PAUSE_MODES.index(mode or "")

    @property
    def weight_version(self) -> str | None:
        with self._locked():
            return self._read_text(0) if self._cells[2] else None

    @weight_version.setter
    def weight_version(self, version: str | None) -> None:
        if version is not None and len(version.encode()) > MAX_LABEL:
            raise ValueError(f"a weight version label is at most {MAX_LABEL} bytes")
        with self._locked():
            self._cells[2] = 0 if version is None else 1
            self._write_text(0, version or "")

    def _write_text(self, index: int, text: str) -> None:
        data = text.encode()[:_TEXT - 2]
        at = self._text_at + index * _TEXT
        self._map[at:at + 2] = len(data).to_bytes(2, "little")
        self._map[at + 2:at + 2 + len(data)] = data

    def _read_text(self, index: int) -> str:
        at = self._text_at + index * _TEXT
        n = int.from_bytes(self._map[at:at + 2], "little")
        return self._map[at + 2:at + 2 + n].decode(errors="replace")
