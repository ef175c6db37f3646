"""The board the workers of one box share (engines/upstream/board.py), across real processes."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from tokenwire.engines.upstream.board import MAX_LABEL, RUN_DIR_ENV, Board

KEY = ["vllm", "http://a:8000", "http://b:8000"]


def _worker(run_dir: str, started: multiprocessing.synchronize.Event,
            done: multiprocessing.synchronize.Event) -> None:
    os.environ[RUN_DIR_ENV] = run_dir
    board = Board(KEY, 2, max_workers=2)
    board.enter(1)
    board.enter(1)
    board.count_served(1)
    board.found_down(0, "the connection broke mid-stream")
    board.paused = "keep"
    board.weight_version = "step-7"
    started.set()
    done.wait(30)
    board.leave(1)


def test_workers_see_one_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    ctx = multiprocessing.get_context("spawn")
    started, done = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_worker, args=(str(tmp_path), started, done))
    other.start()
    try:
        assert started.wait(60)
        board = Board(KEY, 2, max_workers=2)
        board.enter(1)
        assert [board.in_flight(0), board.in_flight(1)] == [0, 3]  # the box's load
        assert board.served(1) == 1
        assert board.downs(0) == 1 and board.down_reason(0) == "the connection broke mid-stream"
        assert (board.paused, board.weight_version) == ("keep", "step-7")
        done.set()
        other.join(30)
        assert board.in_flight(1) == 2  # a worker that died without closing: until replaced
        third = ctx.Process(target=Board, args=(KEY, 2, 2))  # its replacement takes the row
        third.start()
        third.join(30)
        assert board.in_flight(1) == 1
        board.close()
        assert board.in_flight(1) == 0
    finally:
        done.set()
        other.join(30)
    # another engine (other upstreams) has a board of its own
    assert Board(["vllm", "http://c:8000"], 1, max_workers=2).paused is None


def test_one_worker_uses_memory_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    a, b = Board(KEY, 2), Board(KEY, 2)
    a.enter(0)
    a.paused = "abort"
    a.weight_version = "é" * (MAX_LABEL // 2)
    assert (b.in_flight(0), b.paused) == (0, None)  # two engines in one process share nothing
    assert a.weight_version == "é" * (MAX_LABEL // 2)
    with pytest.raises(ValueError, match="at most"):
        a.weight_version = "x" * (MAX_LABEL + 1)
    a.weight_version = None
    assert a.weight_version is None
