"""POST /v1/responses, on the chat machinery: the request runs as a chat request (one plan,
one set of checks, the same prompt), and the choice's updates become output items and
OpenAI's typed stream events.

No HTTP here. `create` and `stream` share one assembler (`items.ItemAssembler`), so a whole
response is exactly the last state of the stream for the same seed: the same items, split the
same way, with the same ids.

Errors before the first event are plain HTTP errors (`stream` returns its iterator only once
the request is admitted); an error after it ends the stream with `response.failed`, whose
`response.error` is the error's body (the lifecycle needs the response built so far, which
only this module has, so this is not left to the SSE layer).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from ..config import Settings
from ..errors import TokenwireError
from ..metrics import Metrics
from ..protocol.common import Usage
from ..protocol.responses import (
    INPUT_TOKEN_IDS,
    LOGPROBS,
    OUTPUT_TOKEN_IDS,
    Response,
    ResponseEvent,
    ResponsesRequest,
)
from ..tokenizers.registry import TokenizerRegistry
from .chat import ChatPlan, ChatService
from .generation import ChoiceUpdate
from .guard import Guard
from .items import ItemAssembler, new_id
from .models import ModelRegistry
from .plan import GenerationService, run_whole
from .responses_input import ParamMap, to_chat_request

__all__ = ["ResponsesService"]

log = logging.getLogger(__name__)


def _dump(value: Any) -> Any:
    return value.model_dump(by_alias=True, exclude_none=True) if hasattr(value, "model_dump") \
        else value


def _response(req: ResponsesRequest, plan: ChatPlan) -> Response:
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
        warnings=plan.warnings,
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
                 guard: Guard, metrics: Metrics):
        super().__init__(models, tokenizers, settings, guard, metrics)
        self._chat = ChatService(models, tokenizers, settings, guard, metrics)

    def plan(self, req: ResponsesRequest) -> tuple[ChatPlan, ParamMap]:
        """The chat plan of the request (every check done); errors name Responses fields."""
        chat_req, pm = to_chat_request(req)
        try:
            plan = self._chat.plan(chat_req)
        except TokenwireError as exc:
            pm.translate(exc)
            raise
        plan.id = new_id("resp")
        return plan, pm

    async def _updates(self, plan: ChatPlan, pm: ParamMap) -> AsyncGenerator[ChoiceUpdate, None]:
        try:
            return await self._chat.updates(plan)
        except TokenwireError as exc:
            pm.translate(exc)
            raise

    def _assembler(self, req: ResponsesRequest, plan: ChatPlan) -> ItemAssembler:
        return ItemAssembler(plan, plan.parser(), _response(req, plan),
                             ids=req.includes(OUTPUT_TOKEN_IDS), logprobs=req.includes(LOGPROBS))

    async def create(self, req: ResponsesRequest) -> Response:
        plan, pm = await self._prepare(self.plan, req)

        async def run() -> Response:
            asm = self._assembler(req, plan)
            updates = await self._updates(plan, pm)
            async with contextlib.aclosing(updates):
                async for u in updates:
                    asm.push(u)
                    if u.finish_reason is not None:
                        self._served(plan, asm.usage(u))
            return asm.response

        return await run_whole(run)

    async def stream(self, req: ResponsesRequest) -> AsyncIterator[ResponseEvent]:
        plan, pm = await self._prepare(self.plan, req)
        updates = await self._updates(plan, pm)
        return self._events(self._assembler(req, plan), plan, updates)

    async def _events(self, asm: ItemAssembler, plan: ChatPlan,
                      updates: AsyncGenerator[ChoiceUpdate, None],
                      ) -> AsyncIterator[ResponseEvent]:
        seq = 0

        def numbered(events: list[ResponseEvent]) -> list[ResponseEvent]:
            nonlocal seq
            for ev in events:
                ev.sequence_number = seq
                seq += 1
            return events

        counted = False
        try:
            for ev in numbered(asm.start()):
                yield ev
            try:
                async for u in updates:
                    events = asm.push(u)
                    if u.finish_reason is not None:
                        self._served(plan, asm.usage(u))
                        counted = True
                    for ev in numbered(events):
                        yield ev
            except TokenwireError as exc:
                for ev in numbered(asm.fail(exc)):
                    yield ev
            except Exception as exc:  # noqa: BLE001 - the stream must end in its lifecycle
                log.exception("stream failed")
                err = TokenwireError(f"the stream failed: {type(exc).__name__}",
                                     code="internal_error")
                for ev in numbered(asm.fail(err)):
                    yield ev
        finally:
            await updates.aclose()
            if not counted:  # cut short: its prompt still counts
                self._served(plan, Usage.of(len(plan.prompt), 0))
