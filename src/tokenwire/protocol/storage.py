"""What the server keeps: stored chat completions and responses (OpenAI's endpoints) and
documents held as ids.

Every read takes `format`: "text" (decoded where only ids were kept), "tokens" (the ids, with
their `tokenizer_version`, no text), or "both"; without it a record comes back as it was sent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ._base import RequestModel, ResponseModel
from .chat import ChatCompletion
from .common import MAX_METADATA_PAIRS, Ids, Metadata, TokenIds

__all__ = [
    "DeletedCompletion",
    "DeletedDocument",
    "DeletedResponse",
    "Document",
    "DocumentCreated",
    "DocumentQuery",
    "DocumentSearchHit",
    "DocumentSearchRequest",
    "DocumentSearchResults",
    "MAX_METADATA_PAIRS",
    "Metadata",
    "NewDocument",
    "ReadFormat",
    "ResponseItemList",
    "StoredCompletionList",
    "StoredMessage",
    "StoredMessageList",
    "UpdateCompletion",
]

ReadFormat = Literal["text", "tokens", "both"]



# -- stored responses -------------------------------------------------------------------------


class DeletedResponse(ResponseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool


class ResponseItemList(ResponseModel):
    """`GET /v1/responses/{id}/input_items`: the response's own input items, as sent, each
    with an `id` (the server's where the item had none)."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


# -- stored chat completions ------------------------------------------------------------------


class StoredCompletionList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ChatCompletion]
    first_id: str | None
    last_id: str | None
    has_more: bool


class UpdateCompletion(RequestModel):
    """`POST /v1/chat/completions/{id}`: only the metadata of a stored completion can change."""

    metadata: Metadata | None
    """Replaces the stored metadata whole (null: none)."""


class DeletedCompletion(ResponseModel):
    id: str
    object: Literal["chat.completion.deleted"] = "chat.completion.deleted"
    deleted: bool


class StoredMessage(ResponseModel):
    omit_if_none = frozenset({"name", "tool_calls", "tool_call_id", "token_ids",
                              "tokenizer_version"})
    id: str
    role: str
    content: str | None
    """As sent; ids in it (`input_tokens`, documents, an assistant's `token_ids`) decoded."""
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    token_ids: Ids | None = None
    """The message's ids as the model read it (`format` tokens or both): its content, without
    the template's role markers."""
    tokenizer_version: str | None = None


class StoredMessageList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[StoredMessage]
    first_id: str | None
    last_id: str | None
    has_more: bool


# -- documents --------------------------------------------------------------------------------


class NewDocument(RequestModel):
    """`POST /v1/documents`: text (encoded once, with `tokenizer_version` or the served model's
    version) or ids of a named version (kept as they are)."""

    text: str | None = None
    token_ids: TokenIds | None = None
    tokenizer_version: str | None = None
    """The version of `token_ids` (required with them); with `text`, the version to encode it
    with (default: the served model's)."""

    @model_validator(mode="after")
    def _one_kind(self) -> NewDocument:
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("send exactly one of `text` and `token_ids`")
        return self


class DocumentCreated(ResponseModel):
    id: str
    object: Literal["document"] = "document"
    tokenizer_version: str
    count: int
    """How many ids the document holds."""


class Document(ResponseModel):
    omit_if_none = frozenset({"token_ids", "tokenizer_version", "text"})
    id: str
    object: Literal["document"] = "document"
    token_ids: Ids | None = None
    tokenizer_version: str | None = None
    text: str | None = None


class DeletedDocument(ResponseModel):
    id: str
    object: Literal["document"] = "document"
    deleted: bool


class DocumentQuery(RequestModel):
    token_ids: TokenIds
    tokenizer_version: str


class DocumentSearchRequest(RequestModel):
    query: str | DocumentQuery
    """Text (encoded once, in `tokenizer_version` or the served model's version), or ids."""
    tokenizer_version: str | None = None
    """With a text query: the version to encode it with, whose documents are searched."""
    limit: int = Field(10, ge=1, le=100)


class DocumentSearchHit(ResponseModel):
    document_id: str
    score: float


class DocumentSearchResults(ResponseModel):
    object: Literal["list"] = "list"
    data: list[DocumentSearchHit]
    tokenizer_version: str
    """The version the query was searched in (only documents of that version are searched)."""
