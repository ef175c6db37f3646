"""POST /v1/messages (Anthropic's Messages API), on the chat machinery: the request runs as a
chat request (one plan, one set of checks, the same prompt), and the choice's items
(`items.ItemAssembler`, the Responses API's) become content blocks: a `message` item a `text`
block, a `function_call` item a `tool_use` block, in the order the model wrote them, each with
its ids. Stream events follow the items' events one for one.

No HTTP here. `create` and `stream` share the assembler, so a whole message is exactly what its
stream builds for the same seed. Errors before the first event are plain HTTP errors; an error
after it ends the stream with Anthropic's `error` event.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ...config import Settings
from ...errors import TokenwireError
from ...metrics import Metrics
from ...protocol.anthropic import (
    ERROR_TYPES,
    AnthropicError,
    AnthropicErrorBody,
    AnthropicUsage,
    ContentBlock,
    ContentBlockDeltaEvent,
    ContentBlockStartEvent,
    ContentBlockStopEvent,
    CountTokensRequest,
    CountTokensResponse,
    DeltaUsage,
    InputJsonDelta,
    Message,
    MessageDelta,
    MessageDeltaEvent,
    MessageEvent,
    MessagesRequest,
    MessageStartEvent,
    MessageStopEvent,
    PingEvent,
    SignatureDelta,
    StopReason,
    TextContent,
    TextDelta,
    ThinkingContent,
    ThinkingDelta,
    ToolUseContent,
)
from ...protocol.common import ResponseWarning, Usage
from ...protocol.responses import (
    ArgumentsDeltaEvent,
    OutputFunctionCall,
    OutputItemEvent,
    OutputMessage,
    OutputReasoning,
    ReasoningDeltaEvent,
    Response,
    ResponseEvent,
    TextDeltaEvent,
)
from ...protocol.tokenize import TokenizeRequest
from ...tokenizers.registry import TokenizerRegistry
from ..chat import ChatPlan, ChatService
from ..generation import Choices, ChoiceUpdate, StreamedResponse, Totals, wire_spans
from ..guard import Guard
from ..items import ItemAssembler, new_id
from ..models import ModelRegistry
from ..params import ParamMap
from ..service import Caller, GenerationService, run_whole
from ..tokenize import TokenizeService
from .input import (
    chat_messages,
    chat_tools,
    check_request,
    is_error_warning,
    to_chat_request,
)

__all__ = ["MessagesService", "error_body"]

def error_body(exc: TokenwireError) -> AnthropicErrorBody:
    """Anthropic's error shape; tokenwire's code and param in `details` (the SDK's
    `exc.error_code` reads `details.error_code`)."""
    return AnthropicErrorBody(error=AnthropicError(
        type=ERROR_TYPES.get(exc.status_code, "api_error"), message=exc.message,
        details={"error_code": exc.code, "param": exc.param}))


def _input(item: OutputFunctionCall, index: int) -> tuple[dict[str, Any], ResponseWarning | None]:
    """A call's input object; arguments that are not one (an engine that cannot constrain
    calls wrote them) give `{}` and a warning that quotes them."""
    try:
        value = json.loads(item.arguments)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value, None
    return {}, ResponseWarning(
        code="tool_input_not_an_object", param=f"content[{index}].input",
        message=f"the model's arguments for {item.name!r} are not a JSON object: "
                f"{item.arguments!r}")


class _Blocks:
    """The assembler's items as Anthropic's message and events (a `Family`); a failure
    mid-stream ends it with Anthropic's `error` event."""

    def __init__(self, req: MessagesRequest, plan: ChatPlan):
        self._plan = plan
        ids = req.response_format_tokens
        self.asm = ItemAssembler(plan, plan.parser(), Response(
            id=plan.id, created_at=plan.created, status="in_progress", model=plan.model.id),
            ids=ids, logprobs=False)
        self.message = Message(
            id=plan.id, content=[], model=plan.model.id, stop_reason=None,
            usage=AnthropicUsage(input_tokens=len(plan.prompt), output_tokens=0),
            warnings=plan.warnings)
        if ids:
            self.message.tokenizer_version = plan.space.client.version
            self.message.template_version = plan.model.template_version
            self.message.token_ids_source = plan.source  # type: ignore[assignment]
        if req.return_token_ids and not plan.space.translate:
            self.message.prompt_token_ids = list(plan.prompt)

    def start(self) -> list[MessageEvent]:
        return [MessageStartEvent(message=self.message.model_copy(deep=True)), PingEvent()]

    def update(self, u: ChoiceUpdate) -> list[MessageEvent]:
        out: list[MessageEvent] = []
        for ev in self.asm.push(u):
            out += self._event(ev)
        if u.finish_reason is not None:
            out += self._finish(u)
        return out

    def _event(self, ev: ResponseEvent) -> list[MessageEvent]:
        if isinstance(ev, OutputItemEvent):
            i, item = ev.output_index, ev.item
            if ev.type == "response.output_item.done":
                signed: list[MessageEvent] = [ContentBlockDeltaEvent(index=i, delta=SignatureDelta(
                    signature=_signature(item)))] if isinstance(item, OutputReasoning) else []
                return [*signed, ContentBlockStopEvent(index=i)]
            block: ContentBlock
            if isinstance(item, OutputMessage):
                block = TextContent(text="")
            elif isinstance(item, OutputReasoning):
                block = ThinkingContent(thinking="", signature="")
            else:
                block = ToolUseContent(id=item.call_id, name=item.name, input={})
            return [ContentBlockStartEvent(index=i, content_block=block)]
        if isinstance(ev, ReasoningDeltaEvent):
            return [ContentBlockDeltaEvent(index=ev.output_index, delta=ThinkingDelta(
                thinking=ev.delta, token_ids=ev.token_ids))]
        if isinstance(ev, TextDeltaEvent):
            return [ContentBlockDeltaEvent(index=ev.output_index, delta=TextDelta(
                text=ev.delta, token_ids=ev.token_ids))]
        if isinstance(ev, ArgumentsDeltaEvent):
            return [ContentBlockDeltaEvent(index=ev.output_index, delta=InputJsonDelta(
                partial_json=ev.delta, token_ids=ev.token_ids))]
        return []  # the lifecycle, parts and `done`s: Anthropic has no such events

    def _finish(self, u: ChoiceUpdate) -> list[MessageEvent]:
        m, output = self.message, self.asm.response.output
        warnings = []
        for i, item in enumerate(output):
            if isinstance(item, OutputFunctionCall):
                value, warning = _input(item, i)
                warnings += [warning] if warning is not None else []
                m.content.append(ToolUseContent(id=item.call_id, name=item.name, input=value,
                                                token_ids=item.token_ids))
            elif isinstance(item, OutputReasoning):
                m.content.append(ThinkingContent(thinking=item.content[0].text,
                                                 signature=_signature(item),
                                                 token_ids=item.token_ids))
            else:
                assert isinstance(item, OutputMessage)
                m.content.append(TextContent(text=item.content[0].text,
                                             token_ids=item.token_ids))
        if warnings:
            m.warnings = [*(m.warnings or []), *warnings]
        calls = any(isinstance(b, ToolUseContent) for b in m.content)
        m.stop_reason, m.stop_sequence = _stop_reason(u, calls, complete=calls and not warnings)
        cached = u.cached_tokens
        m.usage = AnthropicUsage(input_tokens=len(self._plan.prompt) - (cached or 0),
                                 output_tokens=u.n_sampled, cache_read_input_tokens=cached)
        if m.tokenizer_version is not None:
            m.weight_versions = wire_spans(u.weight_versions)
        return [MessageDeltaEvent(
            delta=MessageDelta(stop_reason=m.stop_reason, stop_sequence=m.stop_sequence),
            usage=DeltaUsage(output_tokens=m.usage.output_tokens,
                              input_tokens=m.usage.input_tokens,
                              cache_read_input_tokens=cached),
            weight_versions=m.weight_versions, warnings=warnings or None), MessageStopEvent()]

    async def close(self, usage: Usage) -> list[MessageEvent]:
        return []

    def fail(self, exc: TokenwireError) -> list[MessageEvent]:
        return [error_body(exc)]


