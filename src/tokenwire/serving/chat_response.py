"""A chat request's response, both kinds, from its plan (chat_plan.py) and its choices'
results: the whole `ChatCompletion` (`chat_completion`) and the streamed chunks (`ChatChunks`).
Tool calls are parsed out of the text (serving/toolcalls/), ids shown in the client's version."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import orjson

from ..engines.base import TokenEvent
from ..errors import TokenwireError
from ..protocol._base import Frame
from ..protocol.chat import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChoiceLogprobs,
    ResponseMessage,
)
from ..protocol.common import Usage
from ..protocol.tools import DeltaFunction, DeltaToolCall, ResponseFunction, ResponseToolCall
from .chat_plan import ChatPlan
from .generation import ChoiceResult, ChoiceUpdate, RunningUsage, migration_warnings, wire_spans
from .logprobs import chat_logprobs, chat_logprobs_json, prompt_logprobs
from .output import Delta
from .toolcalls import CallPiece, ParsedDelta

__all__ = ["ChatChunks", "ChatEvent", "chat_completion"]


def chat_completion(plan: ChatPlan, acc: Sequence[ChoiceResult],
                    usage: Usage | None) -> ChatCompletion:
    """The whole response: each choice's message (its calls parsed out of its text), ids,
    logprobs and stop; the prompt's ids and logprobs where asked for."""
    req = plan.req
    tok = plan.model.tokenizer
    as_ids = req.return_tokens_as_token_ids
    choices = []
    for i, a in enumerate(acc):
        text: str | None = a.text
        ids = plan.out_ids(a.ids)
        parser = plan.parser()
        calls = None
        if parser is not None:
            text = parser.push(Delta(a.content_ids, a.text), last=True).content
            calls = [ResponseToolCall(id=c.id, function=ResponseFunction(
                name=c.name, arguments=c.arguments)) for c in parser.calls] or None
            if calls and not text:
                text = None
        if plan.echo:
            text = plan.echo + (text or "")
        choices.append(ChatChoice(
            index=i,
            message=ResponseMessage(
                content=None if req.response_format_tokens == "only" else text,
                tool_calls=calls,
                reasoning=a.reasoning if req.include_reasoning
                and req.response_format_tokens != "only" else None,
                token_ids=ids if req.response_format_tokens else None,
                reasoning_token_ids=plan.out_ids(a.reasoning_ids)
                if req.response_format_tokens and a.reasoning_ids else None,
            ),
            logprobs=ChoiceLogprobs(content=chat_logprobs_json(
                tok, a.events, as_ids=as_ids, ids=plan.logprob_ids()))
            if req.logprobs else None,
            finish_reason=plan.finish_reason(a.finish_reason, parser),
            token_ids=ids if req.return_token_ids else None,
            stop_reason=plan.stop_reason(a.stop_reason) if plan.shows_ids else None,
            stop_logprob=_stop_logprob(req.logprobs and plan.shows_ids, a.stop_event),
            weight_versions=wire_spans(a.weight_versions),
        ))
    scored = acc[0].prompt_logprobs if req.prompt_logprobs is not None else None
    return ChatCompletion(
        **plan.envelope(),
        warnings=migration_warnings(plan.warnings, *(a.migrations for a in acc)),
        choices=choices,
        usage=usage,
        prompt_token_ids=plan.prompt if req.return_token_ids and not plan.space.translate
        else None,
        prompt_logprobs=prompt_logprobs(tok, plan.prompt, scored, as_ids=as_ids)
        if scored is not None else None,
    )


ChatEvent = ChatCompletionChunk | Frame
"""A streamed chat response's event: a chunk, or a plain text chunk already written."""

_MARK = "\x00tokenwire:text\x00"
"""Where a frame's text goes (no id, model or version holds it: it is NUL-delimited)."""


