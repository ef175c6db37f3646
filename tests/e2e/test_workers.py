"""`tokenwire serve --workers 2` in front of two real tokenwire upstreams: one port, one load,
one scrape, and what one worker learns of the fleet the other knows (api/worker.py,
engines/upstream/board.py)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import _free_port
from tests.upstreams import Upstream
from tokenwire.config import default_model_path
from tokenwire.engines.upstream.routing import PrefixRouter

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"


@contextlib.contextmanager
def served(tmp: Path, upstreams: list[Upstream], **env: str) -> Iterator[tuple[str, int]]:
    """`tokenwire serve --workers 2` as a user starts it; its URL and the supervisor's pid."""
    port = _free_port()
    log = tmp / f"gateway-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm", "--workers", "2",
             *(a for u in upstreams for a in ("--upstream", u.url)),
             "--tokenizer", str(default_model_path()), "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "TOKENWIRE_TOKENIZER_STORE": str(tmp / f"store-{port}"), **env})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: len(workers(proc.pid)) == 2 and _up(url), 180, log)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert not workers(proc.pid)


def _up(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    return False


def wait_for(cond: Callable[[], object], timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out" + (f": {log.read_text()[-3000:]}" if log else ""))
        time.sleep(0.2)


def workers(parent: int) -> list[int]:
    """The serving processes uvicorn's supervisor started (not its resource tracker)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes()
            if int(fields[1]) == parent and b"spawn_main" in cmd:
                found.append(int(stat.parent.name))
    return sorted(found)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def fresh(url: str, method: str, path: str, **kw: Any) -> httpx.Response:
    """One request on a connection of its own (the kernel picks the worker that accepts it)."""
    with httpx.Client(base_url=url, timeout=120) as c:
        return c.request(method, path, **kw)


def chat(url: str, content: str, **kw: Any) -> httpx.Response:
    return fresh(url, "POST", "/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0,
        "max_tokens": 16, **kw})


def replicas(url: str) -> list[dict[str, Any]]:
    reps: list[dict[str, Any]] = fresh(url, "GET", "/health").json()["models"][MODEL]["replicas"]
    return reps


def scrape(url: str, name: str) -> float:
    text = fresh(url, "GET", "/metrics").text
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_two_workers_share_one_port_one_load_and_one_scrape(two: list[Upstream],
                                                            tmp_path: Path) -> None:
    with served(tmp_path, two) as (url, parent):
        pids = workers(parent)
        before = {p: cpu_ticks(p) for p in pids}
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: chat(url, f"Count to {i}."), range(24)))
        assert all(r.status_code == 200 for r in answers)
        spent = {p: cpu_ticks(p) - before[p] for p in pids}
        # both workers took requests: each spent a good share of what the two spent
        assert min(spent.values()) > sum(spent.values()) / 10, spent
        # four streams running, each on a connection of its own: every worker's /health
        # counts all four (the box's load, which the router's load guard reads)
        lines = [0] * 4

        def stream(i: int) -> None:
            with httpx.Client(base_url=url, timeout=120) as c, c.stream(
                    "POST", "/v1/chat/completions", json={
                        "model": MODEL, "stream": True, "max_tokens": 400, "ignore_eos": True,
                        "messages": [{"role": "user", "content": f"Story {i}."}]}) as s:
                for _ in s.iter_lines():
                    lines[i] += 1

        with ThreadPoolExecutor(4) as pool:
            running = [pool.submit(stream, i) for i in range(4)]
            wait_for(lambda: min(lines) > 10, 60)
            for _ in range(6):
                assert sum(r["in_flight"] for r in replicas(url)) == 4, lines
            for f in running:
                f.result()
        wait_for(lambda: sum(r["in_flight"] for r in replicas(url)) == 0, 30)
        assert sum(r["served"] for r in replicas(url)) == 28
        # one scrape at any worker counts every worker's requests
        for _ in range(4):
            assert scrape(url, "tokenwire_generation_requests_total") == 28
            assert scrape(url, r"tokenwire_http_requests_total\{route=\"/v1/chat/completions\","
                               r"status=\"200\"\}") == 28
            assert scrape(url, "tokenwire_num_requests_running") == 0


def test_what_one_worker_learns_every_worker_knows(two: list[Upstream], tmp_path: Path) -> None:
    """A replica one worker finds dead is out of every worker's rotation at once (no health
    check has run yet: they run every 20 s here); a pause taken by one worker is applied by the
    other's health check to the replica when it comes back."""
    with served(tmp_path, two, TOKENWIRE_HEALTH_INTERVAL="20") as (url, _):
        ids = fresh(url, "POST", "/v1/tokenize", json={"model": MODEL, "messages": [
            {"role": "user", "content": "What is seven times six?"}]}).json()["tokens"]
        # every worker has checked both replicas (one /health answers from one worker: a worker
        # that has not checked the home replica yet would route around it and never find it
        # dead, and the other would still call it healthy)
        wait_for(lambda: all(all(r["healthy"] for r in replicas(url)) for _ in range(10)), 60)
        home = PrefixRouter(2).order(ids, [True, True], [0, 0])[0]
        two[home].kill()
        try:
            r = chat(url, "What is seven times six?")
            assert r.status_code == 200  # failed over
            for _ in range(6):
                lost = replicas(url)[home]
                assert not lost["healthy"], lost
            r = fresh(url, "POST", "/pause", params={"mode": "keep"})
            by = {a["replica"]: a["status"] for a in r.json()["replicas"]}
            assert by[f"replica {home + 1}"] == 503 and by[f"replica {2 - home}"] == 200
        finally:
            two[home].start()
        wait_for(lambda: replicas(url)[home]["healthy"], 60)
        assert httpx.get(f"{two[home].url}/is_paused").json()["is_paused"] is True
        r = fresh(url, "POST", "/resume")
        assert [a["status"] for a in r.json()["replicas"]] == [200, 200]
        assert not httpx.get(f"{two[home].url}/is_paused").json()["is_paused"]
