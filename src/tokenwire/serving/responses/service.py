"""POST /v1/responses, on the chat machinery: the request runs as a chat request (one plan,
one set of checks, the same prompt), and the choice's updates become output items and
OpenAI's typed stream events.

No HTTP here. `create` and `stream` share one assembler (`items.ItemAssembler`), so a whole
response is exactly the last state of the stream for the same seed: the same items, split the
same way, with the same ids.

With a store, a response is kept (`store`, OpenAI's default) before the client hears it is
done: a whole one before it is returned, a stream's before its last lifecycle event (a stream
that fails or is cut short is not kept). `previous_response_id` continues a kept one from its
exact ids (stored_responses.py).

Errors before the first event are plain HTTP errors (`stream` returns its iterator only once
the request is admitted); an error after it ends the stream with `response.failed`, whose
`response.error` is the error's body (the lifecycle needs the response built so far, which
only this module has, so this is not left to the SSE layer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from ...config import Settings
from ...errors import (
    InvalidRequestError,
    StorageError,
    TokenwireError,
    UnsupportedParameterError,
)
from ...metrics import Metrics
from ...protocol.common import Usage
from ...protocol.responses import (
    INPUT_TOKEN_IDS,
    LOGPROBS,
    OUTPUT_TOKEN_IDS,
    Response,
    ResponseEvent,
    ResponsesRequest,
)
from ...storage import StoredResponse
from ...tokenizers.registry import TokenizerRegistry
from ..chat import ChatPlan, ChatService
from ..generation import Choices, ChoiceUpdate, StreamedResponse, Totals
from ..guard import Guard
from ..items import ItemAssembler, new_id
from ..models import ModelRegistry
from ..params import ParamMap
from ..service import ANONYMOUS, Caller, GenerationService, run_whole
from .input import to_chat_request
from .stored_responses import StoredResponses, continue_from, previous_turn

__all__ = ["ResponsesService"]


def _dump(value: Any) -> Any:
    return value.model_dump(by_alias=True, exclude_none=True) if hasattr(value, "model_dump") \
        else value


def _response(req: ResponsesRequest, plan: ChatPlan, store: bool) -> Response:
    """The response before its output: what the request asked for, as OpenAI echoes it."""
    r = Response(
        id=plan.id, created_at=plan.created, status="in_progress", model=plan.model.id,
        instructions=req.instructions,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        tool_choice=_dump(req.tool_choice) if req.tool_choice is not None
        else ("auto" if req.tools else "none"),
        tools=[_dump(t) for t in req.tools or []],
        temperature=req.temperature if req.temperature is not None else 1.0,
        top_p=req.top_p if req.top_p is not None else 1.0,
        top_logprobs=req.top_logprobs if req.top_logprobs is not None else 0,
        max_output_tokens=req.max_output_tokens,
        text={"format": _dump(req.text.format)} if req.text is not None
        and req.text.format is not None else {"format": {"type": "text"}},
        metadata=req.metadata or {}, user=req.user,
        warnings=plan.warnings, store=store, previous_response_id=req.previous_response_id,
    )
    if req.includes(OUTPUT_TOKEN_IDS):
        r.tokenizer_version = plan.space.client.version
        r.token_ids_source = plan.source  # type: ignore[assignment]
        r.template_version = plan.model.template_version
    if req.includes(INPUT_TOKEN_IDS) and not plan.space.translate:
        r.input_token_ids = list(plan.prompt)
    return r


class ResponsesService(GenerationService):
    def __init__(self, models: ModelRegistry, tokenizers: TokenizerRegistry, settings: Settings,
                 guard: Guard, metrics: Metrics, *, chat: ChatService,
                 stored: StoredResponses | None = None):
        super().__init__(models, tokenizers, settings, guard, metrics)
        self._chat = chat
        self.stored = stored
        """None without a store: `store: true` and `previous_response_id` are refused."""

    def plan(self, req: ResponsesRequest, caller: Caller = ANONYMOUS,
             previous: StoredResponse | None = None,
             ) -> tuple[ChatPlan, ParamMap, ResponsesRequest]:
        """The chat plan of the request (every check done), errors named as Responses fields;
        `previous`: the response it continues. Also the request as it runs (a continuation
        keeps the previous tools)."""
        translated = None
        if previous is not None:
            req, previous, translated = previous_turn(previous, req, self._models.get(req.model),
                                                      self._tokenizers)
        chat_req, pm = to_chat_request(req)
        prefix = None
        if previous is not None:
            model = self._models.get(req.model)
            # the stand-in for the previous turn: one of its own ordinary ids (nothing encoded)
            plain = [i for i in previous.output_ids if i not in model.tokenizer.special_ids]
            chat_req, prefix = continue_from(previous, chat_req, pm, model.tokenizer_version,
                                             plain[:1] or model.tokenizer.encode("x")[:1])
        with pm.renaming():
            plan = self._chat.plan(chat_req, caller, prefix=prefix)
        plan.id = new_id("resp")
        if translated is not None:
            plan.warnings = [*(plan.warnings or []), translated]
        return plan, pm, req

    def _stores(self, req: ResponsesRequest) -> bool:
        """`store`: OpenAI's default (true) where there is a store; refused by name where
        there is none and the client asked for it."""
        if req.store and self.stored is None:
            raise UnsupportedParameterError("this server keeps no records (no storage)",
                                            param="store")
        return self.stored is not None and req.store is not False

    async def _planned(self, req: ResponsesRequest, caller: Caller,
                       ) -> tuple[ChatPlan, ParamMap, ResponsesRequest, bool]:
        store = self._stores(req)
        previous = None
        if req.previous_response_id is not None:
            if self.stored is None:
                raise UnsupportedParameterError(
                    "this server keeps no responses (no storage) to continue",
                    param="previous_response_id")
            if "\x00" in req.previous_response_id:  # in no id, nor a PostgreSQL string
                raise InvalidRequestError("ids cannot hold NUL characters",
                                          param="previous_response_id")
            previous = await self.stored.previous(req.previous_response_id, caller)
        plan, pm, req = await self._prepare(self.plan, req, caller, previous)
        return plan, pm, req, store

    async def _updates(self, plan: ChatPlan, pm: ParamMap) -> Choices:
        with pm.renaming():
            return await self._chat.updates(plan)

    def _assembler(self, req: ResponsesRequest, plan: ChatPlan, store: bool) -> ItemAssembler:
        return ItemAssembler(plan, plan.parser(), _response(req, plan, store),
                             ids=req.includes(OUTPUT_TOKEN_IDS), logprobs=req.includes(LOGPROBS))

    async def create(self, req: ResponsesRequest, caller: Caller = ANONYMOUS) -> Response:
        plan, pm, req, store = await self._planned(req, caller)

        async def run() -> tuple[Response, list[int]]:
            asm = self._assembler(req, plan, store)
            sampled: list[int] = []  # the model's own ids, whatever the response shows
            totals = Totals()
            updates = await self._updates(plan, pm)
            async with contextlib.aclosing(updates):
                async for u in updates:
                    asm.push(u)
                    sampled += u.delta.ids
                    if u.finish_reason is not None:
                        totals.add(u, u.index)
            self._count(plan, totals)
            return asm.response, sampled

        response, sampled = await run_whole(run)
        if store:
            assert self.stored is not None
            await self.stored.keep(plan, req, response, sampled, caller)
        return response

    async def stream(self, req: ResponsesRequest,
                     caller: Caller = ANONYMOUS) -> StreamedResponse[ResponseEvent]:
        plan, pm, req, store = await self._planned(req, caller)
        choices = await self._updates(plan, pm)
        keep = None
        if store:
            stored = self.stored
            assert stored is not None

            async def keep(response: Response, sampled: list[int]) -> None:
                await stored.keep(plan, req, response, sampled, caller)

        return self._stream(plan, _ResponseEvents(self._assembler(req, plan, store), keep), choices)


class _ResponseEvents:
    """OpenAI's typed stream events (a `Family`), numbered; `keep`: stores the response
    before its last lifecycle event goes out (a failed write fails the response instead)."""

    def __init__(self, asm: ItemAssembler,
                 keep: Callable[[Response, list[int]], Awaitable[None]] | None):
        self._asm = asm
        self._keep = keep
        self._seq = 0
        self._sampled: list[int] = []  # the model's own ids, whatever the response shows
        self._done: ResponseEvent | None = None  # with `keep`: held until the record is durable

    def _numbered(self, events: list[ResponseEvent]) -> list[ResponseEvent]:
        for ev in events:
            ev.sequence_number = self._seq
            self._seq += 1
        return events

    def start(self) -> list[ResponseEvent]:
        return self._numbered(self._asm.start())

    def update(self, u: ChoiceUpdate) -> list[ResponseEvent]:
        events = self._asm.push(u)
        self._sampled += u.delta.ids
        if u.finish_reason is not None and self._keep is not None:
            *events, self._done = events
        return self._numbered(events)

    async def close(self, usage: Usage) -> list[ResponseEvent]:
        if self._done is None or self._keep is None:
            return []
        done = self._done
        try:
            await self._keep(self._asm.response, self._sampled)
        except StorageError as exc:
            done = self._asm.fail(exc)[0]
        return self._numbered([done])

    def fail(self, exc: TokenwireError) -> list[ResponseEvent]:
        return self._numbered(self._asm.fail(exc))
