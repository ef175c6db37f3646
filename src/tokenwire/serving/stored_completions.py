"""Stored chat completions (`store: true`), read back as OpenAI's endpoints have them.

A record keeps the request as it was sent, the response as it went out, and the ids of both
sides in the model's version: the prompt, each choice's sampled ids and the id that ended it,
and where each message's content went in the prompt. So every read can return ids without
encoding anything (`format=tokens`), text (decoding only what was kept as ids alone), or both.

A rollout of vLLM's token API (`POST /inference/v1/generate` with `store: true`) is kept the
same way, its request and response vLLM's; these endpoints read it as a chat completion of its
prompt ids (no messages), so it is listed, its reward set and deleted like any other.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Literal

from ..errors import CompletionNotFoundError, DuplicateIdError, InvalidRequestError
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
from .generation import ChoiceResult
from .service import Caller

__all__ = ["StoredCompletions", "stops_of"]


def stops_of(results: Sequence[ChoiceResult]) -> list[tuple[int, float | None] | None]:
    """Each choice's stop as a record keeps it (`StoredCompletion.stops`): the id that ended
    it and its logprob, whatever the response showed."""
    return [(r.stop_event.token_id, r.stop_event.logprob) if r.stop_event is not None else None
            for r in results]


def _generate_as_chat(record: StoredCompletion) -> dict[str, Any]:
    """A stored `/inference/v1/generate` rollout as a chat completion (what the stored
    completions' endpoints return): each choice's sampled ids as `token_ids` (the stop id as
    `stop_reason`, its logprob as `stop_logprob`, chat's shape), no text and no logprobs (the
    stored vLLM response keeps them: `tokenwire export-rollouts` reads them)."""
    resp = record.response
    choices = []
    for c in resp.get("choices", []):
        i = c["index"]
        ids = record.output_ids[i] if i < len(record.output_ids) else []
        stop = record.stops[i] if i < len(record.stops) else None
        choices.append({
            "index": i, "message": {"role": "assistant", "content": None},
            "finish_reason": c.get("finish_reason"), "token_ids": ids,
            "stop_reason": stop[0] if stop is not None else c.get("stop_reason"),
            "stop_logprob": stop[1] if stop is not None else None,
            "weight_versions": c.get("weight_versions")})
    return {"id": record.id, "object": "chat.completion", "created": record.created,
            "model": record.model, "choices": choices, "usage": resp.get("usage"),
            "prompt_token_ids": record.prompt_ids, "tokenizer_version": record.tokenizer_version,
            "token_ids_source": "sampled"}


class StoredCompletions:
    def __init__(self, store: Store, tokenizers: TokenizerRegistry):
        self._store = store
        self._tokenizers = tokenizers

    async def keep(self, record: StoredCompletion) -> None:
        """Returns once the record is durable (a killed server still has it)."""
        await self._store.put_completion(record)

    async def check_free(self, id: str, caller: Caller) -> None:
        """Refuse a `request_id` whose record exists, before any work is done for it."""
        if await self._store.get_completion(caller.owner, id) is not None:
            raise DuplicateIdError(f"a completion {id!r} is already stored: send another "
                                   "request_id", param="request_id")

    async def record(self, id: str, caller: Caller) -> StoredCompletion:
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
        body: dict[str, Any] = _generate_as_chat(record) if record.endpoint == "generate" \
            else copy.deepcopy(record.response)
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
                message["content"] = self._decode(tok, ids)
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
        return self.render(await self.record(id, caller), fmt)

    async def list(self, caller: Caller, *, model: str | None, metadata: dict[str, str] | None,
                   after: str | None, limit: int, order: Literal["asc", "desc"],
                   fmt: ReadFormat | None) -> StoredCompletionList:
        page = await self._store.list_completions(caller.owner, model=model, metadata=metadata,
                                                  after=after, limit=limit, order=order)
        data = [self.render(r, fmt) for r in page.data]
        return StoredCompletionList(data=data, first_id=data[0].id if data else None,
                                    last_id=data[-1].id if data else None,
                                    has_more=page.has_more)

    async def _text(self, m: dict[str, Any], client: Tokenizer, caller: Caller) -> str | None:
        """A sent message's content as text: its text as sent; ids (assistant `token_ids`,
        `input_tokens`, documents) decoded in their own version."""
        if m.get("token_ids") is not None:
            return self._decode(client, m["token_ids"])
        content = m.get("content")
        if content is None or isinstance(content, str):
            return content
        parts = []
        for block in content if isinstance(content, list) else [content]:
            kind = block.get("type")
            if kind == "text":
                parts.append(block["text"])
            elif kind == "input_tokens":
                parts.append(self._decode(client, block["token_ids"]))
            elif kind == "input_document":
                doc = await self._store.get_document(caller.owner, block["document_id"])
                parts.append(self._decode(self._tokenizers.resolve(doc.tokenizer_version)
                                          .tokenizer, doc.token_ids) if doc is not None else "")
        return "".join(parts)

    @staticmethod
    def _decode(tok: Tokenizer, ids: Sequence[int]) -> str:
        with conversion_reason("stored"):
            return tok.decode(ids)

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
        """The request's messages: their content as sent (ids decoded in their own version),
        and with ids, each one's content ids as the model read them (template markers
        excluded), cut from the stored prompt."""
        record = await self.record(id, caller)
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
        if limit < 1:
            raise InvalidRequestError("limit must be at least 1", param="limit")
        order_ = list(range(len(sent)))[::-1 if order == "desc" else 1]
        if after is not None:
            at = next((k for k, i in enumerate(order_) if f"{record.id}-{i}" == after), None)
            if at is None:
                raise InvalidRequestError(f"there is no message {after!r} to list after",
                                          param="after")
            order_ = order_[at + 1:]
        sent_version = record.request.get("tokenizer_version")
        client = self._tokenizers.resolve(sent_version).tokenizer \
            if isinstance(sent_version, str) else self._tokenizer(record)
        page = []
        for i in order_[:limit]:  # only the page is decoded
            m = sent[i]
            text = None if fmt == "tokens" else await self._text(m, client, caller)
            page.append(StoredMessage(
                id=f"{record.id}-{i}", role=m["role"], content=text, name=m.get("name"),
                tool_calls=m.get("tool_calls"), tool_call_id=m.get("tool_call_id"),
                token_ids=by_message.get(i, []) if want_ids else None,
                tokenizer_version=record.tokenizer_version if want_ids else None))
        return StoredMessageList(data=page, first_id=page[0].id if page else None,
                                 last_id=page[-1].id if page else None,
                                 has_more=len(order_) > limit)
