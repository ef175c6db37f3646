"""POST /v1/responses, on the chat machinery: the request runs as a chat request (one plan,
one set of checks, the same prompt), and the choice's updates become output items and
OpenAI's typed stream events.

No HTTP here. `create` and `stream` share one assembler, so a whole response is exactly the
last state of the stream for the same seed: the same items, split the same way, with the
same ids. The output is split into items as the tool-call parser classifies it: text is a
`message` item, each call a `function_call` item, in the order the model wrote them. Every
sampled id belongs to exactly one item, so concat(items' `token_ids`) is the sampled ids: ids
of the format's syntax (tags, the `{"name": ...` head) go with the call they frame, and one
update whose token spans text and a call goes with the call.

Errors before the first event are plain HTTP errors (`stream` returns its iterator only once
the request is admitted); an error after it ends the stream with `response.failed`, whose
`response.error` is the error's body (the lifecycle needs the response built so far, which
only this module has, so this is not left to the SSE layer).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from ..config import Settings
from ..engines.base import TokenEvent
from ..errors import TokenwireError
from ..metrics import Metrics
from ..protocol.common import Usage
from ..protocol.responses import (
    INPUT_TOKEN_IDS,
    LOGPROBS,
    OUTPUT_TOKEN_IDS,
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    IncompleteDetails,
    OutputFunctionCall,
    OutputItemEvent,
    OutputMessage,
    OutputTextPart,
    Response,
    ResponseErrorInfo,
    ResponseEvent,
    ResponseLifecycleEvent,
    ResponsesRequest,
    ResponseUsage,
    TextDeltaEvent,
    TextDoneEvent,
)
from ..tokenizers.registry import TokenizerRegistry
from .chat import ChatPlan, ChatService
from .generation import ChoiceUpdate, wire_spans
from .guard import Guard
from .logprobs import chat_logprobs
from .models import ModelRegistry
from .plan import GenerationService, run_whole
from .responses_input import ParamMap, to_chat_request
from .toolparser import ToolCallParser

__all__ = ["ResponsesService"]

log = logging.getLogger(__name__)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Assembler:
    """Choice updates in, events out; `response` is the response as far as it got."""

    def __init__(self, req: ResponsesRequest, plan: ChatPlan, parser: ToolCallParser | None):
        self._plan = plan
        self._parser = parser
        self._out = plan.out_stream()
        """The output ids in the client's version, translated as a stream (held back where
        later ids could still change them) when the model's version is not the client's."""
        self._ids = req.includes(OUTPUT_TOKEN_IDS)
        self._logprobs = req.includes(LOGPROBS)
        self._tok = plan.model.tokenizer
        self._pending: tuple[list[int], list[TokenEvent]] = ([], [])
        self.response = Response(
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
        if self._ids:
            self.response.tokenizer_version = plan.space.client.version
            self.response.token_ids_source = plan.source  # type: ignore[assignment]
            self.response.template_version = plan.model.template_version
        if req.includes(INPUT_TOKEN_IDS) and not plan.space.translate:
            self.response.input_token_ids = list(plan.prompt)

    # -- the lifecycle --------------------------------------------------------------------------

    def start(self) -> list[ResponseEvent]:
        return [ResponseLifecycleEvent(type="response.created", response=self._snapshot()),
                ResponseLifecycleEvent(type="response.in_progress", response=self._snapshot())]

    def push(self, u: ChoiceUpdate) -> list[ResponseEvent]:
        last = u.finish_reason is not None
        out: list[ResponseEvent] = []
        if self._parser is None:
            content, calls = u.delta.text, []
            ids, events = u.delta.ids, u.delta.events
        else:
            parsed = self._parser.push(u.delta, last=last)
            content, calls, ids, events = parsed.content, parsed.calls, parsed.ids, parsed.events
        ids = self._out.push(ids) + (self._out.finish() if last else [])
        # text after a call that is still open follows it; otherwise it leads. The ids of an
        # update that carries a call go with the call (syntax and all)
        text_first = not isinstance(self._current(), OutputFunctionCall)
        text_ids: tuple[list[int], list[TokenEvent]] = ([], []) if calls else (ids, events)
        if content and text_first:
            out += self._text(content, text_ids)
        for p in calls:
            if p.id is not None:
                out += self._close()
                out += self._open(OutputFunctionCall(
                    id=_new_id("fc"), status="in_progress", call_id=p.id, name=p.name or "",
                    arguments="", token_ids=[] if self._ids else None))
            if p.arguments:
                out += self._arguments(p.arguments, ([], []))
        if content and not text_first:
            out += self._text(content, text_ids)
        if calls or not content:
            out += self._syntax(ids, events)
        if last:
            if not self.response.output:
                out += self._text("", ([], []))
            self._pending = ([], [])
            out += self._finish(u)
        return out

    def fail(self, exc: TokenwireError) -> list[ResponseEvent]:
        for item in self.response.output:
            if item.status == "in_progress":
                item.status = "incomplete"
        self.response.status = "failed"
        body = exc.to_body()["error"]
        self.response.error = ResponseErrorInfo(code=body["code"], message=body["message"],
                                                param=body["param"], type=body["type"])
        return [ResponseLifecycleEvent(type="response.failed", response=self._snapshot())]

    def usage(self, u: ChoiceUpdate) -> Usage:
        return Usage.of(len(self._plan.prompt), u.n_sampled, u.cached_tokens)

    # -- items ----------------------------------------------------------------------------------

    def _current(self) -> OutputMessage | OutputFunctionCall | None:
        out = self.response.output
        return out[-1] if out and out[-1].status == "in_progress" else None

    def _open(self, item: OutputMessage | OutputFunctionCall) -> list[ResponseEvent]:
        index = len(self.response.output)
        self.response.output.append(item)
        events: list[ResponseEvent] = [OutputItemEvent(
            type="response.output_item.added", output_index=index,
            item=item.model_copy(deep=True))]
        if isinstance(item, OutputMessage):
            part = OutputTextPart(text="")
            item.content.append(part)
            events.append(ContentPartEvent(type="response.content_part.added",
                                           item_id=item.id, output_index=index,
                                           part=part.model_copy(deep=True)))
        return events

    def _take(self, ids: list[int], events: list[TokenEvent],
              ) -> tuple[list[int], list[TokenEvent]]:
        """This delta's ids and events, with any that were waiting for an item first."""
        waiting_ids, waiting_events = self._pending
        self._pending = ([], [])
        return waiting_ids + ids, waiting_events + events

    def _text(self, text: str, ids_events: tuple[list[int], list[TokenEvent]],
              ) -> list[ResponseEvent]:
        out: list[ResponseEvent] = []
        item = self._current()
        if not isinstance(item, OutputMessage):
            out += self._close()
            out += self._open(OutputMessage(id=_new_id("msg"), status="in_progress",
                                            content=[], token_ids=[] if self._ids else None))
            item = self._current()
        assert isinstance(item, OutputMessage)
        ids, events = self._take(*ids_events)
        part = item.content[0]
        part.text += text
        lps = chat_logprobs(self._tok, events, ids=self._plan.logprob_ids()) \
            if self._logprobs else []
        part.logprobs += lps
        if item.token_ids is not None:
            item.token_ids += ids
        if text or lps or (ids and self._ids):
            out.append(TextDeltaEvent(item_id=item.id, output_index=self._index(), delta=text,
                                      logprobs=lps, token_ids=ids if self._ids else None))
        return out

    def _arguments(self, text: str, ids_events: tuple[list[int], list[TokenEvent]],
                   ) -> list[ResponseEvent]:
        item = self._current()
        assert isinstance(item, OutputFunctionCall)
        ids, _ = self._take(*ids_events)
        item.arguments += text
        if item.token_ids is not None:
            item.token_ids += ids
        if not text and not (ids and self._ids):
            return []
        return [ArgumentsDeltaEvent(item_id=item.id, output_index=self._index(), delta=text,
                                    token_ids=ids if self._ids else None)]

    def _syntax(self, ids: list[int], events: list[TokenEvent]) -> list[ResponseEvent]:
        """Ids that carry no text of their own go with the item open now, or the next one."""
        if not ids:
            return []
        item = self._current()
        if isinstance(item, OutputFunctionCall):
            return self._arguments("", (ids, events))
        if isinstance(item, OutputMessage):
            return self._text("", (ids, events))
        self._pending = (self._pending[0] + ids, self._pending[1] + events)
        return []

    def _close(self, status: str = "completed") -> list[ResponseEvent]:
        item = self._current()
        if item is None:
            return []
        index = self._index()
        item.status = status  # type: ignore[assignment]
        out: list[ResponseEvent] = []
        if isinstance(item, OutputMessage):
            part = item.content[0]
            out.append(TextDoneEvent(item_id=item.id, output_index=index, text=part.text,
                                     logprobs=part.logprobs))
            out.append(ContentPartEvent(type="response.content_part.done", item_id=item.id,
                                        output_index=index, part=part.model_copy(deep=True)))
        else:
            out.append(ArgumentsDoneEvent(item_id=item.id, output_index=index, name=item.name,
                                          arguments=item.arguments))
        out.append(OutputItemEvent(type="response.output_item.done", output_index=index,
                                   item=item.model_copy(deep=True)))
        return out

    def _index(self) -> int:
        return len(self.response.output) - 1

    def _finish(self, u: ChoiceUpdate) -> list[ResponseEvent]:
        r = self.response
        reason = u.finish_reason
        out = self._close("incomplete" if reason in ("length", "content_filter", "abort")
                          else "completed")
        r.usage = ResponseUsage.of(len(self._plan.prompt), u.n_sampled,
                                   u.cached_tokens)
        if self._ids:
            r.weight_versions = wire_spans(u.weight_versions)
        if reason == "length":
            r.status, r.incomplete_details = "incomplete", IncompleteDetails(
                reason="max_output_tokens")
        elif reason == "content_filter":
            r.status, r.incomplete_details = "incomplete", IncompleteDetails(
                reason="content_filter")
        elif reason == "abort":  # a control-plane pause ended it (vLLM: "cancelled")
            r.status = "cancelled"
        else:
            r.status, r.completed_at = "completed", int(time.time())
        kind = "response.completed" if r.status == "completed" else "response.incomplete"
        return [*out, ResponseLifecycleEvent(type=kind, response=self._snapshot())]

    def _snapshot(self) -> Response:
        return self.response.model_copy(deep=True)


def _dump(value: Any) -> Any:
    return value.model_dump(by_alias=True, exclude_none=True) if hasattr(value, "model_dump") \
        else value


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
        plan.id = _new_id("resp")
        return plan, pm

    async def _updates(self, plan: ChatPlan, pm: ParamMap) -> AsyncGenerator[ChoiceUpdate, None]:
        try:
            return await self._chat.updates(plan)
        except TokenwireError as exc:
            pm.translate(exc)
            raise

    def _assembler(self, req: ResponsesRequest, plan: ChatPlan) -> _Assembler:
        return _Assembler(req, plan, plan.parser())

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

    async def _events(self, asm: _Assembler, plan: ChatPlan,
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
