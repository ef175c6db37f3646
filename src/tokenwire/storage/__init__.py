"""Stored chat completions, responses and documents, kept as packed token ids (see base.py).

`open_store` picks the backend from the `storage` setting: a SQLite file (the default), or a
PostgreSQL database shared by several gateways.
"""

from __future__ import annotations

from pathlib import Path

from .. import errors
from .base import Document, Page, Store, StoredCompletion, StoredResponse, owner_of
from .sqlite import SQLiteStore

__all__ = ["Document", "Page", "SQLiteStore", "Store", "StoredCompletion", "StoredResponse",
           "open_store", "owner_of"]

_SQLITE_SCHEME = "sqlite://"
_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_store(url_or_path: str | Path) -> Store:
    """A bare path or `sqlite://PATH` (as a file URL: `sqlite:///var/lib/tw.db` is absolute,
    `sqlite://tw.db` relative), or `postgresql://user:pass@host:port/db` (the `postgres`
    extra: psycopg)."""
    text = str(url_or_path)
    if text.startswith(_POSTGRES_SCHEMES):
        # imported here: psycopg is an optional extra, needed by PostgreSQL deployments only
        try:
            from .postgres import PostgresStore
        except ImportError as exc:
            raise errors.SetupError(f"a PostgreSQL store needs psycopg: pip install "
                                    f"'tokenwire[postgres]' ({exc})") from exc

        return PostgresStore(text)
    if text.startswith(_SQLITE_SCHEME):
        text = text.removeprefix(_SQLITE_SCHEME)
        if not text:
            raise ValueError("sqlite:// needs a path: sqlite:///abs/path.db")
    elif "://" in text:
        raise ValueError(f"storage {text!r}: a path, sqlite:///PATH or postgresql://...")
    return SQLiteStore(text)