def _signature(item: OutputReasoning) -> str:
    """A thinking block's `signature`: opaque, as vLLM's (a random hex), here the item's."""
    return item.id.removeprefix("rs_")


def _stop_reason(u: ChoiceUpdate, calls: bool, *, complete: bool,
                 ) -> tuple[StopReason, str | None]:
    """vLLM's mapping (`_to_anthropic_stop_reason`): calls made are `tool_use`, but a stop
    string that cut one short is `stop_sequence` (a client must not run a call half written);
    and a control-plane abort is a paused turn (the client may continue it: a last assistant
    message is continued)."""
    if u.finish_reason == "length":
        return "max_tokens", None
    if u.finish_reason == "content_filter":
        return "refusal", None
    if u.finish_reason == "abort":
        return "pause_turn", None
    if complete:
        return "tool_use", None
    if isinstance(u.stop_reason, str):
        return "stop_sequence", u.stop_reason
    return ("tool_use" if calls else "end_turn"), None


class MessagesService(GenerationService):
    def __init__(self, models: ModelRegistry, tokenizers: TokenizerRegistry, settings: Settings,
                 guard: Guard, metrics: Metrics, *, chat: ChatService,
                 tokenize: TokenizeService):
        super().__init__(models, tokenizers, settings, guard, metrics)
        self._chat = chat
        self._tokenize = tokenize

    def plan(self, req: MessagesRequest, caller: Caller) -> tuple[ChatPlan, ParamMap]:
        """The chat plan of the request (every check done); errors name Messages fields."""
        chat_req, pm, errors = to_chat_request(req)
        with pm.renaming():
            plan = self._chat.plan(chat_req, caller)
        plan.id = new_id("msg")
        if errors:
            plan.warnings = [*(plan.warnings or []), is_error_warning(errors)]
        return plan, pm

    async def _updates(self, plan: ChatPlan, pm: ParamMap) -> Choices:
        with pm.renaming():
            return await self._chat.updates(plan)

    async def create(self, req: MessagesRequest, caller: Caller) -> Message:
        plan, pm = await self._prepare(self.plan, req, caller)

        async def run() -> Message:
            blocks = _Blocks(req, plan)
            totals = Totals()
            updates = await self._updates(plan, pm)
            async with contextlib.aclosing(updates):
                async for u in updates:
                    blocks.update(u)
                    if u.finish_reason is not None:
                        totals.add(u, u.index)
            self._count(plan, totals)
            return blocks.message

        return await run_whole(run)

    async def stream(self, req: MessagesRequest, caller: Caller) -> StreamedResponse[MessageEvent]:
        plan, pm = await self._prepare(self.plan, req, caller)
        return self._stream(plan, _Blocks(req, plan), await self._updates(plan, pm))

    def count_tokens(self, req: CountTokensRequest, caller: Caller) -> CountTokensResponse:
        """The prompt's length as /v1/messages would render it (its `usage.input_tokens`
        leaves out what the prefix cache served; this does not)."""
        check_request(req)
        messages, pm, _ = chat_messages(req)
        tools, _, _ = chat_tools(req)
        prefill = req.messages[-1].role == "assistant"
        with pm.renaming():
            r = self._tokenize.tokenize(TokenizeRequest(
                model=req.model, tokenizer_version=req.tokenizer_version, messages=messages,
                tools=tools, add_generation_prompt=not prefill,
                continue_final_message=prefill), caller)
        return CountTokensResponse(input_tokens=r.count)
