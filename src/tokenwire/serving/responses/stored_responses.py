"""Stored Responses API responses (`store`, OpenAI's default), read back by OpenAI's endpoints
and continued by `previous_response_id`.

A record keeps the request as sent, the response as it went out, the prompt and the sampled
ids in the model's version, and the chat messages the prompt was rendered from (the history
included). A continuation starts from those exact ids (serving/prefix.py): the history is
never sent again, nor encoded again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from ...errors import (
    InvalidRequestError,
    ResponseNotFoundError,
    TokenizerVersionMismatchError,
    UnsupportedParameterError,
)
from ...protocol.chat import ChatCompletionRequest, ChatMessage
from ...protocol.common import ResponseWarning
from ...protocol.responses import (
    INPUT_TOKEN_IDS,
    FunctionTool,
    Response,
    ResponsesRequest,
)
from ...protocol.storage import DeletedResponse, ResponseItemList
from ...protocol.tools import FunctionCall, ToolCall
from ...storage import Store, StoredResponse
from ...tokenizers.base import Tokenizer
from ...tokenizers.conversions import conversion_reason
from ...tokenizers.registry import TokenizerRegistry
from ...tokenizers.translate import translator
from ..chat import ChatPlan, PromptPrefix
from ..items import new_id
from ..models import ServedModel
from ..params import ParamMap
from ..service import Caller

__all__ = ["StoredResponses", "input_items", "previous_turn"]

_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's own input items as sent, each with an `id` (OpenAI's prefixes where the
    client gave none), a message's string content as one text part (as OpenAI lists them); a
    string input is one user message."""
    if isinstance(req.input, str):
        return [{"id": new_id("msg"), "type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": req.input}]}]
    out = []
    for item in req.input:
        d = item.model_dump(mode="json", exclude_none=True, by_alias=True)
        d.setdefault("type", "message")
        d["id"] = d.get("id") or new_id(_ITEM_PREFIX[d["type"]])
        if isinstance(d.get("content"), str):
            kind = "output_text" if d["role"] == "assistant" else "input_text"
            d["content"] = [{"type": kind, "text": d["content"]}]
        out.append(d)
    return out


def _as_text(m: ChatMessage, tok: Tokenizer) -> dict[str, Any]:
    """A message of the conversation as a continuation renders it again: text (ids decoded),
    since only where its turns end is read from that rendering, never its ids."""
    d = m.model_dump(mode="json", exclude_none=True, by_alias=True)
    d.pop("token_ids", None)  # an assistant's: its content and calls are there as well
    c = d.get("content")
    if isinstance(c, (list, dict)):
        with conversion_reason("stored"):
            d["content"] = "".join(b["text"] if b.get("type") == "text"
                                   else tok.decode(b["token_ids"])
                                   for b in (c if isinstance(c, list) else [c]))
    return d


def _said(record: StoredResponse) -> ChatMessage:
    """The previous response's output as the assistant message that follows its prompt (its
    text and calls: only where the template ends that turn is read from its rendering)."""
    text, calls = "", []
    for item in record.response.get("output", []):
        if item.get("type") == "message":
            text += "".join(p.get("text", "") for p in item.get("content", []))
        elif item.get("type") == "function_call":
            calls.append(ToolCall(id=item["call_id"], function=FunctionCall(
                name=item["name"], arguments=item["arguments"])))
    return ChatMessage(role="assistant", content=text if text or not calls else None,
                       tool_calls=calls or None)


def _in_model_version(record: StoredResponse, req: ResponsesRequest, model: ServedModel,
                      tokenizers: TokenizerRegistry,
                      ) -> tuple[StoredResponse, ResponseWarning | None]:
    """The record with its ids in the model's tokenizer version: as kept, or translated
    through their bytes (with a warning) when kept under another one and the request allows
    `tokenizer_fallback: "translate"`."""
    kept, now = record.tokenizer_version, model.tokenizer_entry.version
    if kept == now:
        return record, None
    source = tokenizers.find(kept)
    if source is None:
        raise TokenizerVersionMismatchError(
            f"response {record.id!r} was kept in tokenizer version {kept!r}, which this "
            "server no longer has", param="previous_response_id")
    if req.tokenizer_fallback != "translate":
        raise TokenizerVersionMismatchError(
            f"response {record.id!r} was kept in tokenizer version {kept!r}; model "
            f"{model.id!r} runs {now!r}: send tokenizer_fallback 'translate' to continue it "
            "through text", param="previous_response_id")
    tr = translator(source.tokenizer, model.tokenizer)
    prompt, sampled = tr.translate(record.prompt_ids), tr.translate(record.output_ids)
    how = "lossless" if prompt.lossless and sampled.lossless else \
        "not lossless: some bytes or control tokens had no counterpart"
    return dataclasses.replace(record, prompt_ids=prompt.token_ids,
                               output_ids=sampled.token_ids), ResponseWarning(
        code="previous_response_translated", param="previous_response_id",
        message=f"response {record.id!r} was kept in tokenizer version {kept!r}; its ids were "
                f"translated into {now!r} through their bytes ({how})")


