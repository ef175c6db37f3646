"""A model that reasons, with a LoRA, side by side with llama-server: the thinking model (`make
think-model`: SmolLM2 with `<think>` control tokens and Qwen3's chat template) and one rank-4
adapter on every projection, served by tokenwire (the adapter loaded through the control plane,
`/update_weights` with `lora_path`) and by llama.cpp's own server (`--lora`), the same GGUF and
adapter, 2 threads each, alternating round by round.

    .venv/bin/python bench/reasoning.py [--rounds 3] [--tokens 96]   # make bench BENCH=reasoning

Greedy chat completions streamed over HTTP, the reasoning counted as output (tokenwire's
`delta.reasoning`, llama-server's `delta.reasoning_content`: both split `<think>` out):
- 1 stream: tokens/s over the whole request, TTFT (the first reasoning or content piece);
- 4 concurrent streams: aggregate tokens/s, TTFT p50.
Ratios are per round (neighbours in time), their median and range printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent))

from bench._servers import Server, StartError, clean_env, free_port  # noqa: E402
from bench._workloads import WorkloadError, chat  # noqa: E402
from tokenwire.config import think_model_path  # noqa: E402
from tokenwire.rl.lora import write_lora_gguf  # noqa: E402

QUESTIONS = ["What is 12 + 7?", "What is the weather in Paris?", "What is 31 + 45?",
             "What is the weather in Tokyo?"]


def adapter(out: Path) -> Path:
    """Rank 4 on every attention and MLP projection of SmolLM2 (random, seeded, small)."""
    rng = np.random.default_rng(0)
    dims = {"self_attn.q_proj": (576, 576), "self_attn.k_proj": (576, 192),
            "self_attn.v_proj": (576, 192), "self_attn.o_proj": (576, 576),
            "mlp.gate_proj": (576, 1536), "mlp.up_proj": (576, 1536),
            "mlp.down_proj": (1536, 576)}
    pairs = {f"model.layers.{i}.{m}": (rng.normal(0, 0.01, (4, n_in)),
                                       rng.normal(0, 0.01, (n_out, 4)))
             for i in range(30) for m, (n_in, n_out) in dims.items()}
    return write_lora_gguf(out, pairs, alpha=4, n_head=9, n_head_kv=3)


async def stream(http: httpx.AsyncClient, server: Server, question: str,
                 tokens: int) -> dict[str, Any]:
    s = await chat(http, server, [{"role": "user", "content": question}], tokens)
    if not s.reasoning:
        raise WorkloadError(f"{server.name}: no reasoning came back for {question!r}")
    return {"tokens": s.tokens, "elapsed": s.elapsed, "ttft": s.ttft}


async def round_of(server: Server, tokens: int) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=600) as http:
        one = await stream(http, server, QUESTIONS[0], tokens)
        t0 = time.perf_counter()
        four = await asyncio.gather(*(stream(http, server, q, tokens) for q in QUESTIONS))
        wall = time.perf_counter() - t0
    return {"1 stream tok/s": one["tokens"] / one["elapsed"], "1 stream TTFT ms": one["ttft"] * 1e3,
            "4 streams tok/s": sum(s["tokens"] for s in four) / wall,
            "4 streams TTFT p50 ms": statistics.median(s["ttft"] for s in four) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    args = ap.parse_args()
    model = think_model_path()
    llama_server = os.environ.get("TOKENWIRE_LLAMA_SERVER", "")
    tmp = Path(tempfile.mkdtemp(prefix="bench-reasoning-"))
    lora = adapter(tmp / "adapter.gguf")
    threads = "2"
    tw_port, ls_port = free_port(), free_port()
    servers = [
        Server("tokenwire", [sys.executable, "-m", "tokenwire", "serve", "--model", str(model),
                             "--port", str(tw_port), "--n-parallel", "4", "--n-threads", threads],
               tw_port, "/health", tmp / "tokenwire.log",
               env=clean_env(TOKENWIRE_TOKENIZER_STORE=str(tmp / "store"))),
        Server("llama-server", [llama_server, "-m", str(model), "--lora", str(lora),
                                "--host", "127.0.0.1", "--port", str(ls_port), "-np", "4",
                                "-c", "8192", "-t", threads, "--jinja"],
               ls_port, "/health", tmp / "llama-server.log"),
    ]
    try:
        for s in servers:
            s.start()
        r = httpx.post(f"{servers[0].url}/update_weights",
                       json={"update_info": {"lora_path": str(lora)}}, timeout=120)
        if r.status_code != 200:
            raise StartError(f"tokenwire did not load the adapter: {r.status_code} {r.text}")
        raw: dict[str, list[dict[str, float]]] = {s.name: [] for s in servers}
        for i in range(args.rounds):
            for s in servers if i % 2 == 0 else servers[::-1]:
                raw[s.name].append(asyncio.run(round_of(s, args.tokens)))
                print(f"round {i + 1}: {s.name} {raw[s.name][-1]}", flush=True)
    finally:
        for s in servers:
            s.stop()
    keys = list(raw["tokenwire"][0])
    print("\n| metric | tokenwire | llama-server | ratio (median, range) |")
    print("| --- | --- | --- | --- |")
    for k in keys:
        tw = [r[k] for r in raw["tokenwire"]]
        ls = [r[k] for r in raw["llama-server"]]
        ratios = [a / b for a, b in zip(tw, ls, strict=True)]
        print(f"| {k} | {statistics.median(tw):.1f} | {statistics.median(ls):.1f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    print(f"\nmodel {model}, adapter rank 4 on every projection, {args.rounds} rounds, "
          f"{args.tokens} tokens per stream, {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
