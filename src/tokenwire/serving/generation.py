"""A request's choices, from the engine's events to its API's events: the per-token path.

`run_choices` admits the `n` choices of a request (every one before anything is yielded, so a
full queue is a clean 429 before the response starts) and returns their `Choices`: each
engine event decoded into a `ChoiceUpdate` (`_updates`: text, stop strings, reasoning split,
weight spans). A stream's `StreamedResponse` turns the updates into its API family's events
(`Family`: chat's chunks, Responses' and Messages' typed events, ...), counts usage once, and says
whether the next event is at hand (`more`) for the SSE writer (api/sse.py) to write
frames that came together in one send. docs/hot-path.md draws the whole path.

Leaving early (client gone, error) closes every engine stream, which cancels the sequences
and frees their slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from ..engines.base import (
    Engine,
    EngineEvent,
    EventStream,
    FinishEvent,
    PromptLogprobsEvent,
    SamplingParams,
    TokenEvent,
    TokenRun,
    WeightSpan,
    join_events,
)
from ..errors import (
    InvalidRequestError,
    ServiceUnavailableError,
    TokenwireError,
    internal_error,
)
from ..metrics import TokenClock, TokenTimer
from ..protocol.common import ResponseWarning, StreamOptions, Usage, WeightVersionSpan
from ..protocol.generate import GenerateStreamOptions
from ..tokenizers.base import Tokenizer
from ..tokenizers.conversions import Reason
from .output import Delta, OutputDecoder
from .reasoning import Part, ReasoningFormat, ReasoningStream

__all__ = ["ChoiceResult", "ChoiceUpdate", "Choices", "Family", "RunningUsage", "StreamedResponse",
           "Totals", "collect", "migration_warnings", "run_choices", "wire_spans"]

log = logging.getLogger(__name__)
E = TypeVar("E")


@dataclass
class ChoiceUpdate:
    index: int
    delta: Delta
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    n_sampled: int = 0
    """On the finishing update: every token the model sampled for this choice."""
    prompt_logprobs: tuple[TokenEvent, ...] | None = None
    """Once, before any output, when the prompt was scored."""
    stop_event: TokenEvent | None = None
    """On the finishing update: the end-of-generation token that ended the choice, if one did
    (it is not part of the delta)."""
    cached_tokens: int | None = None
    """On the finishing update: prompt tokens the engine's prefix cache served (if it says)."""
    weight_versions: tuple[WeightSpan, ...] | None = None
    """On the finishing update: which weights sampled which tokens (if the engine says); on
    another, the spans so far where the weights changed (the first token's included)."""
    routed_experts: str | None = None
    """On the finishing update: an MoE upstream's expert choices (vLLM's, as it sent them)."""
    migrations: tuple[str, ...] = ()
    """On the finishing update: each move to another upstream replica (a gateway's)."""
    part: Part = "content"
    """What the delta is, where the model's reasoning is split out (serving/reasoning.py):
    its reasoning, a reasoning marker's ids (no text), or content. A finishing update is
    always content (maybe empty)."""
    reasoning_tokens: int | None = None
    """On the finishing update, where reasoning is split out: how many ids were reasoning."""


@dataclass
class ChoiceResult:
    """A whole choice, gathered from its updates (for non-streaming responses)."""

    ids: list[int] = field(default_factory=list)
    """Every id sampled, in order (reasoning, markers and content)."""
    parts: list[str] = field(default_factory=list)
    """The content's text."""
    content_ids: list[int] = field(default_factory=list)
    reasoning_ids: list[int] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    events: Sequence[TokenEvent] = field(default_factory=list)
    """Every sampled token's event (a `TokenRun` where the answer came whole)."""
    prompt_logprobs: tuple[TokenEvent, ...] = ()
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    stop_event: TokenEvent | None = None
    n_sampled: int = 0
    cached_tokens: int | None = None
    weight_versions: tuple[WeightSpan, ...] | None = None
    routed_experts: str | None = None
    migrations: tuple[str, ...] = ()
    reasoning_tokens: int | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def reasoning(self) -> str | None:
        """The reasoning's text; None where no reasoning was split out."""
        return "".join(self.reasoning_parts) if self.reasoning_ids else None

    def add(self, u: ChoiceUpdate) -> None:
        self.ids += u.delta.ids
        if u.part == "content":
            self.content_ids += u.delta.ids
            self.parts.append(u.delta.text)
        elif u.part == "reasoning":
            self.reasoning_ids += u.delta.ids
            self.reasoning_parts.append(u.delta.text)
        self.events = join_events(self.events, u.delta.events)
        if u.prompt_logprobs is not None:
            self.prompt_logprobs = u.prompt_logprobs
        if u.finish_reason is not None:
            self.finish_reason = u.finish_reason
            self.stop_reason = u.stop_reason
            self.stop_event = u.stop_event
            self.n_sampled = u.n_sampled
            self.cached_tokens = u.cached_tokens
            self.weight_versions = u.weight_versions
            self.routed_experts = u.routed_experts
            self.migrations = u.migrations
            self.reasoning_tokens = u.reasoning_tokens


