"""The SQL both stores run: the schema's migrations, the queries, rows <-> records, and the
record methods themselves (`SQLStore`), over the four things a backend supplies.

Written once with `?` parameters and `{blob}`/`{serial}` column types; a `Dialect` fills them
in for SQLite or PostgreSQL. The only query the two write differently is the metadata filter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidRequestError
from ._packing import pack, unpack
from .base import Document, Page, StoredCompletion, StoredResponse


@dataclass(frozen=True)
class Dialect:
    name: str
    blob: str
    serial: str
    """The `seq` column: a key that grows with every insert, never reused."""
    param: str

    def sql(self, text: str) -> str:
        return text.replace("{blob}", self.blob).replace("{serial}", self.serial) \
            .replace("?", self.param)

    def metadata_match(self, metadata: dict[str, str]) -> tuple[str, list[Any]]:
        """A condition true when every pair of `metadata` is in the row's metadata."""
        if self.name == "postgresql":
            return "metadata::jsonb @> ?::jsonb", [json.dumps(metadata)]
        match = "EXISTS (SELECT 1 FROM json_each(metadata) WHERE key = ? AND value = ?)"
        return " AND ".join([match] * len(metadata)), [x for kv in metadata.items() for x in kv]


SQLITE = Dialect("sqlite", "BLOB", "INTEGER PRIMARY KEY AUTOINCREMENT", "?")
POSTGRES = Dialect("postgresql", "BYTEA", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "%s")

SCHEMA_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"
READ_VERSION = "SELECT MAX(version) FROM schema_version"
WRITE_VERSION = ("DELETE FROM schema_version", "INSERT INTO schema_version (version) VALUES (?)")

MIGRATIONS: list[tuple[str, ...]] = [
    # 1: the two tables; ids packed (`width` bytes each), JSON as text
    ("""CREATE TABLE completions (
        seq {serial},
        owner TEXT NOT NULL,
        id TEXT NOT NULL,
        model TEXT NOT NULL,
        created BIGINT NOT NULL,
        tokenizer_version TEXT NOT NULL,
        template_version TEXT,
        vocab_size BIGINT NOT NULL,
        width SMALLINT NOT NULL,
        prompt_ids {blob} NOT NULL,
        request TEXT NOT NULL,
        response TEXT NOT NULL,
        metadata TEXT NOT NULL,
        UNIQUE (owner, id))""",
     """CREATE TABLE documents (
        seq {serial},
        owner TEXT NOT NULL,
        id TEXT NOT NULL,
        created BIGINT NOT NULL,
        tokenizer_version TEXT NOT NULL,
        vocab_size BIGINT NOT NULL,
        width SMALLINT NOT NULL,
        ids {blob} NOT NULL,
        count INTEGER NOT NULL,
        UNIQUE (owner, id))"""),
    # 2: listing walks one owner's rows in `seq` order, by model or not
    ("CREATE INDEX completions_by_owner ON completions (owner, seq)",
     "CREATE INDEX completions_by_model ON completions (owner, model, seq)",
     "CREATE INDEX documents_by_owner ON documents (owner, seq)"),
    # 3: what each choice sampled (packed like the prompt, one blob, cut by `output_lengths`)
    # and where each message went in the prompt; rows from before hold NULL (none kept)
    ("ALTER TABLE completions ADD COLUMN output_ids {blob}",
     "ALTER TABLE completions ADD COLUMN output_lengths TEXT",
     "ALTER TABLE completions ADD COLUMN spans TEXT"),
    # 4: Responses API responses (`store`), read and continued by id (OpenAI lists none, so
    # UNIQUE (owner, id) is their one index)
    ("""CREATE TABLE responses (
        seq {serial},
        owner TEXT NOT NULL,
        id TEXT NOT NULL,
        model TEXT NOT NULL,
        created BIGINT NOT NULL,
        tokenizer_version TEXT NOT NULL,
        template_version TEXT,
        vocab_size BIGINT NOT NULL,
        width SMALLINT NOT NULL,
        prompt_ids {blob} NOT NULL,
        output_ids {blob} NOT NULL,
        previous_id TEXT,
        messages TEXT NOT NULL,
        input_items TEXT NOT NULL,
        request TEXT NOT NULL,
        response TEXT NOT NULL,
        UNIQUE (owner, id))""",),
    # 5: the retention sweep deletes by age (`storage_retention_days`)
    ("CREATE INDEX completions_by_created ON completions (created)",
     "CREATE INDEX responses_by_created ON responses (created)"),
    # 6: each choice's stop id and its logprob (JSON, kept whatever the response showed), and
    # the API that made the record (`generate`: vLLM's token API); rows from before hold NULL
    # (chat completions, whose stop ids only their responses name)
    ("ALTER TABLE completions ADD COLUMN stops TEXT",
     "ALTER TABLE completions ADD COLUMN endpoint TEXT"),
]
"""Step n brings the schema from version n - 1 to n, in one transaction. Append; never edit."""