def previous_turn(record: StoredResponse, req: ResponsesRequest, model: ServedModel,
                  tokenizers: TokenizerRegistry,
                  ) -> tuple[ResponsesRequest, StoredResponse, ResponseWarning | None]:
    """Check that `req` may continue `record` on `model`: the request with the previous tools
    when it sent none (they are in the prompt's first turn, which the continuation keeps), the
    record in the model's version (`_in_model_version`) and the warning that says if it was
    translated."""
    if record.template_version != model.template_version:
        raise InvalidRequestError(
            f"response {record.id!r} was rendered with chat template "
            f"{record.template_version!r}; model {model.id!r} renders with "
            f"{model.template_version!r}, so a continuation of its ids would mix the two: send "
            "the history as input instead", param="previous_response_id",
            code="invalid_value")
    record, warning = _in_model_version(record, req, model, tokenizers)
    tools: list[dict[str, Any]] = record.response.get("tools", [])
    if req.tools is None:
        return req.model_copy(update={"tools": [FunctionTool.model_validate(t) for t in tools]
                                      or None}), record, warning
    sent = [t.model_dump(by_alias=True, exclude_none=True) for t in req.tools]
    if sent != tools:
        raise InvalidRequestError(
            "tools are printed at the start of the prompt, which a continuation keeps as it "
            "was: send the previous response's tools, or none (they are kept)", param="tools",
            code="invalid_value")
    return req, record, warning


def continue_from(record: StoredResponse, chat: ChatCompletionRequest, pm: ParamMap,
                  version: str, stand_in: list[int]
                  ) -> tuple[ChatCompletionRequest, PromptPrefix]:
    """The chat request of the whole conversation (the stored history, the previous output,
    then this request's messages) and the prefix that stands for the first two; `pm` is
    shifted so errors still name this request's fields. The previous output goes to the
    template as `stand_in` ids (an ordinary token of the model's, whose tokenizer `version`
    the record's ids are in by now): its calls are then not
    rendered again, and the rendering shows only where the turn ends, which is all a
    continuation reads of it (serving/prefix.py puts the sampled ids there)."""
    said = _said(record)
    if chat.tokenizer_version in (None, version):
        said = said.model_copy(update={"token_ids": stand_in})
        chat = chat.model_copy(update={"tokenizer_version": version})
    history = [ChatMessage.model_validate(m) for m in record.messages] + [said]
    pm.prepend(len(history), "previous_response_id")
    prefix = PromptPrefix(prompt=record.prompt_ids, sampled=record.output_ids,
                          messages=len(history))
    return chat.model_copy(update={"messages": [*history, *chat.messages]}), prefix


class StoredResponses:
    def __init__(self, store: Store):
        self._store = store

    async def keep(self, plan: ChatPlan, req: ResponsesRequest, response: Response,
                   sampled: Sequence[int], caller: Caller) -> None:
        """Returns once the record is durable (a killed server still has it)."""
        await self._store.put_response(StoredResponse(
            id=plan.id, owner=caller.owner, model=plan.model.id, created=plan.created,
            tokenizer_version=plan.space.model.version,
            template_version=plan.model.template_version,
            vocab_size=plan.model.tokenizer.vocab_size, prompt_ids=plan.prompt,
            output_ids=list(sampled),
            messages=[_as_text(m, plan.space.client.tokenizer) for m in plan.req.messages],
            input_items=input_items(req),
            request=req.model_dump(mode="json", exclude_unset=True, by_alias=True),
            response=response.model_dump(mode="json"), previous_id=req.previous_response_id))

    async def previous(self, id: str, caller: Caller) -> StoredResponse:
        record = await self._store.get_response(caller.owner, id)
        if record is None:
            raise ResponseNotFoundError(f"there is no stored response {id!r} to continue",
                                        param="previous_response_id",
                                        code="previous_response_not_found")
        return record

    async def record(self, id: str, caller: Caller) -> StoredResponse:
        record = await self._store.get_response(caller.owner, id)
        if record is None:
            raise ResponseNotFoundError(f"no stored response {id!r}")
        return record

    async def get(self, id: str, caller: Caller, include: Sequence[str]) -> dict[str, Any]:
        """The response as it went out, the kept JSON itself (never re-validated: a record
        written by an older release reads back as it was sent, whatever today's model
        requires); `include` may add `input.token_ids` (the prompt is kept), and may name what
        the response was created with (nothing else can be made again after the fact)."""
        record = await self.record(id, caller)
        body = dict(record.response)
        had = set(record.request.get("include") or [])
        for i, entry in enumerate(include):
            if entry == INPUT_TOKEN_IDS:
                if body.get("token_ids_source") == "translated":
                    raise UnsupportedParameterError(
                        "this response went out in another tokenizer version than the model's "
                        "(tokenizer_fallback 'translate'); its prompt is kept in the model's",
                        param=f"include[{i}]")
                body["input_token_ids"] = record.prompt_ids
            elif entry not in had:
                raise UnsupportedParameterError(
                    f"response {id!r} was created without include {entry!r}, so it has none",
                    param=f"include[{i}]")
        return body

    async def delete(self, id: str, caller: Caller) -> DeletedResponse:
        if not await self._store.delete_response(caller.owner, id):
            raise ResponseNotFoundError(f"no stored response {id!r}")
        return DeletedResponse(id=id, deleted=True)

    async def input_items(self, id: str, caller: Caller, *, after: str | None, limit: int,
                          order: Literal["asc", "desc"]) -> ResponseItemList:
        """This response's own input items (an earlier response's are listed under its id)."""
        items = (await self.record(id, caller)).input_items
        if order == "desc":
            items = items[::-1]
        if after is not None:
            at = next((k for k, item in enumerate(items) if item.get("id") == after), None)
            if at is None:
                raise InvalidRequestError(f"there is no input item {after!r} to list after",
                                          param="after")
            items = items[at + 1:]
        page = items[:limit]
        return ResponseItemList(data=page, first_id=page[0]["id"] if page else None,
                                last_id=page[-1]["id"] if page else None,
                                has_more=len(items) > limit)