class RunningUsage:
    """vLLM's `stream_options.continuous_usage_stats`: each choice's usage so far, for every
    chunk to carry (`of` is None unless the request asked for it)."""

    def __init__(self, prompt_lens: Sequence[int],
                 options: StreamOptions | GenerateStreamOptions | None):
        on = options is not None and bool(options.include_usage) \
            and bool(options.continuous_usage_stats)
        self._prompts = prompt_lens
        self._sampled = [0] * len(prompt_lens) if on else None

    def add(self, u: ChoiceUpdate) -> None:
        if self._sampled is not None:
            self._sampled[u.index] = u.n_sampled if u.finish_reason is not None \
                else self._sampled[u.index] + len(u.delta.ids)

    def of(self, index: int) -> Usage | None:
        if self._sampled is None:
            return None
        return Usage.of(self._prompts[index], self._sampled[index])


async def collect(updates: Choices, n: int) -> list[ChoiceResult]:
    results = [ChoiceResult() for _ in range(n)]
    async with contextlib.aclosing(updates):
        async for u in updates:
            results[u.index].add(u)
    return results


OutputCheck = Callable[[str], object | None]


class Choices:
    """The updates of a request's choices as they come (one choice: read where it is
    consumed, no task, no queue). `more`: the update just yielded has another behind it at
    hand (the engine holds the next event already, as when an upstream's events arrive
    together)."""

    __slots__ = ("_streams", "_updates", "more")

    def __init__(self, streams: list[EventStream],
                 updates: Callable[[Choices], AsyncGenerator[ChoiceUpdate, None]]) -> None:
        """`updates`: the streams' updates, given this to say `more` on."""
        self.more = False
        self._streams = streams
        self._updates = updates(self)

    def __aiter__(self) -> AsyncGenerator[ChoiceUpdate, None]:
        return self._updates

    async def aclose(self) -> None:
        await self._updates.aclose()
        for s in self._streams:  # closed already, unless the updates were never read
            await s.aclose()


@dataclass
class Totals:
    """What a response's usage counts of its choices: those that finished."""

    sampled: int = 0
    reasoning: int = 0
    cached: dict[int, int | None] = field(default_factory=dict)
    """By choice index: the prompt tokens its engine's prefix cache served (None: unknown)."""

    def add(self, u: ChoiceUpdate | ChoiceResult, index: int) -> None:
        self.sampled += u.n_sampled
        self.reasoning += u.reasoning_tokens or 0
        self.cached[index] = u.cached_tokens

    @classmethod
    def of(cls, results: Sequence[ChoiceResult]) -> Totals:
        t = cls()
        for i, r in enumerate(results):
            t.add(r, i)
        return t


def _pieces(split: ReasoningStream | None, delta: Delta,
            last: bool = False) -> list[tuple[Part, Delta]]:
    if split is None:
        return [("content", delta)] if delta or last else []
    return split.push(delta, last=last)


