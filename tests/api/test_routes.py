"""The disconnect watcher of whole responses (and of stream admission), on its own: whichever
way the wait ends, neither the watcher nor the work outlives it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from tokenwire.api.routes import _ClientGone, _unless_disconnected

pytestmark = pytest.mark.anyio


def request(hang_up_after: float | None) -> Request:
    """A request whose client hangs up after that many seconds (None: never)."""

    async def receive() -> dict[str, Any]:
        if hang_up_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(hang_up_after or 0)
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


class Work:
    """A piece of work that takes `seconds`, and notes whether its cleanup ran."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.cleaned_up = False

    async def __call__(self) -> str:
        try:
            await asyncio.sleep(self.seconds)
            return "done"
        finally:
            await asyncio.sleep(0.01)  # e.g. closing the engine streams it admitted
            self.cleaned_up = True


def others() -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]


async def test_the_work_finishing_leaves_no_watcher_behind() -> None:
    before = others()
    work = Work(0.01)
    assert await _unless_disconnected(request(None), work()) == "done"
    assert others() == before  # the watcher is gone, not merely asked to go


async def test_a_client_gone_cancels_the_work_and_waits_for_its_cleanup() -> None:
    before = others()
    work = Work(10)
    with pytest.raises(_ClientGone):
        await _unless_disconnected(request(0.01), work())
    assert work.cleaned_up  # the engine is free before the 499 goes out
    assert others() == before


async def test_a_cancelled_request_takes_its_work_with_it() -> None:
    before = others()
    work = Work(10)
    outer = asyncio.ensure_future(_unless_disconnected(request(None), work()))
    await asyncio.sleep(0.01)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert work.cleaned_up
    assert others() == before
