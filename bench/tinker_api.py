"""Sampling through Tinker's API against the chat API and vLLM's token API, for the same work:
what each API costs on top of the engine (issue 50, item 6).

One `tokenwire serve` (the embedded default model). Per round, in an order that alternates,
the same prompt ids and parameters (`--samples` samples of `--tokens` tokens, temperature 1,
a fresh seed per round, `ignore_eos` where the API has it so every request samples the same
number of tokens) through: the official `tinker` SDK (`sample(...).result()`: `asample`, then
the long-polled future and its protobuf), `/inference/v1/generate`, and `/v1/chat/completions`
with the prompt as the same ids (a `token_ids` message is not the same prompt: the chat route
renders its template, so chat gets the messages the ids were rendered from). Reported: each
API's sampled tokens/s (medians over rounds) and the median of per-round ratios to generate's,
and the server's CPU ms per sampled token.

    .venv/bin/python bench/tinker_api.py [--rounds 9 --samples 4 --tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench._servers import Server, clean_env, free_port  # noqa: E402

MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import tinker
    from tinker import types

    tmp = Path(tempfile.mkdtemp(prefix="tw-tinker-"))
    port = free_port()
    server = Server("tokenwire", [sys.executable, "-m", "tokenwire", "serve", "--port",
                                  str(port)], port, "/health", tmp / "serve.log",
                    clean_env(TOKENWIRE_TOKENIZER_STORE=str(tmp / "store")))
    server.start()
    try:
        http = httpx.Client(base_url=server.url, timeout=600)
        ids = http.post("/v1/tokenize", json={"model": server.model, "messages": MESSAGES,
                                               "add_generation_prompt": True}).json()["tokens"]
        service = tinker.ServiceClient(base_url=server.url, api_key="tml-bench")
        sampler = service.create_sampling_client(base_model=server.model).result()
        n, k = args.samples, args.tokens

        def via_tinker(seed: int) -> int:
            out = sampler.sample(prompt=types.ModelInput.from_ints(ids), num_samples=n,
                                 sampling_params=types.SamplingParams(
                                     max_tokens=k, seed=seed, stop=[])).result()
            return sum(len(s.tokens) for s in out.sequences)

        def via_generate(seed: int) -> int:
            r = http.post("/inference/v1/generate", json={
                "model": server.model, "token_ids": ids, "sampling_params": {
                    "n": n, "max_tokens": k, "seed": seed, "ignore_eos": True}})
            r.raise_for_status()
            return sum(len(c["token_ids"]) for c in r.json()["choices"])

        def via_chat(seed: int) -> int:
            r = http.post("/v1/chat/completions", json={
                "model": server.model, "messages": MESSAGES, "n": n, "max_tokens": k,
                "seed": seed, "ignore_eos": True})
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        apis: dict[str, Callable[[int], int]] = {
            "tinker": via_tinker, "generate": via_generate, "chat": via_chat}
        for f in apis.values():
            f(0)  # warm-up
        raw: dict[str, list[dict[str, float]]] = {a: [] for a in apis}
        for r in range(args.rounds):
            order = list(apis) if r % 2 == 0 else list(apis)[::-1]
            for name in order:
                cpu0, t0 = server.cpu_seconds(), time.perf_counter()
                tokens = apis[name](r + 1)
                wall, cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0
                raw[name].append({"tok_s": tokens / wall,
                                  "cpu_ms_per_token": 1000 * cpu / tokens})
                print(f"round {r + 1}: {name}: {tokens / wall:.1f} tok/s, "
                      f"{1000 * cpu / tokens:.2f} CPU ms/token", file=sys.stderr, flush=True)
        service.close("success").result()
    finally:
        server.stop()
    result: dict[str, Any] = {"samples": n, "tokens": k, "rounds": args.rounds, "apis": {}}
    for name, rows in raw.items():
        ratio = [row["tok_s"] / g["tok_s"] for row, g in zip(rows, raw["generate"], strict=True)]
        result["apis"][name] = {
            "tok_s": statistics.median(r["tok_s"] for r in rows),
            "cpu_ms_per_token": statistics.median(r["cpu_ms_per_token"] for r in rows),
            "ratio_to_generate": statistics.median(ratio),
            "ratio_range": [min(ratio), max(ratio)]}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