async def _updates(index: int, stream: EventStream, decoder: OutputDecoder,
                   check: OutputCheck | None, clock: TokenClock | None,
                   flow: Choices | None = None, split: ReasoningStream | None = None,
                   ) -> AsyncGenerator[ChoiceUpdate, None]:
    """One choice's updates: its tokens decoded into deltas (split into reasoning and content
    by `split`, where the model reasons), then its finish. The stream is closed however this
    ends. With a `flow` (a choice read alone), each update says there whether the engine
    stream holds the next event already (`EventStream.ready`)."""
    n_sampled = 0
    text = ""
    changes: list[tuple[str, int]] = []  # (weight version, first output index)
    changed = False  # a change not told yet (its token's delta may be held back)
    try:
        async for item in stream:
            if isinstance(item, TokenRun):
                # a whole answer's tokens at once: one update, unless a stop string or the
                # output check must see them one by one (then they go as events below)
                delta = decoder.push_run(item) if check is None else None
                if delta is not None:
                    n_sampled += len(item)
                    if clock is not None:
                        clock.token()  # they came together: only the first is timed
                    pieces = _pieces(split, delta)
                    for k, (part, d) in enumerate(pieces):
                        if flow is not None:
                            flow.more = k + 1 < len(pieces) or stream.ready
                        yield ChoiceUpdate(index, d, part=part)
                    continue
            for ev in (item if isinstance(item, TokenRun) else (item,)):
                if isinstance(ev, TokenEvent):
                    if ev.weight_version is not None:
                        changes.append((ev.weight_version, n_sampled))
                        changed = True
                    n_sampled += 1
                    if clock is not None:
                        clock.token()
                    delta = decoder.push(ev)
                    if check is not None and delta.text:
                        text += delta.text
                        if check(text) is not None:  # withhold the delta that completed it
                            yield ChoiceUpdate(index, Delta(), "content_filter", None, n_sampled,
                                               reasoning_tokens=_reasoning_tokens(split))
                            return
                    if decoder.stop_string is not None:
                        before, last = _last_content(_pieces(split, delta, last=True))
                        for part, d in before:
                            yield ChoiceUpdate(index, d, part=part)
                        yield ChoiceUpdate(index, last, "stop", decoder.stop_string, n_sampled,
                                           reasoning_tokens=_reasoning_tokens(split))
                        return
                    pieces = _pieces(split, delta)
                    for k, (part, d) in enumerate(pieces):
                        if flow is not None:
                            flow.more = k + 1 < len(pieces) or stream.ready
                        yield ChoiceUpdate(index, d, weight_versions=_spans(
                            changes, n_sampled) if changed else None, part=part)
                        changed = False
                elif isinstance(ev, PromptLogprobsEvent):
                    yield ChoiceUpdate(index, Delta(), prompt_logprobs=ev.entries)
                elif isinstance(ev, FinishEvent):
                    stop_reason = None
                    if ev.stop_token is not None:
                        n_sampled += 1
                        stop_reason = ev.stop_token.token_id
                        if clock is not None:
                            clock.token()
                    if ev.n_sampled is not None:
                        n_sampled = ev.n_sampled  # the upstream's own count (text-only engines)
                    before, last = _last_content(_pieces(split, decoder.finish(), last=True))
                    for part, d in before:
                        yield ChoiceUpdate(index, d, part=part)
                    if flow is not None:
                        flow.more = False
                    yield ChoiceUpdate(index, last, ev.reason, stop_reason, n_sampled,
                                       stop_event=ev.stop_token, cached_tokens=ev.cached_tokens,
                                       weight_versions=ev.weight_versions,
                                       routed_experts=ev.routed_experts, migrations=ev.migrations,
                                       reasoning_tokens=_reasoning_tokens(split))
                    return
        raise ServiceUnavailableError("the engine ended a sequence without finishing it")
    finally:
        if clock is not None:
            clock.close()
        await stream.aclose()


def _last_content(pieces: list[tuple[Part, Delta]]) -> tuple[list[tuple[Part, Delta]], Delta]:
    """The pieces before the finishing update, and its delta: the last piece's when that is
    content, else an empty one (a finishing update is always content)."""
    if pieces and pieces[-1][0] == "content":
        return pieces[:-1], pieces[-1][1]
    return pieces, Delta()


def _reasoning_tokens(split: ReasoningStream | None) -> int | None:
    return None if split is None else split.splitter.reasoning_ids


async def _pump(updates: AsyncGenerator[ChoiceUpdate, None],
                out: asyncio.Queue[ChoiceUpdate | BaseException]) -> None:
    """One choice of several: its updates into the queue they are merged from."""
    try:
        async with contextlib.aclosing(updates):
            async for u in updates:
                out.put_nowait(u)
    except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
        out.put_nowait(exc)


