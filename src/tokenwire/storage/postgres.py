"""`PostgresStore`: one PostgreSQL database shared by several gateways (`pip install
tokenwire[postgres]`).

psycopg 3's async driver over a small pool. A method returns after its transaction commits,
and a PostgreSQL commit is durable (fsynced WAL) unless the server was configured otherwise
(`fsync`, `synchronous_commit`). Gateways that start together migrate one at a time, under an
advisory lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..errors import DuplicateIdError, StorageError, TokenwireError
from . import _sql
from ._sql import POSTGRES

__all__ = ["PostgresStore"]

_MIGRATION_LOCK = 0x746F6B656E77  # pg_advisory_xact_lock's key for tokenwire's migrations


def _q(text: str) -> str:
    return POSTGRES.sql(text)


async def migrate(conn: psycopg.AsyncConnection[Any],
                  steps: list[tuple[str, ...]] = _sql.MIGRATIONS) -> int:
    """Apply the steps the database lacks, each in one transaction; returns the version."""
    lock = "SELECT pg_advisory_xact_lock(%s)"
    async with conn.transaction():
        await conn.execute(lock, (_MIGRATION_LOCK,))
        await conn.execute(_sql.SCHEMA_VERSION_TABLE)
    for target, statements in enumerate(steps, start=1):
        async with conn.transaction():
            await conn.execute(lock, (_MIGRATION_LOCK,))
            row = await (await conn.execute(_sql.READ_VERSION)).fetchone()
            current = (row[0] if row else None) or 0
            if current > len(steps):
                raise StorageError(f"the store is at schema version {current}, newer than "
                                   f"this tokenwire knows ({len(steps)}): upgrade tokenwire")
            if current < target:
                for statement in statements:
                    await conn.execute(_q(statement))
                await conn.execute(_sql.WRITE_VERSION[0])
                await conn.execute(_q(_sql.WRITE_VERSION[1]), (target,))
    return len(steps)


class PostgresStore(_sql.SQLStore):
    dialect = POSTGRES

    def __init__(self, url: str, *, max_connections: int = 8, connect_timeout: float = 10.0):
        self.url = url
        self._max = max_connections
        self._timeout = connect_timeout
        self._pool: AsyncConnectionPool | None = None
        self._lock = asyncio.Lock()

    async def _ready(self) -> AsyncConnectionPool:
        """The pool, opened and the schema migrated on first use."""
        if self._pool is None:
            async with self._lock:
                if self._pool is None:
                    pool = AsyncConnectionPool(self.url, min_size=1, max_size=self._max,
                                               open=False, timeout=self._timeout)
                    try:
                        await pool.open(wait=True, timeout=self._timeout)
                        async with pool.connection() as conn:
                            await migrate(conn)
                    except BaseException:
                        await pool.close()
                        raise
                    self._pool = pool
        return self._pool

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection in a transaction, committed when the block ends; psycopg's errors
        become tokenwire's."""
        try:
            pool = await self._ready()
            async with pool.connection() as conn:
                yield conn
        except TokenwireError:
            raise
        except psycopg.errors.UniqueViolation as exc:
            raise DuplicateIdError("a record of this id is already stored", param="id") from exc
        except (psycopg.Error, PoolTimeout) as exc:
            raise StorageError(f"the PostgreSQL store failed: {exc}") from exc

    async def _execute(self, text: str, params: Sequence[Any]) -> int:
        async with self._connection() as conn:
            return (await conn.execute(_q(text), params)).rowcount

    async def _one(self, text: str, params: Sequence[Any]) -> Sequence[Any] | None:
        async with self._connection() as conn:
            return await (await conn.execute(_q(text), params)).fetchone()

    async def _all(self, text: str, params: Sequence[Any]) -> list[Sequence[Any]]:
        async with self._connection() as conn:
            return list(await (await conn.execute(_q(text), params)).fetchall())

    async def _listing(self, owner: str, after: str | None,
                       query: _sql.Query) -> list[Sequence[Any]]:
        async with self._connection() as conn:  # one transaction: one snapshot
            after_seq = None
            if after is not None:
                found = await (await conn.execute(_q(_sql.SEQ_OF_COMPLETION),
                                                  (owner, after))).fetchone()
                if found is None:
                    raise _sql.unknown_after(after)
                after_seq = found[0]
            text, params = query(after_seq)
            return list(await (await conn.execute(text, params)).fetchall())

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
