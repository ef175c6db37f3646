"""Versioned schema migrations, on both backends: a store written at version 1 is upgraded in
place, its records intact; a store newer than this code is refused."""

from __future__ import annotations

import sqlite3

import pytest

from tests.storage.conftest import raw
from tokenwire.errors import StorageError
from tokenwire.storage import StoredCompletion, StoredResponse, open_store
from tokenwire.storage import postgres as pg_store
from tokenwire.storage import sqlite as sqlite_store
from tokenwire.storage._packing import pack
from tokenwire.storage._sql import MIGRATIONS

pytestmark = pytest.mark.anyio

LATEST = len(MIGRATIONS)


async def _migrate(url: str, steps: list[tuple[str, ...]]) -> None:
    """Bring a database to len(steps) the way an older tokenwire would have."""
    if url.startswith("postgresql://"):
        import psycopg

        async with await psycopg.AsyncConnection.connect(url) as conn:
            await pg_store.migrate(conn, steps)
        return
    conn = sqlite3.connect(url, isolation_level=None)
    try:
        sqlite_store.migrate(conn, steps)
    finally:
        conn.close()


def _indexes(url: str) -> set[str]:
    if url.startswith("postgresql://"):
        rows = raw(url, "SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")
    else:
        rows = raw(url, "SELECT name FROM sqlite_master WHERE type = 'index'")
    return {r[0] for r in rows}


async def test_a_fresh_store_is_at_the_latest_version(store_url: str) -> None:
    store = open_store(store_url)
    try:
        assert await store.documents("") == []
    finally:
        await store.aclose()
    assert raw(store_url, "SELECT version FROM schema_version") == [(LATEST,)]
    # a second open applies nothing again
    store = open_store(store_url)
    await store.documents("")
    await store.aclose()
    assert raw(store_url, "SELECT version FROM schema_version") == [(LATEST,)]


async def test_upgrade_from_version_1_keeps_its_records(store_url: str) -> None:
    await _migrate(store_url, MIGRATIONS[:1])
    assert raw(store_url, "SELECT version FROM schema_version") == [(1,)]
    assert "completions_by_model" not in _indexes(store_url)
    prompt, width = pack([1, 2, 49_151], 49_152)
    raw(store_url, "INSERT INTO completions (owner, id, model, created, tokenizer_version, "
        "template_version, vocab_size, width, prompt_ids, request, response, metadata) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ("o", "c-v1", "m", 5, "tv", None, 49_152, width, prompt, '{"a":1}', '{"b":2}',
         '{"k":"v"}'))
    ids, width = pack([7] * 10, 262_144)
    raw(store_url, "INSERT INTO documents (owner, id, created, tokenizer_version, vocab_size, "
        "width, ids, count) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        ("o", "d-v1", 6, "tv", 262_144, width, ids, 10))

    store = open_store(store_url)
    try:
        old = await store.get_completion("o", "c-v1")
        assert old is not None and old.prompt_ids == [1, 2, 49_151]
        assert (old.request, old.response, old.metadata) == ({"a": 1}, {"b": 2}, {"k": "v"})
        assert (old.output_ids, old.spans) == ([], [])  # step 3's columns: none kept then
        assert [r.id for r in (await store.list_completions("o", model="m")).data] == ["c-v1"]
        doc = await store.get_document("o", "d-v1")
        assert doc is not None and doc.token_ids == [7] * 10
    finally:
        await store.aclose()
    assert raw(store_url, "SELECT version FROM schema_version") == [(LATEST,)]
    assert {"completions_by_owner", "completions_by_model", "documents_by_owner"} \
        <= _indexes(store_url)


async def test_a_store_newer_than_this_code_is_refused(store_url: str) -> None:
    await _migrate(store_url, MIGRATIONS)
    raw(store_url, "UPDATE schema_version SET version = ?", (LATEST + 1,))
    store = open_store(store_url)
    try:
        with pytest.raises(StorageError, match="upgrade tokenwire"):
            await store.documents("")
    finally:
        await store.aclose()


async def test_upgrade_from_version_3_keeps_completions_and_adds_responses(
        store_url: str) -> None:
    await _migrate(store_url, MIGRATIONS[:3])
    prompt, width = pack([1, 2, 3], 49_152)
    out, _ = pack([4, 5], 49_152)
    raw(store_url, "INSERT INTO completions (owner, id, model, created, tokenizer_version, "
        "template_version, vocab_size, width, prompt_ids, request, response, metadata, "
        "output_ids, output_lengths, spans) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ("o", "c-v3", "m", 5, "tv", "tpl", 49_152, width, prompt, "{}", "{}", "{}", out, "[2]",
         "[[0,1,2]]"))
    store = open_store(store_url)
    try:
        old = await store.get_completion("o", "c-v3")
        assert old is not None and (old.prompt_ids, old.output_ids, old.spans) == \
            ([1, 2, 3], [[4, 5]], [(0, 1, 2)])
        assert await store.get_response("o", "resp_1") is None  # the new table, empty
    finally:
        await store.aclose()
    assert raw(store_url, "SELECT version FROM schema_version") == [(LATEST,)]


