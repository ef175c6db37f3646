"""A choice's updates as output items: the id-exact splitting of a generation into text and
tool calls, shared by the Responses API (which renders the items' events as they are) and the
Messages API (which renders them as content blocks).

The output is split into items as the tool-call parser classifies it: text is a `message`
item, each call a `function_call` item, in the order the model wrote them; where the model
reasons, its reasoning (split out before the parser sees anything: serving/reasoning.py) is a
`reasoning` item, its markers' ids with it. Every sampled id
belongs to exactly one item, so concat(items' `token_ids`) is the sampled ids: ids of the
format's syntax (tags, the `{"name": ...` head) go with the call they frame, and one update
whose token spans text and a call goes with the call.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from ..engines.base import TokenEvent
from ..errors import TokenwireError
from ..protocol.responses import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    IncompleteDetails,
    OutputFunctionCall,
    OutputItemEvent,
    OutputMessage,
    OutputReasoning,
    OutputTextPart,
    ReasoningDeltaEvent,
    ReasoningDoneEvent,
    ReasoningTextPart,
    Response,
    ResponseErrorInfo,
    ResponseEvent,
    ResponseLifecycleEvent,
    ResponseUsage,
    TextDeltaEvent,
    TextDoneEvent,
)
from .chat import ChatPlan
from .generation import ChoiceUpdate, wire_spans
from .logprobs import chat_logprobs
from .toolcalls import CallParser

__all__ = ["ItemAssembler", "new_id"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ItemAssembler:
    """Choice updates in, events out; `response` is the response as far as it got (its
    `output` is filled here; the caller made the rest)."""

    def __init__(self, plan: ChatPlan, parser: CallParser | None, response: Response, *,
                 ids: bool, logprobs: bool):
        self._plan = plan
        self._parser = parser
        self._out = plan.out_stream()
        """The output ids in the client's version, translated as a stream (held back where
        later ids could still change them) when the model's version is not the client's."""
        self._ids = ids
        self._logprobs = logprobs
        self._tok = plan.model.tokenizer
        self._pending: tuple[list[int], Sequence[TokenEvent]] = ([], [])
        self.response = response

    # -- the lifecycle --------------------------------------------------------------------------

    def start(self) -> list[ResponseEvent]:
        return [ResponseLifecycleEvent(type="response.created", response=self._snapshot()),
                ResponseLifecycleEvent(type="response.in_progress", response=self._snapshot())]

    def push(self, u: ChoiceUpdate) -> list[ResponseEvent]:
        if u.part != "content":  # never a finishing update
            return self._reasoning(u.delta.text if u.part == "reasoning" else "",
                                   self._out.push(u.delta.ids))
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
        text_ids: tuple[list[int], Sequence[TokenEvent]] = ([], []) if calls else (ids, events)
        if content and text_first:
            out += self._text(content, text_ids)
        for p in calls:
            if p.id is not None:
                out += self._close()
                out += self._open(OutputFunctionCall(
                    id=new_id("fc"), status="in_progress", call_id=p.id, name=p.name or "",
                    arguments="", token_ids=[] if self._ids else None))
            if p.arguments:
                out += self._arguments(p.arguments, ([], []))
        if content and not text_first:
            out += self._text(content, text_ids)
        if calls or not content:
            out += self._syntax(ids, events)
        if last:
            if not self.response.output or self._pending[0]:
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

    # -- items ----------------------------------------------------------------------------------

    def _current(self) -> OutputReasoning | OutputMessage | OutputFunctionCall | None:
        out = self.response.output
        return out[-1] if out and out[-1].status == "in_progress" else None

    def _open(self, item: OutputReasoning | OutputMessage | OutputFunctionCall,
              ) -> list[ResponseEvent]:
        index = len(self.response.output)
        self.response.output.append(item)
        events: list[ResponseEvent] = [OutputItemEvent(
            type="response.output_item.added", output_index=index,
            item=item.model_copy(deep=True))]
        if isinstance(item, OutputMessage | OutputReasoning):
            part: OutputTextPart | ReasoningTextPart = OutputTextPart(text="") \
                if isinstance(item, OutputMessage) else ReasoningTextPart(text="")
            item.content.append(part)  # type: ignore[arg-type]
            events.append(ContentPartEvent(type="response.content_part.added",
                                           item_id=item.id, output_index=index,
                                           part=part.model_copy(deep=True)))
        return events

    def _reasoning(self, text: str, ids: list[int]) -> list[ResponseEvent]:
        """Reasoning (or a marker's ids, `text` ""): into the reasoning item open now, or a
        new one."""
        out: list[ResponseEvent] = []
        item = self._current()
        if not isinstance(item, OutputReasoning):
            out += self._close()
            out += self._open(OutputReasoning(id=new_id("rs"), status="in_progress",
                                              token_ids=[] if self._ids else None))
            item = self._current()
        assert isinstance(item, OutputReasoning)
        ids, _ = self._take(ids, [])
        item.content[0].text += text
        if item.token_ids is not None:
            item.token_ids += ids
        if text or (ids and self._ids):
            out.append(ReasoningDeltaEvent(item_id=item.id, output_index=self._index(),
                                           delta=text, token_ids=ids if self._ids else None))
        return out

    def _take(self, ids: list[int], events: Sequence[TokenEvent],
              ) -> tuple[list[int], Sequence[TokenEvent]]:
        """This delta's ids and events, with any that were waiting for an item first."""
        waiting_ids, waiting_events = self._pending
        self._pending = ([], [])
        return waiting_ids + ids, [*waiting_events, *events]

    def _text(self, text: str, ids_events: tuple[list[int], Sequence[TokenEvent]],
              ) -> list[ResponseEvent]:
        out: list[ResponseEvent] = []
        item = self._current()
        if not isinstance(item, OutputMessage):
            out += self._close()
            out += self._open(OutputMessage(id=new_id("msg"), status="in_progress",
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

    def _arguments(self, text: str, ids_events: tuple[list[int], Sequence[TokenEvent]],
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

    def _syntax(self, ids: list[int], events: Sequence[TokenEvent]) -> list[ResponseEvent]:
        """Ids that carry no text of their own go with the item open now, or the next one."""
        if not ids:
            return []
        item = self._current()
        if isinstance(item, OutputFunctionCall):
            return self._arguments("", (ids, events))
        if isinstance(item, OutputMessage):
            return self._text("", (ids, events))
        # none open, or the reasoning (which these ids, the content's, are not)
        self._pending = (self._pending[0] + ids, [*self._pending[1], *events])
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
        elif isinstance(item, OutputReasoning):
            thought = item.content[0]
            out.append(ReasoningDoneEvent(item_id=item.id, output_index=index,
                                          text=thought.text))
            out.append(ContentPartEvent(type="response.content_part.done", item_id=item.id,
                                        output_index=index, part=thought.model_copy(deep=True)))
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
                                   u.cached_tokens, u.reasoning_tokens)
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
