"""The serving event loop's own upkeep: how late it runs (`tokenwire_event_loop_lag_seconds`),
and the heap given back once a burst is over.

A burst of whole answers (thousands of rollouts finishing at once) leaves their bodies' memory
free in the C allocator, which glibc keeps mapped: measured, a gateway's RSS stayed 200 MB above
idle after 256 rollouts of n 8 until `malloc_trim` gave it back (docs/hot-path.md). It is given
back when the server goes idle, never mid-burst (the next burst would fault it in again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .._heap import trim_heap
from ..metrics import Metrics

__all__ = ["upkeep"]

LAG_TICK = 0.1
"""Seconds between the lag probe's timers."""
TRIM_AFTER = 5.0
"""Seconds idle (no request in flight) after answering some, before the heap is trimmed."""


async def upkeep(metrics: Metrics, *, tick: float = LAG_TICK, idle: float = TRIM_AFTER,
                 trim: Callable[[], None] = trim_heap) -> None:
    """Runs for the app's life: a timer every `tick`, its lateness observed; the heap
    trimmed once requests were answered and none has been in flight for `idle` seconds."""
    loop = asyncio.get_running_loop()
    trimmed_at = metrics.answered
    idle_since: float | None = None
    while True:
        due = loop.time() + tick
        await asyncio.sleep(tick)
        now = loop.time()
        metrics.loop_lag(max(0.0, now - due))
        if metrics.in_flight:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= idle and metrics.answered != trimmed_at:
            trim()
            trimmed_at = metrics.answered
