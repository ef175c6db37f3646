"""What the gateway costs: greedy 128-token chat streams through `tokenwire serve --engine
vllm` in front of a second tokenwire process, against the same streams sent to that upstream
directly, side by side in one run (alternating, several rounds: one stream here swings by
+-25% from run to run, so only ratios taken together mean anything).

    .venv/bin/python bench/gateway.py [--rounds 8 --repeat 3 --tokens 128 --concurrency 1 4]

Starts both servers itself (real processes on loopback, the embedded model upstream).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.upstreams import Upstream, free_port, tokenwire_upstream  # noqa: E402

from tokenwire.config import default_model_path  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "Write a long story about a dragon who learns to cook."


async def stream(http: httpx.AsyncClient, url: str, tokens: int, model: str = MODEL,
                 **extra: object) -> tuple[int, float, float]:
    """(completion tokens, seconds, time to first token) of one greedy chat stream; `extra`:
    more request fields (bench/gateways.py sends `ignore_eos`)."""
    body = {"model": model, "stream": True, "temperature": 0, "max_tokens": tokens,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": PROMPT}], **extra}
    t0 = time.perf_counter()
    ttft = None
    n = 0
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if ttft is None and '"content":"' in line and '"content":""' not in line:
                ttft = time.perf_counter() - t0  # the first chunk with text
            if '"usage"' in line and '"completion_tokens"' in line:
                # followed by another usage field or by the end of the usage object
                n = int(line.split('"completion_tokens":')[1].split(",")[0].split("}")[0])
    return n, time.perf_counter() - t0, ttft or 0.0


async def rate(http: httpx.AsyncClient, url: str, tokens: int, concurrency: int,
               repeat: int = 1) -> tuple[float, float]:
    """Aggregate tokens/s of `concurrency` simultaneous streams (`repeat` times over), and
    their median TTFT."""
    t0 = time.perf_counter()
    runs = []
    for _ in range(repeat):
        runs += await asyncio.gather(*(stream(http, url, tokens) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return sum(n for n, _, _ in runs) / wall, statistics.median(t for _, _, t in runs)


async def bench(direct: str, gateway: str, rounds: int, repeat: int, tokens: int,
                concurrencies: list[int]) -> None:
    async with httpx.AsyncClient(timeout=600) as http:
        await rate(http, direct, 16, 1)  # warm both
        await rate(http, gateway, 16, 1)
        print(f"greedy {tokens}-token chat streams, {rounds} alternating rounds of {repeat} "
              "per side")
        print("| streams | direct tok/s (median) | gateway tok/s (median) | gateway / direct "
              "[range] | TTFT gateway / direct |")
        print("|---|---|---|---|---|")
        for c in concurrencies:
            ratios, d_rates, g_rates, ttft_ratios = [], [], [], []
            for i in range(rounds):
                order = [(direct, d_rates), (gateway, g_rates)]
                got = {}
                for url, sink in (order if i % 2 == 0 else order[::-1]):
                    got[url] = await rate(http, url, tokens, c, repeat)
                    sink.append(got[url][0])
                ratios.append(got[gateway][0] / got[direct][0])
                ttft_ratios.append(got[gateway][1] / max(got[direct][1], 1e-9))
            print(f"| {c} | {statistics.median(d_rates):.1f} | {statistics.median(g_rates):.1f}"
                  f" | {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] | "
                  f"{statistics.median(ttft_ratios):.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3, help="streams per side per round")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tw-bench-"))
    upstream = tokenwire_upstream(tmp)
    port = free_port()
    gateway = Upstream("gateway", [sys.executable, "-m", "tokenwire", "serve", "--engine",
                                   "vllm", "--upstream", upstream.url, "--tokenizer",
                                   str(default_model_path()), "--port", str(port),
                                   "--workers", "1"],  # one process: what one relay costs
                       port, tmp / "gateway.log",
                       env={"TOKENWIRE_TOKENIZER_STORE": str(tmp / "gw-store")}).start()
    try:
        asyncio.run(bench(upstream.url, gateway.url, args.rounds, args.repeat, args.tokens,
                          args.concurrency))
    finally:
        gateway.stop()
        upstream.stop()


if __name__ == "__main__":
    main()
