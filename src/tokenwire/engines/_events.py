"""`QueuedEvents`: the events of one sequence, handed over through an asyncio queue by whoever
produces them (the embedded engine's worker thread, the engine process's connection)."""

from __future__ import annotations

import asyncio

from .base import EngineEvent, FinishEvent

__all__ = ["QueuedEvents"]


class QueuedEvents:
    """An `EventStream` over a queue of events and errors; it ends after a `FinishEvent` or an
    error (raised). `aclose` (or garbage collection) of an unfinished one calls `_cancel`."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[EngineEvent | BaseException] = asyncio.Queue()
        self.done = False

    def __aiter__(self) -> QueuedEvents:
        return self

    @property
    def ready(self) -> bool:
        """The next event is at hand."""
        return not self.queue.empty()

    async def __anext__(self) -> EngineEvent:
        if self.done:
            raise StopAsyncIteration
        ev = await self.queue.get()
        if isinstance(ev, BaseException):
            self.done = True
            raise ev
        if isinstance(ev, FinishEvent):
            self.done = True
        return ev

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        if not self.done:
            self.done = True
            self._cancel()

    def _cancel(self) -> None:
        """Stop producing this sequence's events (its slot freed)."""
        raise NotImplementedError

    def __del__(self) -> None:
        self.close()
