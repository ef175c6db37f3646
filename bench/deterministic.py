"""What the embedded engine's deterministic mode costs: 8 concurrent greedy streams of 128
tokens on 4 slots, batched (the default) and deterministic (each sequence in forward passes of
its own), side by side in alternating rounds, in process; aggregate tokens per second.

    .venv/bin/python bench/deterministic.py [--rounds 3] [--streams 8] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from tokenwire.config import Settings
from tokenwire.engines.base import SamplingParams, TokenEvent
from tokenwire.engines.llamacpp import LlamaCppEngine
from tokenwire.tokenizers.source import load_tokenizer

QUESTIONS = ["Tell me a story about a lighthouse.", "Why is the sea salty?",
             "Describe a city at night.", "Write a letter to a friend.",
             "Explain how bread is made.", "What do whales eat?", "Tell me about the moon.",
             "Describe your favourite meal."]


async def one_round(engine: LlamaCppEngine, prompts: list[list[int]], tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    async def stream(p: list[int]) -> int:
        return sum([isinstance(ev, TokenEvent) async for ev in await engine.submit(p, params)])

    start = time.perf_counter()
    n = sum(await asyncio.gather(*(stream(p) for p in prompts)))
    return n / (time.perf_counter() - start)


async def main(args: argparse.Namespace) -> None:
    settings = Settings()
    tok = load_tokenizer(settings.tokenizer_path()).tokenizer
    prompts = [tok.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                          parse_special=True)
               for q in (QUESTIONS * args.streams)[:args.streams]]
    engines = {mode: LlamaCppEngine(settings.model_path(), max_model_len=1024, n_parallel=4,
                                    deterministic=mode == "deterministic")
               for mode in ("batched", "deterministic")}
    rates: dict[str, list[float]] = {mode: [] for mode in engines}
    for e in engines.values():
        await e.start()
    try:
        for _ in range(args.rounds):
            for mode, e in engines.items():
                rates[mode].append(await one_round(e, prompts, args.tokens))
    finally:
        for e in engines.values():
            await e.aclose()
    base = statistics.median(rates["batched"])
    for mode, r in rates.items():
        med = statistics.median(r)
        print(f"{mode:14s} {med:7.1f} tok/s (median of {args.rounds}) {med / base:5.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    asyncio.run(main(ap.parse_args()))
