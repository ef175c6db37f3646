"""A bounded load on the real server: every good request completes with the stream invariants,
no 5xx, and /health stays responsive throughout. bench/load.py runs a larger one."""

from __future__ import annotations

import asyncio
import time

import pytest
from bench.load import run_load

from tests.conftest import LiveServer

pytestmark = pytest.mark.engine


def test_mixed_load(live_server: LiveServer) -> None:
    rep = asyncio.run(run_load(live_server.url, good=24, bad=12, drop=12, concurrency=12,
                               max_tokens=24))
    s = rep.summary()
    print(s)
    assert rep.invariant_failures == []
    assert s["5xx"] == 0
    assert s["good_completed"] == 24 and s["malformed_4xx"] == 12 and s["disconnected"] == 12
    assert len(rep.health) >= 5
    assert s["health_p99_ms"] < 1000, s  # generous: a blocked loop stalls for whole decodes
    engine = live_server.app.state.models.get("SmolLM2-135M-Instruct").engine  # type: ignore[attr-defined]
    deadline = time.monotonic() + 2  # the engine process reports its queues every 0.1 s
    while (engine.n_active or engine.n_waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.n_active == 0 and engine.n_waiting == 0  # nothing leaked
