"""Stored chat completions (`store: true`), read back as OpenAI's endpoints have them.

A record keeps the request as it was sent, the response as it went out, and the ids of both
sides in the model's version: the prompt, each choice's sampled ids, and where each message's
content went in the prompt. So every read can return ids without encoding anything
(`format=tokens`), text (decoding only what was kept as ids alone), or both.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from ..errors import CompletionNotFoundError, InvalidRequestError
from ..protocol.chat import ChatCompletion
from ..protocol.storage import (
    DeletedCompletion,
    ReadFormat,
    StoredCompletionList,
    StoredMessage,
    StoredMessageList,
)
from ..storage import Store, StoredCompletion
from ..tokenizers.base import Tokenizer
from ..tokenizers.conversions import conversion_reason
from ..tokenizers.registry import TokenizerRegistry
from .plan import Caller

__all__ = ["StoredCompletions"]


class StoredCompletions:
    def __init__(self, store: Store, tokenizers: TokenizerRegistry):
        self._store = store
        self._tokenizers = tokenizers

    async def keep(self, record: StoredCompletion) -> None:
        """Returns once the record is durable (a killed server still has it)."""
        await self._store.put_completion(record)

    async def _record(self, id: str, caller: Caller) -> StoredCompletion:
        record = await self._store.get_completion(caller.owner, id)
        if record is None:
            raise CompletionNotFoundError(f"no stored chat completion {id!r}")
        return record

    def _tokenizer(self, record: StoredCompletion) -> Tokenizer:
        return self._tokenizers.resolve(record.tokenizer_version).tokenizer

    def render(self, record: StoredCompletion, fmt: ReadFormat | None) -> ChatCompletion:
        """The stored response (with its metadata); `fmt` sets which of text and ids it
        carries: ids are the model's (the record's version), text is decoded where the
        response went out as ids alone."""
        body: dict[str, Any] = copy.deepcopy(record.response)
        body["metadata"] = record.metadata
        if fmt is None:
            return ChatCompletion.model_validate(body)
        tok = self._tokenizer(record)
        for choice in body.get("choices", []):
            ids = record.output_ids[choice["index"]] if choice["index"] < len(
                record.output_ids) else []
            message = choice["message"]
            choice.pop("token_ids", None)
            if fmt == "tokens":
                message["content"] = None
            elif message.get("content") is None and not message.get("tool_calls"):
                with conversion_reason("stored"):
                    message["content"] = tok.decode(ids)
            if fmt == "text":
                message.pop("token_ids", None)
            else:
                message["token_ids"] = ids
        if fmt == "text":
            for key in ("prompt_token_ids", "tokenizer_version", "token_ids_source"):
                body.pop(key, None)
        else:
            body["prompt_token_ids"] = record.prompt_ids
            body["tokenizer_version"] = record.tokenizer_version
            body["token_ids_source"] = "sampled"
        return ChatCompletion.model_validate(body)

    async def get(self, id: str, caller: Caller, fmt: ReadFormat | None) -> ChatCompletion:
        return self.render(await self._record(id, caller), fmt)

    async def list(self, caller: Caller, *, model: str | None, metadata: dict[str, str] | None,
                   after: str | None, limit: int, order: Literal["asc", "desc"],
                   fmt: ReadFormat | None) -> StoredCompletionList:
        page = await self._store.list_completions(caller.owner, model=model, metadata=metadata,
                                                  after=after, limit=limit, order=order)
        data = [self.render(r, fmt) for r in page.data]
        return StoredCompletionList(data=data, first_id=data[0].id if data else None,
                                    last_id=data[-1].id if data else None,
                                    has_more=page.has_more)

    async def update(self, id: str, caller: Caller, metadata: dict[str, str]) -> ChatCompletion:
        record = await self._store.update_completion(caller.owner, id, metadata)
        if record is None:
            raise CompletionNotFoundError(f"no stored chat completion {id!r}")
        return self.render(record, None)

    async def delete(self, id: str, caller: Caller) -> DeletedCompletion:
        if not await self._store.delete_completion(caller.owner, id):
            raise CompletionNotFoundError(f"no stored chat completion {id!r}")
        return DeletedCompletion(id=id, deleted=True)

    async def messages(self, id: str, caller: Caller, *, after: str | None, limit: int,
                       order: Literal["asc", "desc"], fmt: ReadFormat | None,
                       ) -> StoredMessageList:
        """The request's messages; with ids, each one's content ids as the model read them
        (template markers excluded), cut from the stored prompt."""
        record = await self._record(id, caller)
        sent: list[dict[str, Any]] = record.request.get("messages", [])
        want_ids = fmt in ("tokens", "both")
        if want_ids and sent and not record.spans:
            raise InvalidRequestError(
                "this completion's prompt was truncated (truncate_prompt_tokens), so its "
                "messages' ids were not kept; read them with format=text",
                param="format", code="invalid_value")
        by_message: dict[int, list[int]] = {}
        for i, a, b in record.spans:
            by_message.setdefault(i, []).extend(record.prompt_ids[a:b])
        tok = self._tokenizer(record)
        out = []
        for i, m in enumerate(sent):
            ids = by_message.get(i, [])
            content = m.get("content")
            text: str | None = content if isinstance(content, str) else None
            if fmt != "tokens" and text is None and (content is not None or
                                                     m.get("token_ids") is not None):
                with conversion_reason("stored"):
                    text = tok.decode(ids)  # blocks, ids, documents: as the model read them
            out.append(StoredMessage(
                id=f"{record.id}-{i}", role=m["role"], content=None if fmt == "tokens" else text,
                name=m.get("name"), token_ids=ids if want_ids else None,
                tokenizer_version=record.tokenizer_version if want_ids else None))
        if order == "desc":
            out.reverse()
        if after is not None:
            at = next((k for k, m in enumerate(out) if m.id == after), None)
            if at is None:
                raise InvalidRequestError(f"there is no message {after!r} to list after",
                                          param="after")
            out = out[at + 1:]
        if limit < 1:
            raise InvalidRequestError("limit must be at least 1", param="limit")
        page = out[:limit]
        return StoredMessageList(data=page, first_id=page[0].id if page else None,
                                 last_id=page[-1].id if page else None,
                                 has_more=len(out) > limit)