async def test_upgrade_from_version_4_indexes_records_by_age(store_url: str) -> None:
    await _migrate(store_url, MIGRATIONS[:4])
    prompt, width = pack([1, 2, 3], 49_152)
    raw(store_url, "INSERT INTO completions (owner, id, model, created, tokenizer_version, "
        "template_version, vocab_size, width, prompt_ids, request, response, metadata) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ("o", "c-v4", "m", 5, "tv", "tpl", 49_152, width, prompt, "{}", "{}", "{}"))
    assert not {"completions_by_created", "responses_by_created"} & _indexes(store_url)
    store = open_store(store_url)
    try:
        assert await store.get_completion("o", "c-v4") is not None
        kept = StoredResponse(
            id="r-v5", owner="o", model="m", created=5, tokenizer_version="tv",
            template_version=None, vocab_size=49_152, prompt_ids=[1], output_ids=[2],
            messages=[], input_items=[], request={}, response={})
        await store.put_response(kept)
        assert await store.expire(6) == 2
    finally:
        await store.aclose()
    assert {"completions_by_created", "responses_by_created"} <= _indexes(store_url)
    assert raw(store_url, "SELECT version FROM schema_version") == [(LATEST,)]


async def test_upgrade_from_version_5_reads_old_completions_as_chat_without_stops(
        store_url: str) -> None:
    """Version 6 keeps each choice's stop id and the API that made the record: a completion
    stored before reads back as a chat completion with none kept (the export then takes the
    stop id its response named), and new ones keep both."""
    await _migrate(store_url, MIGRATIONS[:5])
    prompt, width = pack([1, 2, 3], 49_152)
    out, _ = pack([4, 5], 49_152)
    raw(store_url, "INSERT INTO completions (owner, id, model, created, tokenizer_version, "
        "template_version, vocab_size, width, prompt_ids, request, response, metadata, "
        "output_ids, output_lengths, spans) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ("o", "c-v5", "m", 5, "tv", "tpl", 49_152, width, prompt, "{}", "{}", "{}", out, "[2]",
         "[]"))
    store = open_store(store_url)
    try:
        old = await store.get_completion("o", "c-v5")
        assert old is not None and (old.output_ids, old.stops, old.endpoint) == \
            ([[4, 5]], [], "chat.completions")
        new = StoredCompletion(
            id="g-v6", owner="o", model="m", created=6, tokenizer_version="tv",
            template_version=None, prompt_ids=[1], vocab_size=49_152, request={}, response={},
            output_ids=[[4], [5, 6]], stops=[(2, -0.25), None], endpoint="generate")
        await store.put_completion(new)
        assert await store.get_completion("o", "g-v6") == new
    finally:
        await store.aclose()
    assert raw(store_url, "SELECT version FROM schema_version") == [(LATEST,)]
    assert LATEST == 6
