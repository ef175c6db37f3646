"""A bounded load on the real server: every good request completes with the stream invariants,
no 5xx, and /health stays responsive throughout. bench/load.py runs a larger one.

The load comes from a process of its own: the server under test runs in a thread of this one,
and a client in the same interpreter would share its GIL, so /health's latency would measure
the client's JSON parsing as well as the server's loop."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import LiveServer

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]


def test_mixed_load(live_server: LiveServer) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "load.py"), "--url", live_server.url, "--json",
         "--good", "24", "--bad", "12", "--drop", "12", "--concurrency", "12",
         "--max-tokens", "24"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    s = json.loads(out.stdout.strip().splitlines()[-1])
    print(s)
    assert s["failures"] == []
    assert s["5xx"] == 0
    assert s["good_completed"] == 24 and s["malformed_4xx"] == 12 and s["disconnected"] == 12
    assert s["health_probes"] >= 5
    assert s["health_p99_ms"] < 1000, s  # generous: a blocked loop stalls for whole decodes
    engine = live_server.app.state.models.get("SmolLM2-135M-Instruct").engine  # type: ignore[attr-defined]
    deadline = time.monotonic() + 2  # the engine process reports its queues every 0.1 s
    while (engine.n_active or engine.n_waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.n_active == 0 and engine.n_waiting == 0  # nothing leaked
