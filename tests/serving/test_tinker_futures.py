"""Tinker's futures across the workers of a box (serving/tinker/futures.py): two boxes on one
run directory, as two workers are; the one that runs a sample wakes its own reader at once,
the other finds it by looking."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tokenwire.serving.tinker import Failed, Finished, FutureBox, Pending

pytestmark = pytest.mark.anyio


async def test_a_future_is_read_by_another_worker(tmp_path: Path) -> None:
    runs, reads = FutureBox(tmp_path), FutureBox(tmp_path)
    fid = runs.new()
    assert reads.known(fid) and not reads.known("tw-other") and not reads.known("../x")
    assert isinstance(await reads.wait(fid, 0.05), Pending)

    async def later() -> None:
        await asyncio.sleep(0.1)
        runs.finish(fid, b"\x0a\x00", {"x-tokenwire-tokenizer-version": "v"})

    task = asyncio.create_task(later())
    other, own = await asyncio.gather(reads.wait(fid, 5), runs.wait(fid, 5))
    await task
    assert other == own == Finished(b"\x0a\x00", {"x-tokenwire-tokenizer-version": "v"})
    assert reads.known(fid)  # kept: the SDK may ask again after a broken connection


async def test_a_failure_is_read_as_one(tmp_path: Path) -> None:
    runs, reads = FutureBox(tmp_path), FutureBox(tmp_path)
    fid = runs.new()
    runs.fail(fid, "prompt too long (prompt)", "user")
    assert await reads.wait(fid, 1) == Failed("prompt too long (prompt)", "user")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{fid}.err"]  # no temp file left


def test_an_app_alone_keeps_its_own_directory() -> None:
    box = FutureBox()
    directory = box._dir
    assert directory.is_dir()
    box.close()
    assert not directory.exists()
