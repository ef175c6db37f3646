"""Fleet concurrency: what one gateway box costs with 1 to 8,192 requests in flight.

tokenwire (one worker; `--workers 2`, the default on this box; one worker under granian), smg,
vllm-router and the floors (bench/_floor.py: a bare uvloop relay; bench/_floor_stack.py: the
same on uvicorn and aiohttp, tokenwire's stack), side by side in one run, the order rotating per
round, in front of one stub (bench/_stub.py) replaying a real vLLM 0.32's recorded answers, paced
as a GPU engine's batch: one shared ticker for every open response (`--tick-ms`, 30 ms), every
stream one token a tick, a whole answer sent when its tokens' ticks have passed. Where the open
streams would pass `--rate` tokens/s (20k: what the stub and this client drive on 2 cores), the
tick is slowed to keep the total there: those levels measure memory, failures and the loop's health
more than latency. The stub's own numbers (`stub direct`: the client on the stub) are each
level's reference: a gateway that relays at the stub's rate is not the bottleneck, and what it
adds to time to first token and to the gap between tokens is its own.

Workloads, each a wave of N requests at once:
- `whole`: chat with `n` 8, `max_tokens` as recorded, logprobs with top-1 (an RL rollout);
  tokenwire asks vLLM for whole answers (`TOKENWIRE_UPSTREAM_WHOLE_ANSWERS`), as the Rust
  routers relay whole bodies;
- `stream`: streamed chat, one choice.

Per contender, workload and level: tokens/s, the gateway's CPU ms per relayed token, its peak
RSS above idle per token in flight (requests x n x tokens), time to first token and the gap
between tokens (p50, p99; streams), failed requests, and the slowest `/health` answer while the
wave ran (its loop's health).

    .venv/bin/python bench/gateways.py --record rec.json --tokens 256 --n 8   # vLLM, once
    .venv/bin/python bench/sweep.py --recorded rec.json \
        --json docs/sweep.json --figure docs/sweep.png
    make bench BENCH=sweep   # records from vLLM first
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.upstreams import hf_model_dir, vllm_server  # noqa: E402

from bench._servers import Server, StartError, free_port  # noqa: E402
from bench._sweep_report import figure, table  # noqa: E402
from bench.gateway import PROMPT  # noqa: E402
from bench.gateways import gateway, record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = ["tokenwire", "tokenwire granian", "tokenwire x2", "smg", "vllm-router",
              "python floor", "stack floor"]
LEVELS = [1, 8, 64, 512, 2048, 8192]


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


class Watch:
    """Samples a server's RSS and its health route's latency while a wave runs (a thread of
    its own, so the client's loop does not delay the probes)."""

    def __init__(self, server: Server | None, health: str | None):
        self._server, self._health = server, health
        self.peak = server.rss() if server is not None else 0
        self.health_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self._stop.wait(0.1):
                if self._server is not None:
                    self.peak = max(self.peak, self._server.rss())
                if self._health is not None and self._server is not None:
                    t0 = time.perf_counter()
                    try:
                        http.get(self._server.url + self._health)
                        self.health_ms.append((time.perf_counter() - t0) * 1000)
                    except httpx.HTTPError:
                        self.health_ms.append(30_000.0)


async def _stream(http: aiohttp.ClientSession, url: str, body: bytes,
                  out: dict[str, list[float]]) -> int:
    """One streamed chat: its tokens (data events with content), TTFT and gaps recorded."""
    t0 = time.perf_counter()
    last = None
    tokens = 0
    async with http.post(url + "/v1/chat/completions", data=body,
                         headers={"Content-Type": "application/json"}) as r:
        r.raise_for_status()
        async for line in r.content:
            if not line.startswith(b"data: {") or b'"content"' not in line:
                continue
            now = time.perf_counter()
            if last is None:
                out["ttft"].append((now - t0) * 1000)
            else:
                out["gap"].append((now - last) * 1000)
            last = now
            tokens += 1
    return tokens


async def _whole(http: aiohttp.ClientSession, url: str, body: bytes,
                 out: dict[str, list[float]]) -> int:
    t0 = time.perf_counter()
    async with http.post(url + "/v1/chat/completions", data=body,
                         headers={"Content-Type": "application/json"}) as r:
        r.raise_for_status()
        data = orjson.loads(await r.read())
    out["ttft"].append((time.perf_counter() - t0) * 1000)
    return int(data["usage"]["completion_tokens"])


async def wave(url: str, model: str, kind: str, level: int, tokens: int,
               n: int) -> tuple[int, int, dict[str, list[float]]]:
    """`level` requests at once: (tokens relayed, failed requests, latencies)."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
                            "max_tokens": tokens, "ignore_eos": True}
    if kind == "whole":
        body |= {"n": n, "temperature": 1.0, "logprobs": True, "top_logprobs": 1}
    else:
        body |= {"stream": True, "temperature": 0}
    raw = orjson.dumps(body)
    out: dict[str, list[float]] = {"ttft": [], "gap": []}
    one = _whole if kind == "whole" else _stream
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        got = await asyncio.gather(*(one(http, url, raw, out) for _ in range(level)),
                                   return_exceptions=True)
    failed = [g for g in got if isinstance(g, BaseException)]
    if failed:
        print(f"    {len(failed)} failed, e.g. {failed[0]!r}", flush=True)
    return sum(g for g in got if isinstance(g, int)), len(failed), out


def measure(server: Server | None, url: str, model: str, kind: str, level: int,
            tokens: int, n: int, health: str | None, settle: float) -> dict[str, Any]:
    idle = server.rss() if server is not None else 0
    cpu0 = server.cpu_seconds() if server is not None else 0.0
    t0 = time.perf_counter()
    with Watch(server, health) as w:
        relayed, failed, lat = asyncio.run(wave(url, model, kind, level, tokens, n))
    wall = time.perf_counter() - t0
    cpu = server.cpu_seconds() - cpu0 if server is not None else None
    time.sleep(settle)  # what the wave left behind, once it is over (tokenwire trims its
    # heap after 5 s idle: api/loop.py)
    after = server.rss() if server is not None else 0
    in_flight = level * (n if kind == "whole" else 1) * tokens
    return {
        "tokens": relayed, "failed": failed, "wall_s": wall,
        "tokens_per_s": relayed / wall if wall else None,
        "cpu_ms_per_token": cpu * 1000 / relayed if cpu is not None and relayed else None,
        "idle_rss_mb": idle / 1e6, "peak_rss_mb": w.peak / 1e6, "after_rss_mb": after / 1e6,
        "rss_bytes_per_token_in_flight": (w.peak - idle) / in_flight if server else None,
        "ttft_p50_ms": _pct(lat["ttft"], 50), "ttft_p99_ms": _pct(lat["ttft"], 99),
        "gap_p50_ms": _pct(lat["gap"], 50), "gap_p99_ms": _pct(lat["gap"], 99),
        "health_max_ms": max(w.health_ms) if w.health_ms else None,
    }


def set_tick(stub: Server, seconds: float) -> None:
    httpx.post(stub.url + "/tick", json={"seconds": seconds}, timeout=10).raise_for_status()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recorded", type=Path,
                    help="bench/gateways.py --record's file (a real vLLM's answers); default: "
                    "recorded now (256 tokens, n 8) from a vLLM this starts")
    ap.add_argument("--levels", type=int, nargs="+", default=LEVELS)
    ap.add_argument("--whole-levels", type=int, nargs="*", default=None,
                    help="levels for whole rollouts (default: --levels up to 2,048: each is "
                    "n upstream connections through tokenwire; none: streams only)")
    ap.add_argument("--stream-levels", type=int, nargs="*", default=None,
                    help="levels for streams (default: --levels; none: whole rollouts only)")
    ap.add_argument("--contenders", nargs="+", default=CONTENDERS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tick-ms", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=20_000.0,
                    help="most tokens/s the open streams may make the stub write")
    ap.add_argument("--stream-tokens", type=int, default=256)
    ap.add_argument("--short-stream-tokens", type=int, default=64,
                    help="tokens per stream at 2,048 streams and more (a slowed tick)")
    ap.add_argument("--routers", type=Path, default=ROOT / ".venv-routers" / "bin")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--figure", type=Path)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the children inherit it
    if args.recorded is None:
        args.recorded = Path(tempfile.mkdtemp(prefix="tw-sweep-")) / "recorded.json"
        vllm = vllm_server(args.recorded.parent)
        try:
            args.recorded.write_text(json.dumps(record(vllm.url, 256, 8)))
        finally:
            vllm.stop()
    recorded = json.loads(args.recorded.read_text())
    n = len(recorded["chat_whole"]["choices"])
    whole_tokens = len(recorded["generate_whole"]["choices"][0]["token_ids"])
    whole_levels = args.whole_levels if args.whole_levels is not None \
        else [lv for lv in args.levels if lv <= 2048]
    results: dict[str, Any] = {"setup": {
        "tick_ms": args.tick_ms, "rate": args.rate, "n": n, "whole_tokens": whole_tokens,
        "rounds": args.rounds, "cpu": _cpu_name()}, "whole": {}, "stream": {}}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        stub = Server("stub", [sys.executable, str(ROOT / "bench" / "_stub.py"), "--port",
                               str(free_port()), "--recorded", str(args.recorded),
                               "--tokenizer", str(hf_model_dir()), "--tick-ms",
                               str(args.tick_ms)], 0, "/health", tmp / "stub.log")
        stub.port = int(stub.cmd[stub.cmd.index("--port") + 1])
        servers: dict[str, Server] = {}
        try:
            stub.start()
            for name in args.contenders:
                base, _, workers = name.removesuffix(" granian").partition(" x")
                srv = gateway(base, stub.url, tmp, args.routers, int(workers or 1))
                if name.endswith(" granian"):  # the same app under granian's server
                    srv.name, srv.env = name, {**srv.env, "TOKENWIRE_HTTP_SERVER": "granian"}
                try:
                    srv.start()
                except StartError as exc:
                    print(f"{name} did not start, left out:\n{exc}", flush=True)
                    continue
                servers[name] = srv
            names = ["stub direct", *servers]
            stream_levels = args.levels if args.stream_levels is None else args.stream_levels
            for kind, levels in (("whole", whole_levels), ("stream", stream_levels)):
                for level in levels:
                    streams = level * (n if kind == "whole" else 1)
                    tick = args.tick_ms / 1000 if kind == "whole" \
                        else max(args.tick_ms / 1000, streams / args.rate)
                    tokens = whole_tokens if kind == "whole" else (
                        args.stream_tokens if level < 2048 else args.short_stream_tokens)
                    set_tick(stub, tick)
                    print(f"{kind}, {level} in flight (tick {tick * 1000:.0f} ms, {tokens} "
                          f"tokens)", flush=True)
                    per: dict[str, list[dict[str, Any]]] = {nm: [] for nm in names}
                    for r in range(args.rounds):
                        order = names[r % len(names):] + names[:r % len(names)]
                        for nm in order:
                            srv = servers.get(nm)
                            url = srv.url if srv is not None else stub.url
                            model = srv.model if srv is not None else stub.model
                            health = None if srv is None or "floor" in nm else "/health"
                            big = level >= (512 if kind == "whole" else 8192)
                            m = measure(srv if srv is not None else stub, url, model, kind,
                                        level, tokens, n, health, 7.0 if big else 1.0)
                            m["tick_ms"], m["tokens_each"] = tick * 1000, tokens
                            per[nm].append(m)
                            print(f"  {nm}: {_line(m)}", flush=True)
                    results[kind][str(level)] = per
                    if args.json:
                        args.json.write_text(json.dumps(results, indent=1) + "\n")
        finally:
            for srv in servers.values():
                srv.stop()
            stub.stop()
    print(table(results))
    if args.figure:
        figure(results, args.figure)


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _line(m: dict[str, Any]) -> str:
    def f(k: str, p: int = 3) -> str:
        v = m.get(k)
        return "-" if v is None else f"{v:.{p}f}"
    return (f"{f('tokens_per_s', 0)} tok/s, {f('cpu_ms_per_token', 4)} CPU ms/token, "
            f"{f('rss_bytes_per_token_in_flight', 0)} B/token in flight, ttft p50/p99 "
            f"{f('ttft_p50_ms', 0)}/{f('ttft_p99_ms', 0)} ms, gap p50/p99 {f('gap_p50_ms', 1)}/"
            f"{f('gap_p99_ms', 1)} ms, health max {f('health_max_ms', 0)} ms, "
            f"{m['failed']} failed")


if __name__ == "__main__":
    main()
