"""Run the `n` choices of one request on an engine and merge their updates into one stream.

Every choice is admitted by the engine before anything is yielded, so a full queue is a clean
429 before the response starts. Leaving the iterator early (client gone, error) closes every
engine stream, which cancels the sequences and frees their slots.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

from ..engines.base import Engine, EngineEvent, FinishEvent, SamplingParams, TokenEvent
from ..tokenizers.hf import HFTokenizer
from .output import Delta, OutputDecoder

__all__ = ["ChoiceUpdate", "run_choices"]


@dataclass
class ChoiceUpdate:
    index: int
    delta: Delta
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    n_sampled: int = 0
    """On the finishing update: every token the model sampled for this choice."""


async def _pump(index: int, stream: AsyncIterator[EngineEvent], decoder: OutputDecoder,
                out: asyncio.Queue[ChoiceUpdate | BaseException]) -> None:
    n_sampled = 0
    try:
        async for ev in stream:
            if isinstance(ev, TokenEvent):
                n_sampled += 1
                delta = decoder.push(ev)
                if decoder.stop_string is not None:
                    out.put_nowait(ChoiceUpdate(index, delta, "stop", decoder.stop_string,
                                                n_sampled))
                    return
                if delta:
                    out.put_nowait(ChoiceUpdate(index, delta))
            elif isinstance(ev, FinishEvent):
                stop_reason = None
                if ev.stop_token is not None:
                    n_sampled += 1
                    stop_reason = ev.stop_token.token_id
                out.put_nowait(ChoiceUpdate(index, decoder.finish(), ev.reason, stop_reason,
                                            n_sampled))
                return
    except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
        out.put_nowait(exc)
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def run_choices(engine: Engine, prompt: Sequence[int], params: Sequence[SamplingParams],
                      tokenizer: HFTokenizer, stop: Sequence[str], *,
                      token_aligned: bool) -> AsyncGenerator[ChoiceUpdate, None]:
    streams: list[AsyncIterator[EngineEvent]] = []
    try:
        for p in params:
            streams.append(engine.generate(prompt, p))
    except BaseException:
        for s in streams:
            aclose = getattr(s, "aclose", None)
            if aclose is not None:
                await aclose()
        raise
    decoders = [OutputDecoder(tokenizer, stop, token_aligned=token_aligned) for _ in streams]
    return _merge(streams, decoders)


async def _merge(streams: list[AsyncIterator[EngineEvent]],
                 decoders: list[OutputDecoder]) -> AsyncGenerator[ChoiceUpdate, None]:
    queue: asyncio.Queue[ChoiceUpdate | BaseException] = asyncio.Queue()
    tasks = [
        asyncio.create_task(_pump(i, s, d, queue))
        for i, (s, d) in enumerate(zip(streams, decoders, strict=True))
    ]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.finish_reason is not None:
                remaining -= 1
            yield item
    finally:
        for t in tasks:
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
