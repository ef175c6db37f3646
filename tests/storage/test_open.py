"""Which store a `storage` setting opens, and how the SQLite one is set up."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tokenwire.config import Settings
from tokenwire.errors import StorageError
from tokenwire.storage import SQLiteStore, Store, open_store
from tokenwire.storage.postgres import PostgresStore

pytestmark = pytest.mark.anyio


async def _opens_sqlite(store: Store, path: Path) -> None:
    try:
        assert isinstance(store, SQLiteStore)
        assert await store.documents("") == []
        assert path.exists()
    finally:
        await store.aclose()


async def test_paths_and_sqlite_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await _opens_sqlite(open_store(tmp_path / "a.db"), tmp_path / "a.db")
    await _opens_sqlite(open_store(str(tmp_path / "b.db")), tmp_path / "b.db")
    await _opens_sqlite(open_store(f"sqlite://{tmp_path}/c.db"), tmp_path / "c.db")
    monkeypatch.chdir(tmp_path)
    await _opens_sqlite(open_store("sqlite://rel/d.db"), tmp_path / "rel" / "d.db")


def test_postgres_urls_and_refusals() -> None:
    for url in ("postgresql://u:p@db:5432/tw", "postgres://db/tw"):
        store = open_store(url)  # connects on first use, not here
        assert isinstance(store, PostgresStore) and store.url == url
    for bad in ("mysql://db/tw", "sqlite://"):
        with pytest.raises(ValueError):
            open_store(bad)


async def test_an_unreachable_postgres_is_a_storage_error() -> None:
    from tests.upstreams import free_port

    store = PostgresStore(f"postgresql://postgres@127.0.0.1:{free_port()}/x",
                          connect_timeout=1)
    try:
        with pytest.raises(StorageError):
            await store.documents("")
    finally:
        await store.aclose()


async def test_an_unwritable_path_is_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    store = SQLiteStore(tmp_path / "file" / "store.db")  # under a file: no such directory
    try:
        with pytest.raises(StorageError, match="cannot open"):
            await store.documents("")
    finally:
        await store.aclose()


async def test_sqlite_runs_on_its_own_thread_in_wal_with_full_sync(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    try:
        mode, sync, thread = await store._run(lambda c: (
            c.execute("PRAGMA journal_mode").fetchone()[0],
            c.execute("PRAGMA synchronous").fetchone()[0], threading.get_ident()))
        assert (mode, sync) == ("wal", 2)  # 2: FULL, an fsync at every commit
        assert thread != threading.get_ident()  # never the event loop's
    finally:
        await store.aclose()


def test_the_default_sits_beside_the_tokenizer_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOKENWIRE_STORAGE", raising=False)
    settings = Settings(tokenizer_store=Path("/srv/tw/tokenizers"))
    assert settings.storage_url() == "/srv/tw/store.sqlite3"  # follows the tokenizer store
    monkeypatch.setenv("TOKENWIRE_STORAGE", "postgresql://db/tw")
    assert Settings().storage_url() == "postgresql://db/tw"
    monkeypatch.setenv("TOKENWIRE_STORAGE", "none")
    assert Settings().storage_url() is None
