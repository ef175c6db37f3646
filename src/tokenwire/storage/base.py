"""What the server keeps beyond one request: stored chat completions, stored responses and
documents, as ids.

`Store` is the one interface; `sqlite.SQLiteStore` (the default: one file, no server) and
`postgres.PostgresStore` (several gateways, one database) implement it. Every method is scoped
by `owner` (a digest of the caller's API key, `owner_of`): one key never sees another's records.
A method returns only after what it wrote is durable, so an acknowledged record survives a
killed process.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = ["Document", "Endpoint", "Page", "Store", "StoredCompletion", "StoredResponse",
           "owner_of"]

Endpoint = Literal["chat.completions", "generate"]
"""Which API made a stored completion."""


def owner_of(api_key: str | None) -> str:
    """The owner of what a caller stores: a digest of its key (keys themselves are never
    written down), or "" on a server without keys."""
    return hashlib.sha256(api_key.encode()).hexdigest() if api_key else ""


@dataclass(frozen=True)
class Document:
    id: str
    owner: str
    tokenizer_version: str
    token_ids: list[int]
    created: int
    vocab_size: int
    """Of `tokenizer_version`: every id is below it, and it picks how the ids are packed (2
    bytes each up to 65,536 ids, else 4)."""


@dataclass(frozen=True)
class StoredCompletion:
    """A completion kept with `store: true` (a chat completion, or a rollout of vLLM's token
    API): the request and the response as they went over the wire (JSON), and the ids of both
    sides in `tokenizer_version`."""

    id: str
    owner: str
    model: str
    created: int
    tokenizer_version: str
    template_version: str | None
    prompt_ids: list[int]
    """The rendered prompt, as the model read it."""
    vocab_size: int
    """Of `tokenizer_version` (see `Document.vocab_size`)."""
    request: dict[str, Any]
    response: dict[str, Any]
    metadata: dict[str, str] = field(default_factory=dict)
    output_ids: list[list[int]] = field(default_factory=list)
    """Each choice's sampled ids, in `tokenizer_version` (whatever the response showed)."""
    spans: list[tuple[int, int, int]] = field(default_factory=list)
    """(message index, start, end): where each request message's content went in
    `prompt_ids` (the stored messages' ids, read without decoding)."""
    stops: list[tuple[int, float | None] | None] = field(default_factory=list)
    """Each choice's stop: the end-of-generation id that ended it, as the engine sampled it (in
    `tokenizer_version`; it is not in `output_ids`), and its logprob (None where the request
    asked for none); None where no id ended the choice (`max_tokens`, a stop string). Kept
    whatever the response showed. [] in records stored before schema version 6."""
    endpoint: Endpoint = "chat.completions"
    """The API that made it: `chat.completions` (`POST /v1/chat/completions`), or `generate`
    (`POST /inference/v1/generate`: `request` and `response` are vLLM's token API's, the prompt
    was sent as ids, so there are no messages and no `spans`)."""


@dataclass(frozen=True)
class StoredResponse:
    """A Responses API response kept with `store` (its default): what a later request needs to
    continue it from its exact ids (`previous_response_id`), and what OpenAI's reads return."""

    id: str
    owner: str
    model: str
    created: int
    tokenizer_version: str
    template_version: str | None
    vocab_size: int
    """Of `tokenizer_version` (see `Document.vocab_size`)."""
    prompt_ids: list[int]
    """The prompt as the model read it, in `tokenizer_version`."""
    output_ids: list[int]
    """What the model sampled (its stop id excluded), in `tokenizer_version`."""
    messages: list[dict[str, Any]]
    """The chat messages the prompt was rendered from (earlier turns' included), as text: what
    a continuation renders again to find where this turn ends (it never reads their ids)."""
    input_items: list[dict[str, Any]]
    """This request's own input items, as sent, each with its assigned `id`."""
    request: dict[str, Any]
    response: dict[str, Any]
    previous_id: str | None = None


@dataclass(frozen=True)
class Page:
    data: list[StoredCompletion]
    has_more: bool


class Store(Protocol):
    async def put_completion(self, record: StoredCompletion) -> None: ...

    async def get_completion(self, owner: str, id: str) -> StoredCompletion | None: ...

    async def list_completions(
        self, owner: str, *, model: str | None = None, metadata: dict[str, str] | None = None,
        after: str | None = None, limit: int = 20, order: Literal["asc", "desc"] = "asc",
    ) -> Page:
        """Records in the order they were stored; `after`: the id the previous page ended with
        (an id this owner does not have: `InvalidRequestError` naming `after`); `metadata`:
        every pair must match."""
        ...

    async def update_completion(
        self, owner: str, id: str, metadata: dict[str, str]
    ) -> StoredCompletion | None:
        """Replace the metadata; None if there is no such record."""
        ...

    async def delete_completion(self, owner: str, id: str) -> bool: ...

    async def put_response(self, record: StoredResponse) -> None: ...

    async def get_response(self, owner: str, id: str) -> StoredResponse | None: ...

    async def delete_response(self, owner: str, id: str) -> bool: ...

    async def expire(self, before: int) -> int:
        """Delete the stored completions and responses created before `before` (Unix
        seconds), a batch per transaction; how many went. Documents are kept."""
        ...

    async def put_document(self, document: Document) -> None: ...

    async def get_document(self, owner: str, id: str) -> Document | None: ...

    async def delete_document(self, owner: str, id: str) -> bool: ...

    async def documents(self, owner: str, tokenizer_version: str | None = None,
                        ) -> list[Document]:
        """Every document of `owner` (of one version, if given), oldest first (what a search
        index is built from)."""
        ...

    async def aclose(self) -> None: ...
