"""A bounded load on a real server over loopback: good streams, malformed requests and clients
that hang up, all at once, while /health is polled. Prints the figures docs/reliability.md
records; tests/e2e/test_load.py runs a smaller load with the same driver and asserts on it.

    .venv/bin/python bench/load.py [--good 96 --bad 48 --drop 48 --concurrency 24]

Starts its own server (the embedded model) unless --url is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

MODEL = "SmolLM2-135M-Instruct"
QUESTIONS = ["Tell me about the sea.", "Write a haiku about cats.", "Translate 'thank you' "
             "into Japanese.", "Reply with a single emoji.", "Count from 1 to 10.",
             "What is the capital of France?", "Écris une phrase en français."]
MALFORMED: list[Any] = [
    {"model": MODEL, "messages": []},
    {"model": MODEL, "messages": [{"role": "user", "content": {"type": "input_tokens",
                                                               "token_ids": [1, 2]}}]},
    {"model": MODEL, "tokenizer_version": "smollm2-49k",
     "messages": [{"role": "user", "content": {"type": "input_tokens", "token_ids": [-1]}}]},
    {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
    {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
    {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
    "not json at all",
]


@dataclass
class Report:
    good: int = 0
    good_ok: int = 0
    bad: int = 0
    bad_4xx: int = 0
    dropped: int = 0
    server_errors: int = 0
    invariant_failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # whole good requests, seconds
    ttfts: list[float] = field(default_factory=list)
    health: list[float] = field(default_factory=list)
    tokens: int = 0
    wall: float = 0.0

    def summary(self) -> dict[str, Any]:
        def pct(xs: list[float], p: float) -> float:
            return round(sorted(xs)[min(len(xs) - 1, int(p * len(xs)))], 3) if xs else 0.0

        return {
            "requests": self.good + self.bad + self.dropped, "good": self.good,
            "good_completed": self.good_ok, "malformed": self.bad, "malformed_4xx": self.bad_4xx,
            "disconnected": self.dropped, "5xx": self.server_errors,
            "invariant_failures": len(self.invariant_failures),
            "latency_p50_s": pct(self.latencies, 0.5), "latency_p99_s": pct(self.latencies, 0.99),
            "ttft_p50_s": pct(self.ttfts, 0.5), "ttft_p99_s": pct(self.ttfts, 0.99),
            "health_p50_ms": round(1000 * pct(self.health, 0.5), 1),
            "health_p99_ms": round(1000 * pct(self.health, 0.99), 1),
            "health_max_ms": round(1000 * max(self.health, default=0), 1),
            "health_probes": len(self.health),
            "tokens": self.tokens, "wall_s": round(self.wall, 1),
            "tokens_per_s": round(self.tokens / self.wall, 1) if self.wall else 0.0,
        }


async def _good(http: httpx.AsyncClient, rep: Report, rng: random.Random,
                max_tokens: int) -> None:
    body = {"model": MODEL, "stream": True, "max_tokens": max_tokens,
            "temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randrange(1 << 30),
            "response_format_tokens": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}]}
    rep.good += 1
    t0 = time.monotonic()
    ids: list[int] = []
    text = ""
    finished = done = False
    usage = None
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code >= 500:
            rep.server_errors += 1
        if r.status_code != 200:
            rep.invariant_failures.append(f"status {r.status_code}")
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                rep.invariant_failures.append(f"in-band error {ev['error']}")
                continue
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev["choices"]:
                if not ids and not text and ch["delta"].get("token_ids"):
                    rep.ttfts.append(time.monotonic() - t0)
                ids += ch["delta"].get("token_ids", [])
                text += ch["delta"].get("content") or ""
                finished = finished or ch["finish_reason"] is not None
    rep.latencies.append(time.monotonic() - t0)
    rep.tokens += len(ids)
    detok = await http.post("/v1/detokenize", json={"tokenizer_version": "smollm2-49k",
                                                    "tokens": ids})
    problems = []
    if not (done and finished and usage):
        problems.append("stream did not end properly")
    if detok.json().get("prompt") != text:
        problems.append("content != decode(token_ids)")
    if usage and usage["completion_tokens"] not in (len(ids), len(ids) + 1):
        problems.append("usage does not count the ids")
    if problems:
        rep.invariant_failures.append("; ".join(problems))
    else:
        rep.good_ok += 1


async def _bad(http: httpx.AsyncClient, rep: Report, rng: random.Random) -> None:
    rep.bad += 1
    body = rng.choice(MALFORMED)
    r = await http.post("/v1/chat/completions", content=json.dumps(body)
                        if not isinstance(body, str) else body)
    if r.status_code >= 500:
        rep.server_errors += 1
    elif 400 <= r.status_code < 500 and set(r.json()["error"]) == {"message", "type", "param",
                                                                   "code"}:
        rep.bad_4xx += 1


async def _drop(http: httpx.AsyncClient, rep: Report, rng: random.Random) -> None:
    rep.dropped += 1
    body = {"model": MODEL, "stream": True, "max_tokens": 500,
            "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}]}
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code >= 500:
            rep.server_errors += 1
        n = 0
        async for _ in r.aiter_lines():
            n += 1
            if n >= rng.randrange(1, 8):
                break  # hang up mid-stream


async def run_load(base_url: str, *, good: int, bad: int, drop: int, concurrency: int,
                   max_tokens: int = 32, seed: int = 0) -> Report:
    rep = Report()
    rng = random.Random(seed)
    jobs = ["good"] * good + ["bad"] * bad + ["drop"] * drop
    rng.shuffle(jobs)
    sem = asyncio.Semaphore(concurrency)
    stop = asyncio.Event()
    # idle connections are dropped by the client before the server's keep-alive timeout (5 s in
    # uvicorn and granian): a request sent on a connection the server is closing at that moment
    # fails with "Server disconnected" through no fault of either
    limits = httpx.Limits(max_connections=concurrency + 8, keepalive_expiry=2)

    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as http:

        async def one(kind: str) -> None:
            async with sem:
                try:
                    if kind == "good":
                        await _good(http, rep, rng, max_tokens)
                    elif kind == "bad":
                        await _bad(http, rep, rng)
                    else:
                        await _drop(http, rep, rng)
                except (httpx.HTTPError, ValueError, KeyError) as e:  # a failure, reported
                    rep.invariant_failures.append(f"{kind}: {type(e).__name__}: {e}")

        async def health() -> None:
            async with httpx.AsyncClient(base_url=base_url, timeout=30, limits=limits) as h:
                while not stop.is_set():
                    t0 = time.monotonic()
                    try:
                        r = await h.get("/health")
                    except httpx.HTTPError as e:
                        rep.invariant_failures.append(f"health: {type(e).__name__}: {e}")
                    else:
                        rep.health.append(time.monotonic() - t0)
                        if r.status_code != 200:
                            rep.server_errors += 1
                    await asyncio.sleep(0.1)

        pinger = asyncio.create_task(health())
        t0 = time.monotonic()
        await asyncio.gather(*(one(k) for k in jobs))
        rep.wall = time.monotonic() - t0
        stop.set()
        await pinger
    return rep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--good", type=int, default=96)
    ap.add_argument("--bad", type=int, default=48)
    ap.add_argument("--drop", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object: the summary and the invariant failures")
    args = ap.parse_args()
    proc = None
    url = args.url
    if url is None:
        port = 18765
        env = {**os.environ, "TOKENWIRE_PORT": str(port),
               "TOKENWIRE_TOKENIZER_STORE": tempfile.mkdtemp(), "TOKENWIRE_LOG_LEVEL": "warning"}
        proc = subprocess.Popen([sys.executable, "-m", "tokenwire", "serve"], env=env)
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
    try:
        rep = asyncio.run(run_load(url, good=args.good, bad=args.bad, drop=args.drop,
                                   concurrency=args.concurrency, max_tokens=args.max_tokens))
        if args.json:
            print(json.dumps({**rep.summary(), "failures": rep.invariant_failures}))
            return
        print(json.dumps(rep.summary(), indent=1))
        for f in rep.invariant_failures[:10]:
            print("invariant failure:", f)
        if rep.latencies:
            print("mean latency", round(statistics.mean(rep.latencies), 3), "s")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