async def _close_admitted(tasks: Sequence[asyncio.Future[EventStream]]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if not t.cancelled() and t.exception() is None:
            await t.result().aclose()


async def run_choices(engine: Engine, jobs: Sequence[tuple[Sequence[int], SamplingParams]],
                      tokenizer: Tokenizer, stop: Sequence[str], *,
                      token_aligned: bool, output_check: OutputCheck | None = None,
                      keep_stop_token: bool = False, timer: TokenTimer | None = None,
                      include_stop: bool = False, skip_special: bool = False,
                      min_tokens: int = 0, text: Reason | None = "output",
                      whole: bool = False, reasoning: tuple[ReasoningFormat, bool] | None = None,
                      coalesce: bool = False, stop_at_end: bool = False) -> Choices:
    """One choice per (prompt, params) job; updates carry the job's index. With a `timer`,
    each choice's tokens are timed from now (admission and queueing included). `text`: why
    the output's text is read, None where nobody reads it (`OutputDecoder`); an
    `output_check` reads it. `whole`: the caller reads only the finished output; unless a stop
    string or the output check may end a choice early (the upstream would generate on), an
    engine that can answer in one body (`answers_whole`: vLLM's) is told so
    (`SamplingParams.whole`). `reasoning`: the model's reasoning format and whether the prompt
    leaves it inside its reasoning: each choice's ids are split into reasoning and content
    (`ChoiceUpdate.part`). `coalesce`: tokens already at hand together make one update
    (`_Coalesced`). `stop_at_end`: TGI's stop rule (`OutputDecoder`)."""
    if output_check is not None and text is None:
        text = "policy"
    whole = whole and not stop and output_check is None and engine.info.answers_whole
    if whole:
        jobs = [(prompt, dataclasses.replace(p, whole=True)) for prompt, p in jobs]
    # a whole answer's tokens come together: no inter-token latency to observe
    clocks = [timer.clock(inter_token=not whole) if timer is not None else None for _ in jobs]
    most = engine.info.max_sequences
    if most is not None and len(jobs) > most:
        raise InvalidRequestError(
            f"this request needs {len(jobs)} sequences (prompts x n); this server holds at "
            f"most {most} at once", param="n", code="invalid_value")
    # admitted together (one round trip, not n, on an upstream); all or none, also when the
    # client goes away meanwhile (cancelled): what was admitted is closed again
    tasks = [asyncio.ensure_future(engine.submit(prompt, p)) for prompt, p in jobs]
    try:
        await asyncio.wait(tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await _close_admitted(tasks)
        raise
    failed = [t.exception() for t in tasks if t.exception() is not None]
    if failed:
        await _close_admitted(tasks)
        raise failed[0]  # type: ignore[misc]
    streams = [t.result() if not coalesce else _Coalesced(t.result()) for t in tasks]
    decoders = [OutputDecoder(tokenizer, stop, token_aligned=token_aligned,
                              keep_stop_token=keep_stop_token, include_stop=include_stop,
                              skip_special=skip_special, min_tokens=min_tokens, text=text,
                              stop_at_end=stop_at_end)
                for _ in streams]
    splits = [None if reasoning is None else ReasoningStream(
        tokenizer, reasoning[0], inside=reasoning[1], text=text is not None,
        skip=tokenizer.special_ids if skip_special else frozenset()) for _ in streams]
    return _merge(streams, decoders, output_check, clocks, splits)


class _Coalesced:
    """An engine stream whose tokens already at hand come as one `TokenRun`: one update, so
    one event of the response, carries them all (`stream_options.coalesce`; vLLM's
    `--stream-interval` idea, but nothing waits: a token that arrives alone goes alone). A
    token that says more than its id (a weight change, a sampling mask) goes alone."""

    __slots__ = ("_held", "_inner")

    def __init__(self, inner: EventStream):
        self._inner = inner
        self._held: EngineEvent | None = None

    @property
    def ready(self) -> bool:
        return self._held is not None or self._inner.ready

    def __aiter__(self) -> _Coalesced:
        return self

    async def __anext__(self) -> EngineEvent:
        ev = self._held if self._held is not None else await self._inner.__anext__()
        self._held = None
        if not _plain(ev) or not self._inner.ready:
            return ev
        assert isinstance(ev, TokenEvent)
        batch = [ev]
        while self._inner.ready:
            nxt = await self._inner.__anext__()
            if _plain(nxt) and (nxt.logprob is None) == (ev.logprob is None):  # type: ignore[union-attr]
                batch.append(nxt)  # type: ignore[arg-type]
            else:
                self._held = nxt
                break
        if len(batch) == 1:
            return ev
        logprobs = None if ev.logprob is None else [e.logprob or 0.0 for e in batch]
        return TokenRun.of([e.token_id for e in batch], logprobs,
                           [e.top_logprobs for e in batch])

    async def aclose(self) -> None:
        await self._inner.aclose()


def _plain(ev: EngineEvent) -> bool:
    return isinstance(ev, TokenEvent) and ev.weight_version is None and ev.sampling_mask is None


def _merge(streams: list[EventStream], decoders: list[OutputDecoder],
           check: OutputCheck | None, clocks: list[TokenClock | None],
           splits: list[ReasoningStream | None]) -> Choices:
    if len(streams) == 1:  # the common case: read where it is consumed, no task, no queue
        return Choices(streams, lambda flow: _updates(0, streams[0], decoders[0], check,
                                                      clocks[0], flow, splits[0]))
    return Choices(streams, lambda flow: _merged([_updates(
        i, s, d, check, c, split=r) for i, (s, d, c, r) in enumerate(
            zip(streams, decoders, clocks, splits, strict=True))], flow))


async def _merged(choices: list[AsyncGenerator[ChoiceUpdate, None]], flow: Choices,
                  ) -> AsyncGenerator[ChoiceUpdate, None]:
    """Several choices' updates as they come, each choice read by a task of its own."""
    queue: asyncio.Queue[ChoiceUpdate | BaseException] = asyncio.Queue()
    tasks = [asyncio.create_task(_pump(c, queue)) for c in choices]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.finish_reason is not None:
                remaining -= 1
            flow.more = not queue.empty()
            yield item
    finally:
        for t in tasks:
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)


class Family(Protocol[E]):
    """What an API family supplies to a stream: its events. Everything else (reading the
    choices, usage, closing, in-band failure) is `StreamedResponse`'s, once for every family."""

    def start(self) -> list[E]:
        """The events before any update (chat's role chunks, Responses' `response.created`)."""
        ...

    def update(self, u: ChoiceUpdate) -> list[E]:
        """An update's events (none: it shows nothing yet); a family may hold some back."""
        ...

    async def close(self, usage: Usage) -> list[E]:
        """After every choice finished (`usage` counted): the last events, and what was held
        back until the response was stored."""
        ...

    def fail(self, exc: TokenwireError) -> list[E] | None:
        """A failure mid-stream in the family's own shape; None: the SSE writer frames it
        (OpenAI's in-band `{"error": ...}`)."""
        ...


class StreamedResponse(Generic[E]):
    """One streamed response: its choices' updates made into its family's events. `more`:
    the event just yielded has another at hand (api/sse.py writes them in one send)."""

    __slots__ = ("_events", "more")

    def __init__(self, family: Family[E], choices: Choices, count: Callable[[Totals], Usage]):
        """`count`: the response's usage from its finished choices, counted once (in the
        metrics), also when the stream is cut short."""
        self.more = False
        self._events = self._run(family, choices, count)

    def __aiter__(self) -> AsyncGenerator[E, None]:
        return self._events

    async def aclose(self) -> None:
        await self._events.aclose()

    async def _run(self, family: Family[E], choices: Choices,
                   count: Callable[[Totals], Usage]) -> AsyncGenerator[E, None]:
        totals = Totals()
        last: list[E] | None = None  # a failure's events, else what the family closes with
        try:
            events = family.start()
            for k, ev in enumerate(events, 1):
                self.more = k < len(events)
                yield ev
            async for u in choices:
                if u.finish_reason is not None:
                    totals.add(u, u.index)
                events = family.update(u)
                for k, ev in enumerate(events, 1):
                    self.more = k < len(events) or choices.more
                    yield ev
        except Exception as exc:  # noqa: BLE001 - the family ends the stream in its shape
            last = _failed(family, exc)
        finally:
            await choices.aclose()
            usage = count(totals)
        if last is None:
            try:  # what was held back (a stored response's) may still fail
                last = await family.close(usage)
            except Exception as exc:  # noqa: BLE001 - as above
                last = _failed(family, exc)
        for k, ev in enumerate(last, 1):
            self.more = k < len(last)
            yield ev


def _failed(family: Family[E], exc: Exception) -> list[E]:
    """A failure's events in the family's shape; re-raised where the family leaves it to the
    SSE writer (`Family.fail` None)."""
    err = exc if isinstance(exc, TokenwireError) else internal_error("the stream failed", exc)
    events = family.fail(err)
    if events is None:
        raise exc
    if err is not exc:
        log.error("stream failed", exc_info=exc)
    return events


def _spans(changes: Sequence[tuple[str, int]], n: int) -> tuple[WeightSpan, ...]:
    """The spans of the first `n` output tokens, from where each version began."""
    ends = [start for _, start in changes[1:]] + [n]
    return tuple(WeightSpan(v, start, end) for (v, start), end in zip(changes, ends,
                                                                       strict=True))


def migration_warnings(before: list[ResponseWarning] | None,
                       *moves: Sequence[str]) -> list[ResponseWarning] | None:
    """`before`, then `request_migrated` once per move of any choice to another upstream
    replica (its replica was lost mid-response, and the gateway continued it there:
    engines/upstream/migration.py); `before` itself when nothing moved."""
    moved = [ResponseWarning(code="request_migrated", param=None, message=m)
             for ms in moves for m in ms]
    return [*(before or []), *moved] if moved else before


def wire_spans(spans: Sequence[WeightSpan] | None) -> list[WeightVersionSpan] | None:
    """The engine's weight-version spans in vLLM's wire shape (None: the engine did not say)."""
    return None if spans is None else [WeightVersionSpan(version=w.version, start=w.start,
                                                         end=w.end) for w in spans]
