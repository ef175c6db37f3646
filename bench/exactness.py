"""How far the embedded engine's numbers move with the prefix cache and batching: greedy
requests with shared system prompts, multi-turn histories and cancellations, sent to one engine
(in process, 4 slots), each finished one compared with a cold full prefill of its prompt
(`prompt_logprobs` requests reuse no cache). llama.cpp is not batch-invariant (docs/engines.md,
"Exactness"); this measures by how much, and `--no-prefix-cache` shows what switching it off buys.
`--deterministic` runs the engine's deterministic mode (each sequence in passes of its own, no
cached prefix) and compares each request with the same request run alone on the idle engine; the
tokens per second of the concurrent phase say what the mode costs.

    .venv/bin/python bench/exactness.py [--seed 1] [--requests 40] [--sequential]
                                        [--no-prefix-cache] [--deterministic]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Sequence

from tokenwire.config import Settings
from tokenwire.engines.base import FinishEvent, SamplingParams, TokenEvent
from tokenwire.engines.llamacpp import LlamaCppEngine
from tokenwire.tokenizers.source import load_tokenizer

SYSTEMS = ["You are a helpful assistant.",
           "You are a pirate. Answer like one, always, with gusto and flair.", ""]
USERS = ["Say only yes.", "What is two plus two?", "Name three colors.",
         "Tell me about the sea and the ships that sail on it."]

Out = list[tuple[int, float]]


def conversation(rng: random.Random) -> str:
    system = rng.choice(SYSTEMS)
    text = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    turns = rng.randint(1, 3)
    for i in range(turns):
        text += (f"<|im_start|>user\n{USERS[(i + rng.randint(0, 1)) % len(USERS)]}<|im_end|>\n"
                 "<|im_start|>assistant\n")
        if i < turns - 1:
            text += "Sure. " * rng.randint(1, 5) + "<|im_end|>\n"
    return text


async def run(engine: LlamaCppEngine, prompt: Sequence[int], n: int, *,
              cancel_after: int | None = None, scored: bool = False) -> Out | None:
    """Greedy ids and logprobs (the end-of-generation token included); None if cancelled."""
    out: Out = []
    params = SamplingParams(max_tokens=n, temperature=0.0, logprobs=1,
                            prompt_logprobs=0 if scored else None)
    stream = await engine.submit(list(prompt), params)
    async for ev in stream:
        if isinstance(ev, TokenEvent):
            out.append((ev.token_id, ev.logprob))
            if cancel_after is not None and len(out) >= cancel_after:
                await stream.aclose()
                return None
        elif isinstance(ev, FinishEvent) and ev.stop_token is not None:
            out.append((ev.stop_token.token_id, ev.stop_token.logprob))
    return out


async def main(args: argparse.Namespace) -> None:
    settings = Settings()
    tok = load_tokenizer(settings.tokenizer_path()).tokenizer
    rng = random.Random(args.seed)
    jobs = [(tuple(tok.encode(conversation(rng), parse_special=True)), rng.randint(1, 12),
             rng.choice([None, None, None, rng.randint(1, 3)])) for _ in range(args.requests)]
    engine = LlamaCppEngine(settings.model_path(), max_model_len=512, n_parallel=4,
                            prefix_cache=not args.no_prefix_cache,
                            deterministic=args.deterministic)
    await engine.start()
    try:
        start = time.perf_counter()
        if args.sequential:
            results = [await run(engine, p, n, cancel_after=c) for p, n, c in jobs]
        else:
            async def later(p: Sequence[int], n: int, c: int | None) -> Out | None:
                await asyncio.sleep(rng.random() * 3)
                return await run(engine, p, n, cancel_after=c)

            results = await asyncio.gather(*(later(*j) for j in jobs))
        elapsed = time.perf_counter() - start
        sampled = sum(len(r) for r in results if r is not None)
        moved, ids_changed, finished, worst = 0, 0, 0, 0.0
        for (p, n, _), got in zip(jobs, results, strict=True):
            if got is None:
                continue
            finished += 1
            # alone on the idle engine: scored (no cache) unless the mode itself is the claim
            ref = await run(engine, p, n, scored=not args.deterministic)
            assert ref is not None
            ids_changed += [t for t, _ in got] != [t for t, _ in ref]
            d = max(abs(a - b) for (_, a), (_, b) in zip(got, ref, strict=False))
            moved += d > 1e-3
            worst = max(worst, d)
    finally:
        await engine.aclose()
    print(f"{finished} finished requests: logprobs moved (> 1e-3) on {moved}, greedy ids "
          f"changed on {ids_changed}; largest move {worst:.3f} nats "
          f"({'sequential' if args.sequential else 'concurrent'}, prefix cache "
          f"{'off' if args.no_prefix_cache or args.deterministic else 'on'}"
          f"{', deterministic' if args.deterministic else ''}); {sampled} tokens in "
          f"{elapsed:.1f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--sequential", action="store_true")
    ap.add_argument("--no-prefix-cache", action="store_true")
    ap.add_argument("--deterministic", action="store_true")
    asyncio.run(main(ap.parse_args()))