class ChatChunks:
    """The chunks of one streamed chat response (a `Family`): each choice's role chunk, a
    chunk per update that shows something (text, tool-call pieces, ids in the client's
    version, logprobs, running usage), each choice's finishing chunk, then usage. `keep`:
    stores the whole response (as the same request unstreamed would have had it) before
    any choice is told it is done."""

    def __init__(self, plan: ChatPlan,
                 keep: Callable[[list[ChoiceResult], Usage], Awaitable[None]] | None = None):
        req = plan.req
        self._plan = plan
        self._keep = keep
        self._whole = [ChoiceResult() for _ in range(req.n)] if keep is not None else []
        self._held: list[ChatCompletionChunk] = []  # with `keep`: each choice's finishing chunk
        self.env = plan.envelope()
        self._only = req.response_format_tokens == "only"
        # with ids on, every delta carries token_ids (maybe []): uniform to parse
        self._delta_ids = bool(req.response_format_tokens) or req.return_token_ids
        self._parsers = [plan.parser() for _ in range(req.n)]
        self._outs = [plan.out_stream() for _ in range(req.n)]
        self._running = RunningUsage([len(plan.prompt)] * req.n, req.stream_options)
        # a chunk of text alone (no ids, logprobs, calls, reasoning or running usage shown):
        # its bytes around the text, written once per choice by the model (`_plain`)
        self._plain = not (self._only or self._delta_ids or req.logprobs
                           or self._running.of(0) is not None)
        self._frames: dict[int, tuple[bytes, bytes]] = {}

    def update(self, u: ChoiceUpdate) -> list[ChatEvent]:
        if self._keep is not None:
            self._whole[u.index].add(u)
        shown = self.delta(u)
        out: list[ChatEvent] = [shown] if shown is not None else []
        if u.finish_reason is not None:
            (out if self._keep is None else self._held).append(self.finish(u))
        return out

    async def close(self, usage: Usage) -> list[ChatEvent]:
        out: list[ChatEvent] = []
        if self._keep is not None:
            await self._keep(self._whole, usage)
            out += self._held
        opts = self._plan.req.stream_options
        if opts is not None and opts.include_usage:
            out.append(ChatCompletionChunk(**self.env, choices=[], usage=usage))
        return out

    def fail(self, exc: TokenwireError) -> None:
        return None

    def start(self) -> list[ChatEvent]:
        """Each choice's first chunk: the role (and `echo`'s text); the first also carries
        the prompt's ids and the request's warnings."""
        plan, req = self._plan, self._plan.req
        return [ChatCompletionChunk(
            **self.env,
            choices=[ChatChunkChoice(index=i, delta=ChatDelta(
                role="assistant", content=None if self._only else plan.echo,
                token_ids=[] if self._delta_ids else None))],
            usage=self._running.of(i),
            prompt_token_ids=plan.prompt if i == 0 and req.return_token_ids
            and not plan.space.translate else None,
            warnings=plan.warnings if i == 0 else None,
        ) for i in range(req.n)]

    def delta(self, u: ChoiceUpdate) -> ChatEvent | None:
        """The chunk of an update, None when it shows nothing (text a stop string may still
        claim, a tool call's markup)."""
        req = self._plan.req
        parser = self._parsers[u.index]
        reasoning: str | None = None
        parsed: ParsedDelta | None = None
        if u.part != "content":  # reasoning, or its markers: never the tool parser's
            ids, text, events = u.delta.ids, "", u.delta.events
            if u.part == "reasoning" and req.include_reasoning and not self._only:
                reasoning = u.delta.text
            visible = bool(reasoning or (ids and self._delta_ids) or (events and req.logprobs))
        elif parser is None:
            ids, text, events = u.delta.ids, u.delta.text, u.delta.events
            visible = bool(u.delta)
        else:
            parsed = parser.push(u.delta, last=u.finish_reason is not None)
            ids, text, events = parsed.ids, parsed.content, parsed.events
            visible = bool(text or parsed.calls or (ids and self._delta_ids)
                           or (events and req.logprobs))
        self._running.add(u)
        if not visible:
            return None
        out = self._outs[u.index].push(ids)
        if self._plain and parser is None and u.part == "content" \
                and (u.weight_versions is None or u.finish_reason is not None):
            head, tail = self._frame(u.index)
            return Frame(head + orjson.dumps(text) + tail)
        return ChatCompletionChunk(**self.env, usage=self._running.of(u.index), choices=[
            ChatChunkChoice(
                index=u.index,
                delta=ChatDelta(
                    content=None if self._only or u.part != "content"
                    or (parsed is not None and not text) else text,
                    reasoning=reasoning,
                    tool_calls=_tool_deltas(parsed.calls) if parsed is not None else None,
                    token_ids=out if self._delta_ids else None),
                logprobs=ChoiceLogprobs(content=chat_logprobs(
                    self._plan.model.tokenizer, events, as_ids=req.return_tokens_as_token_ids,
                    ids=self._plan.logprob_ids())) if req.logprobs else None,
                token_ids=out if req.return_token_ids else None,
                weight_versions=None if u.finish_reason is not None
                else wire_spans(u.weight_versions))])

    def _frame(self, index: int) -> tuple[bytes, bytes]:
        """A plain text chunk's bytes before and after its text, as the model writes them
        (tests/api/test_chat_http.py holds every frame to the model's own dump)."""
        got = self._frames.get(index)
        if got is None:
            mark = orjson.dumps(_MARK)
            whole = ChatCompletionChunk(**self.env, usage=None, choices=[ChatChunkChoice(
                index=index, delta=ChatDelta(content=_MARK))]).model_dump_json().encode()
            head, found, tail = whole.partition(mark)
            assert found and mark not in tail
            got = self._frames[index] = (head, tail)
        return got

    def finish(self, u: ChoiceUpdate) -> ChatCompletionChunk:
        """A choice's last chunk: why it ended, the ids a translation held back (their text
        has gone out already), the stop id and its logprob, its weights."""
        plan, req = self._plan, self._plan.req
        rest = self._outs[u.index].finish()
        return ChatCompletionChunk(
            **self.env, usage=self._running.of(u.index),
            warnings=migration_warnings(None, u.migrations),
            choices=[ChatChunkChoice(
                index=u.index, delta=ChatDelta(token_ids=rest if self._delta_ids else None),
                finish_reason=plan.finish_reason(u.finish_reason, self._parsers[u.index]),
                token_ids=rest if req.return_token_ids and rest else None,
                stop_reason=plan.stop_reason(u.stop_reason) if plan.shows_ids else None,
                stop_logprob=_stop_logprob(req.logprobs and plan.shows_ids, u.stop_event),
                weight_versions=wire_spans(u.weight_versions))])


def _stop_logprob(shown: bool | None, stop: TokenEvent | None) -> float | None:
    """The sampled stop id's logprob, where the choice shows ids and logprobs."""
    return stop.logprob if shown and stop is not None else None


def _tool_deltas(pieces: Sequence[CallPiece]) -> list[DeltaToolCall] | None:
    """OpenAI's stream pieces: a call's first carries its id and name (and `arguments: ""`),
    the next ones pieces of its arguments; pieces of one call in one update are merged."""
    out: list[DeltaToolCall] = []
    for p in pieces:
        if out and out[-1].index == p.index and p.id is None:
            fn = out[-1].function
            fn.arguments = (fn.arguments or "") + p.arguments
            continue
        out.append(DeltaToolCall(
            index=p.index, id=p.id, type="function" if p.id is not None else None,
            function=DeltaFunction(name=p.name, arguments=p.arguments)))
    return out or None
