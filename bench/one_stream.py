"""One stream, three ways: the embedded engine in its own process (tokenwire's default), the
same engine in the server's process (`--no-engine-process`), and llama.cpp's `llama-server`,
with bench/compare.py's configuration (2 threads, 8 slots of 2048, batches of 512). What the
hop between tokenwire's two processes costs one stream (issue 48, item 7).

Greedy chat streams of `--tokens`, a fresh prompt each (no prefix cache hit), alternating the
three servers round by round; per round each server's tokens/s over the whole request and
decode-only (first token to last), and its CPU seconds per token (every process of the
server's group); medians over rounds and the median of per-round ratios to llama-server.

    .venv/bin/python bench/one_stream.py [--rounds 9 --tokens 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench._servers import Server, clean_env, free_port  # noqa: E402
from bench._workloads import single  # noqa: E402
from bench.compare import (  # noqa: E402
    _LIMITS,
    BASELINE,
    IN_PROCESS,
    _default_llama_server,
    contenders,
    machine,
)
from tokenwire.config import default_model_path  # noqa: E402


async def run(servers: list[Server], rounds: int, tokens: int) -> dict[str, list[dict[str, Any]]]:
    raw: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
    async with httpx.AsyncClient(timeout=600, limits=_LIMITS) as http:
        for s in servers:
            await single(http, s, 8, "warm-up")
        for r in range(rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            for s in order:
                cpu0 = s.cpu_seconds()
                got = await single(http, s, tokens, f"one-{r}-{s.port}")
                got["cpu_ms_per_token"] = 1000 * (s.cpu_seconds() - cpu0) / got["tokens"]
                raw[s.name].append(got)
                print(f"round {r + 1}: {s.name}: {got['tok_s']:.1f} tok/s, decode "
                      f"{got['decode_tok_s']:.1f}, {got['cpu_ms_per_token']:.2f} CPU ms/token",
                      file=sys.stderr, flush=True)
    return raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tw-one-"))
    wanted = ("tokenwire", IN_PROCESS, BASELINE)
    servers: list[Server] = []
    try:
        for c in contenders(default_model_path(), _default_llama_server(), True):
            if c.name not in wanted:
                continue
            port = free_port()
            s = Server(c.name, c.argv(port), port, c.ready, tmp / f"{c.name}.log",
                       clean_env(**c.env))
            s.start()
            servers.append(s)
        raw = asyncio.run(run(servers, args.rounds, args.tokens))
    finally:
        for s in servers:
            s.stop()
    base = raw[BASELINE]
    table = {}
    for name, rows in raw.items():
        table[name] = {
            k: round(statistics.median(r[k] for r in rows), 3)
            for k in ("tok_s", "decode_tok_s", "cpu_ms_per_token")}
        ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(rows, base, strict=True)]
        table[name]["tok_s_over_llama_server"] = round(statistics.median(ratios), 3)
        table[name]["range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    print(f"{'server':<22} {'tok/s':>7} {'decode':>7} {'CPU ms/tok':>10} {'/ llama-server':>15}")
    for name, t in table.items():
        print(f"{name:<22} {t['tok_s']:>7} {t['decode_tok_s']:>7} {t['cpu_ms_per_token']:>10}"
              f" {t['tok_s_over_llama_server']:>7} {t['range']}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "rounds": args.rounds,
                                         "tokens": args.tokens, "table": table, "raw": raw},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
