"""Stored chat completions, responses and documents, kept as packed token ids (see base.py).

`open_store` picks the backend from the `storage` setting: a SQLite file (the default), or a
PostgreSQL database shared by several gateways.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .. import errors
from .base import Document, Page, Store, StoredCompletion, StoredResponse, owner_of
from .sqlite import SQLiteStore

__all__ = ["BACKENDS", "Document", "Page", "SQLiteStore", "Store", "StoredCompletion",
           "StoredResponse", "open_store", "owner_of"]


def _sqlite(url: str) -> Store:
    """`sqlite://PATH`, as a file URL: `sqlite:///var/lib/tw.db` is absolute, `sqlite://tw.db`
    relative."""
    path = url.removeprefix("sqlite://")
    if not path:
        raise ValueError("sqlite:// needs a path: sqlite:///abs/path.db")
    return SQLiteStore(path)


def _postgres(url: str) -> Store:
    """`postgresql://user:pass@host:port/db` (the `postgres` extra: psycopg)."""
    # imported here: psycopg is an optional extra, needed by PostgreSQL deployments only
    try:
        from .postgres import PostgresStore
    except ImportError as exc:
        raise errors.SetupError(f"a PostgreSQL store needs psycopg: pip install "
                                f"'tokenwire[postgres]' ({exc})") from exc
    return PostgresStore(url)


BACKENDS: dict[str, Callable[[str], Store]] = {
    "sqlite": _sqlite,
    "postgresql": _postgres,
    "postgres": _postgres,
}
"""The stores by URL scheme: each factory is given the whole URL."""


def open_store(url_or_path: str | Path) -> Store:
    """A bare path (a SQLite file), or a URL whose scheme names a backend (`BACKENDS`)."""
    text = str(url_or_path)
    scheme, sep, _ = text.partition("://")
    if not sep:
        return SQLiteStore(text)
    try:
        factory = BACKENDS[scheme]
    except KeyError:
        raise ValueError(f"storage {text!r}: a path, sqlite:///PATH or postgresql://...") \
            from None
    return factory(text)
