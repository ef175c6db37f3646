"""The retention sweep's schedule, and a sweep that fails (the store's own behaviour under
`expire` is in test_contract.py; a real server's in test_retention_http.py)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from tokenwire.errors import StorageError
from tokenwire.storage.retention import expire_forever, sweep_interval

pytestmark = pytest.mark.anyio


def test_the_sweep_interval() -> None:
    assert sweep_interval(30) == 3_600  # hourly
    assert sweep_interval(0.01) == pytest.approx(86.4)  # a tenth of a short retention
    assert sweep_interval(2 / 86_400) == 1.0  # at most once a second


class FlakyStore:
    """Fails its first sweep; records each cut it is asked for."""

    def __init__(self) -> None:
        self.cuts: list[int] = []

    async def expire(self, before: int) -> int:
        self.cuts.append(before)
        if len(self.cuts) == 1:
            raise StorageError("the disk is full")
        return 3


async def test_a_failed_sweep_is_logged_and_tried_again(
        caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore()
    caplog.set_level(logging.INFO, logger="tokenwire.storage.retention")
    task = asyncio.create_task(expire_forever(store, 10 / 86_400))  # type: ignore[arg-type]
    try:
        for _ in range(50):
            if len(store.cuts) >= 2:
                break
            await asyncio.sleep(0.1)
    finally:
        task.cancel()
    assert len(store.cuts) == 2  # one failed, then one a second later
    assert abs(store.cuts[0] - (time.time() - 10)) < 5
    messages = [r.getMessage() for r in caplog.records]
    assert any("retention sweep failed" in m and "the disk is full" in m for m in messages)
    assert any("deleted 3 stored records" in m for m in messages)
