"""Both stores, on real databases: a SQLite file in tmp, and a PostgreSQL server this test run
starts itself (Debian's `postgresql` package; `make test` installs it)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from tests.upstreams import free_port
from tokenwire.storage import Store, open_store
from tokenwire.storage._sql import POSTGRES, SQLITE

# the PostgreSQL runs start a server process: slow (`make test-quick` leaves them out)
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)]


def _pg_bin() -> Path | None:
    """The PostgreSQL server's binaries: Debian keeps them off PATH, per major version."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name))
    return Path(dirs[-1]) if dirs and Path(dirs[-1], "pg_ctl").exists() else None


@dataclass
class PostgresServer:
    bin: Path
    base: Path
    port: int
    as_postgres: list[str]
    """`runuser -u postgres --` as root (initdb refuses to run as root), else nothing."""

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def pg_ctl(self, *args: str) -> None:
        subprocess.run([*self.as_postgres, str(self.bin / "pg_ctl"), "-D",
                        str(self.base / "data"), *args], check=True, capture_output=True,
                       timeout=120)


def _start_postgres() -> PostgresServer:
    bin = _pg_bin()
    if bin is None:
        raise LookupError("PostgreSQL's server is not installed (apt-get install postgresql)")
    as_postgres: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="tokenwire-pg-"))  # not pytest's tmp: 0700 of root
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise LookupError("running as root, and there is no `postgres` user to run "
                              "PostgreSQL as") from exc
        os.chown(base, user.pw_uid, user.pw_gid)
        as_postgres = ["runuser", "-u", "postgres", "--"]
    server = PostgresServer(bin, base, free_port(), as_postgres)
    subprocess.run([*as_postgres, str(bin / "initdb"), "-D", str(base / "data"), "-U",
                    "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
                   check=True, capture_output=True, timeout=120)
    server.pg_ctl("-w", "-t", "60", "-l", str(base / "log"), "-o",
                  f"-p {server.port} -k {base} -c listen_addresses=127.0.0.1", "start")
    return server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for this run. `make test` installs it, and fails without it;
    a run outside make skips its tests, saying why."""
    try:
        server = _start_postgres()
    except (LookupError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        why = f"{exc} {detail.decode(errors='replace')}".strip()
        if os.environ.get("TOKENWIRE_TEST_REQUIRE_MODELS"):
            pytest.fail(f"no PostgreSQL server: {why} (TOKENWIRE_TEST_REQUIRE_MODELS is set)")
        pytest.skip(f"no PostgreSQL server: {why}")
    yield server
    try:
        server.pg_ctl("-m", "fast", "stop")
    finally:
        shutil.rmtree(server.base, ignore_errors=True)


_databases = count()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database of its own for one test."""
    import psycopg

    name = f"tw_{os.getpid()}_{next(_databases)}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield postgres_server.url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a fresh store lives: a SQLite file, or a PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "store.sqlite3")
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = open_store(store_url)
    yield s
    await s.aclose()


def raw(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run SQL (`?` parameters) on a store's database directly, beside the store."""
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            cur = conn.execute(POSTGRES.sql(sql), params)
            return cur.fetchall() if cur.description else []
    import sqlite3

    conn = sqlite3.connect(url, isolation_level=None)
    try:
        return conn.execute(SQLITE.sql(sql), params).fetchall()
    finally:
        conn.close()