_COMPLETION = ("owner, id, model, created, tokenizer_version, template_version, vocab_size, "
               "width, prompt_ids, request, response, metadata, output_ids, output_lengths, spans, "
               "stops, endpoint")
_RESPONSE = ("owner, id, model, created, tokenizer_version, template_version, vocab_size, "
             "width, prompt_ids, output_ids, previous_id, messages, input_items, request, "
             "response")
_DOCUMENT = "owner, id, created, tokenizer_version, vocab_size, width, ids, count"

INSERT_COMPLETION = (f"INSERT INTO completions ({_COMPLETION}) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
GET_COMPLETION = f"SELECT {_COMPLETION} FROM completions WHERE owner = ? AND id = ?"
SEQ_OF_COMPLETION = "SELECT seq FROM completions WHERE owner = ? AND id = ?"
UPDATE_METADATA = (f"UPDATE completions SET metadata = ? WHERE owner = ? AND id = ? "
                   f"RETURNING {_COMPLETION}")
DELETE_COMPLETION = "DELETE FROM completions WHERE owner = ? AND id = ?"
INSERT_RESPONSE = (f"INSERT INTO responses ({_RESPONSE}) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
GET_RESPONSE = f"SELECT {_RESPONSE} FROM responses WHERE owner = ? AND id = ?"
DELETE_RESPONSE = "DELETE FROM responses WHERE owner = ? AND id = ?"
EXPIRE_BATCH = 1000
EXPIRE = tuple(f"DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} WHERE created < ? "
               f"LIMIT {EXPIRE_BATCH})" for t in ("completions", "responses"))
"""Stored completions and responses past retention, a batch at a time (a first sweep of a large
store never holds the write lock for long); documents are a corpus, kept until deleted."""
INSERT_DOCUMENT = f"INSERT INTO documents ({_DOCUMENT}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
GET_DOCUMENT = f"SELECT {_DOCUMENT} FROM documents WHERE owner = ? AND id = ?"
DELETE_DOCUMENT = "DELETE FROM documents WHERE owner = ? AND id = ?"
LIST_DOCUMENTS = f"SELECT {_DOCUMENT} FROM documents WHERE owner = ? ORDER BY seq"
LIST_DOCUMENTS_OF_VERSION = (f"SELECT {_DOCUMENT} FROM documents WHERE owner = ? AND "
                             "tokenizer_version = ? ORDER BY seq")


def list_documents(owner: str, tokenizer_version: str | None) -> tuple[str, tuple[str, ...]]:
    if tokenizer_version is None:
        return LIST_DOCUMENTS, (owner,)
    return LIST_DOCUMENTS_OF_VERSION, (owner, tokenizer_version)


def list_completions(dialect: Dialect, owner: str, *, model: str | None,
                     metadata: dict[str, str] | None, after_seq: int | None, limit: int,
                     order: Literal["asc", "desc"]) -> tuple[str, list[Any]]:
    """One page and one row more (which tells `has_more`)."""
    if limit < 1:
        raise InvalidRequestError("limit must be at least 1", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidRequestError("order must be asc or desc", param="order")
    where: list[str] = ["owner = ?"]
    params: list[Any] = [owner]
    if model is not None:
        where.append("model = ?")
        params.append(model)
    if after_seq is not None:
        where.append("seq > ?" if order == "asc" else "seq < ?")
        params.append(after_seq)
    if metadata:
        match, more = dialect.metadata_match(metadata)
        where.append(match)
        params.extend(more)
    text = (f"SELECT {_COMPLETION} FROM completions WHERE {' AND '.join(where)} "
            f"ORDER BY seq {order.upper()} LIMIT {int(limit) + 1}")
    return dialect.sql(text), params


def unknown_after(after: str) -> InvalidRequestError:
    return InvalidRequestError(f"there is no stored completion {after!r} to list after",
                               param="after")


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def completion_params(r: StoredCompletion) -> tuple[Any, ...]:
    ids, width = pack(r.prompt_ids, r.vocab_size)
    out, _ = pack([t for ids in r.output_ids for t in ids], r.vocab_size)
    return (r.owner, r.id, r.model, r.created, r.tokenizer_version, r.template_version,
            r.vocab_size, width, ids, dumps(r.request), dumps(r.response), dumps(r.metadata),
            out, dumps([len(ids) for ids in r.output_ids]), dumps(r.spans), dumps(r.stops),
            r.endpoint)


def completion_from_row(row: Sequence[Any]) -> StoredCompletion:
    (owner, id, model, created, tokenizer_version, template_version, vocab_size, width, ids,
     request, response, metadata, out, lengths, spans, stops, endpoint) = row
    flat = unpack(bytes(out), width) if out is not None else []
    outputs, start = [], 0
    for n in json.loads(lengths) if lengths is not None else []:
        outputs.append(flat[start:start + n])
        start += n
    return StoredCompletion(
        id=id, owner=owner, model=model, created=created, tokenizer_version=tokenizer_version,
        template_version=template_version, prompt_ids=unpack(bytes(ids), width),
        vocab_size=vocab_size, request=json.loads(request), response=json.loads(response),
        metadata=json.loads(metadata), output_ids=outputs,
        spans=[(i, a, b) for i, a, b in json.loads(spans)] if spans is not None else [],
        stops=[None if s is None else (s[0], s[1]) for s in json.loads(stops)]
        if stops is not None else [],
        endpoint=endpoint or "chat.completions",
    )


def response_params(r: StoredResponse) -> tuple[Any, ...]:
    prompt, width = pack(r.prompt_ids, r.vocab_size)
    out, _ = pack(r.output_ids, r.vocab_size)
    return (r.owner, r.id, r.model, r.created, r.tokenizer_version, r.template_version,
            r.vocab_size, width, prompt, out, r.previous_id, dumps(r.messages),
            dumps(r.input_items), dumps(r.request), dumps(r.response))


def response_from_row(row: Sequence[Any]) -> StoredResponse:
    (owner, id, model, created, tokenizer_version, template_version, vocab_size, width, prompt,
     out, previous_id, messages, input_items, request, response) = row
    return StoredResponse(
        id=id, owner=owner, model=model, created=created, tokenizer_version=tokenizer_version,
        template_version=template_version, vocab_size=vocab_size,
        prompt_ids=unpack(bytes(prompt), width), output_ids=unpack(bytes(out), width),
        messages=json.loads(messages), input_items=json.loads(input_items),
        request=json.loads(request), response=json.loads(response), previous_id=previous_id)


def document_params(d: Document) -> tuple[Any, ...]:
    ids, width = pack(d.token_ids, d.vocab_size)
    return (d.owner, d.id, d.created, d.tokenizer_version, d.vocab_size, width, ids,
            len(d.token_ids))


def document_from_row(row: Sequence[Any]) -> Document:
    owner, id, created, tokenizer_version, vocab_size, width, ids, _count = row
    return Document(id=id, owner=owner, tokenizer_version=tokenizer_version,
                    token_ids=unpack(bytes(ids), width), created=created, vocab_size=vocab_size)


Query = Callable[[int | None], tuple[str, Sequence[Any]]]
"""A page's query (dialect-ready text and parameters), given the `seq` it starts after."""


class SQLStore:
    """The `Store` methods, once for both backends. A backend supplies a statement run in a
    transaction of its own (`_execute`: the rows it changed; `_one`, `_all`: the rows it
    returned), and a page of completions read in one snapshot (`_listing`); statements are
    written as above (`?`, `{blob}`), the backend puts them in its dialect."""

    dialect: Dialect

    async def _execute(self, text: str, params: Sequence[Any]) -> int:
        raise NotImplementedError

    async def _one(self, text: str, params: Sequence[Any]) -> Sequence[Any] | None:
        raise NotImplementedError

    async def _all(self, text: str, params: Sequence[Any]) -> list[Sequence[Any]]:
        raise NotImplementedError

    async def _listing(self, owner: str, after: str | None,
                       query: Query) -> list[Sequence[Any]]:
        """In one snapshot: the `seq` of `after` (unknown: `unknown_after`), then `query`'s
        rows."""
        raise NotImplementedError

    async def put_completion(self, record: StoredCompletion) -> None:
        await self._execute(INSERT_COMPLETION, completion_params(record))

    async def get_completion(self, owner: str, id: str) -> StoredCompletion | None:
        row = await self._one(GET_COMPLETION, (owner, id))
        return None if row is None else completion_from_row(row)

    async def list_completions(
        self, owner: str, *, model: str | None = None, metadata: dict[str, str] | None = None,
        after: str | None = None, limit: int = 20, order: Literal["asc", "desc"] = "asc",
    ) -> Page:
        rows = await self._listing(owner, after, lambda after_seq: list_completions(
            self.dialect, owner, model=model, metadata=metadata, after_seq=after_seq,
            limit=limit, order=order))
        return Page([completion_from_row(r) for r in rows[:limit]], len(rows) > limit)

    async def update_completion(
        self, owner: str, id: str, metadata: dict[str, str]
    ) -> StoredCompletion | None:
        row = await self._one(UPDATE_METADATA, (dumps(metadata), owner, id))
        return None if row is None else completion_from_row(row)

    async def delete_completion(self, owner: str, id: str) -> bool:
        return await self._execute(DELETE_COMPLETION, (owner, id)) > 0

    async def put_response(self, record: StoredResponse) -> None:
        await self._execute(INSERT_RESPONSE, response_params(record))

    async def get_response(self, owner: str, id: str) -> StoredResponse | None:
        row = await self._one(GET_RESPONSE, (owner, id))
        return None if row is None else response_from_row(row)

    async def delete_response(self, owner: str, id: str) -> bool:
        return await self._execute(DELETE_RESPONSE, (owner, id)) > 0

    async def expire(self, before: int) -> int:
        n = 0
        for text in EXPIRE:
            while True:  # a transaction per batch: what waits on the store runs between
                gone = await self._execute(text, (before,))
                n += gone
                if gone < EXPIRE_BATCH:
                    break
        return n

    async def put_document(self, document: Document) -> None:
        await self._execute(INSERT_DOCUMENT, document_params(document))

    async def get_document(self, owner: str, id: str) -> Document | None:
        row = await self._one(GET_DOCUMENT, (owner, id))
        return None if row is None else document_from_row(row)

    async def delete_document(self, owner: str, id: str) -> bool:
        return await self._execute(DELETE_DOCUMENT, (owner, id)) > 0

    async def documents(self, owner: str, tokenizer_version: str | None = None,
                        ) -> list[Document]:
        text, params = list_documents(owner, tokenizer_version)
        return [document_from_row(r) for r in await self._all(text, params)]
