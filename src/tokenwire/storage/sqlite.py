"""`SQLiteStore`: the default store, one SQLite file and no server.

The stdlib driver blocks, so every call runs on one dedicated thread (the event loop never
waits on the disk, and the connection is only ever touched by that thread). The file is in WAL
mode with `synchronous=FULL`: a commit returns only after its WAL frames are fsynced, so every
acknowledged write survives a killed process or a lost machine. Several processes may share
the file (writers take turns; `busy_timeout` waits for the lock).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ..errors import DuplicateIdError, StorageError
from . import _sql
from ._sql import SQLITE

__all__ = ["SQLiteStore"]

T = TypeVar("T")
_BUSY_TIMEOUT_MS = 10_000


def _q(text: str) -> str:
    return SQLITE.sql(text)


def migrate(conn: sqlite3.Connection, steps: list[tuple[str, ...]] = _sql.MIGRATIONS) -> int:
    """Apply the steps the file lacks, each in one transaction (BEGIN IMMEDIATE: a second
    process opening the same file waits, then finds the step done); returns the version."""
    conn.execute(_sql.SCHEMA_VERSION_TABLE)
    for target, statements in enumerate(steps, start=1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = conn.execute(_sql.READ_VERSION).fetchone()[0] or 0
            if current > len(steps):
                raise StorageError(f"the store is at schema version {current}, newer than "
                                   f"this tokenwire knows ({len(steps)}): upgrade tokenwire")
            if current < target:
                for statement in statements:
                    conn.execute(_q(statement))
                conn.execute(_sql.WRITE_VERSION[0])
                conn.execute(_q(_sql.WRITE_VERSION[1]), (target,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return len(steps)


def connect(path: Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, synchronous=FULL."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if mode != "wal":
        conn.close()
        raise StorageError(f"{str(path)!r} cannot be put in WAL mode (journal mode {mode!r})")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


class SQLiteStore(_sql.SQLStore):
    dialect = SQLITE

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tokenwire-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._opened: Future[None] | None = None
        """Opening the file: the first job on the thread, submitted by the first call (an app
        built and never started opens nothing); every later call queues behind it."""

    def _open(self) -> None:
        try:
            conn = connect(self.path)
        except (sqlite3.Error, OSError) as exc:
            raise StorageError(f"cannot open the store {str(self.path)!r}: {exc}") from exc
        try:
            migrate(conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise StorageError(f"cannot migrate the store {str(self.path)!r}: {exc}") \
                    from exc
            raise
        self._conn = conn

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        assert self._opened is not None
        self._opened.result()  # done (this thread ran it first); raises what opening raised
        assert self._conn is not None
        try:
            return fn(self._conn)
        except sqlite3.IntegrityError as exc:
            raise DuplicateIdError("a record of this id is already stored", param="id") from exc
        except sqlite3.Error as exc:
            raise StorageError(f"the store {str(self.path)!r} failed: {exc}") from exc

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._opened is None:
            self._opened = self._executor.submit(self._open)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, fn)

    async def _execute(self, text: str, params: Sequence[Any]) -> int:
        return await self._run(lambda c: c.execute(_q(text), params).rowcount)

    async def _one(self, text: str, params: Sequence[Any]) -> Sequence[Any] | None:
        row: Sequence[Any] | None = await self._run(
            lambda c: c.execute(_q(text), params).fetchone())
        return row

    async def _all(self, text: str, params: Sequence[Any]) -> list[Sequence[Any]]:
        return await self._run(lambda c: c.execute(_q(text), params).fetchall())

    async def _listing(self, owner: str, after: str | None,
                       query: _sql.Query) -> list[Sequence[Any]]:
        def page(c: sqlite3.Connection) -> list[Any]:
            c.execute("BEGIN")  # one snapshot for the cursor and the page
            try:
                after_seq = None
                if after is not None:
                    found = c.execute(_q(_sql.SEQ_OF_COMPLETION), (owner, after)).fetchone()
                    if found is None:
                        raise _sql.unknown_after(after)
                    after_seq = found[0]
                text, params = query(after_seq)
                return c.execute(text, params).fetchall()
            finally:
                c.execute("COMMIT")

        return await self._run(page)

    async def aclose(self) -> None:
        def close(c: sqlite3.Connection) -> None:
            c.close()

        if self._closed:
            return
        self._closed = True
        if self._opened is None:  # never used: nothing to close
            self._executor.shutdown(wait=False)
            return
        try:
            await self._run(close)
        except StorageError:
            pass  # it never opened: nothing to close
        finally:
            self._executor.shutdown(wait=False)
