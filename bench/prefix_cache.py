"""The prefix cache, measured: streamed time to first token of a request with a ~2k-token
system prompt (cold), then of a second question on the same prefix (warm), over rounds, each
round with a fresh prefix. Against a running server (`make serve`).

    .venv/bin/python bench/prefix_cache.py [BASE_URL] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import httpx

MODEL = "SmolLM2-135M-Instruct"
DOC = " ".join(f"Item {i} is a small fact about the number {i}." for i in range(140))


def ttft(http: httpx.Client, messages: list[dict[str, Any]]) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    first, usage = None, {}
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    assert first is not None, "no content came back"
    return first, usage


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url", nargs="?", default="http://127.0.0.1:8000")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ratios = []
    with httpx.Client(base_url=args.base_url, timeout=300) as http:
        for k in range(args.rounds):
            system = {"role": "system", "content": f"[round {k}] {DOC}"}
            cold, u1 = ttft(http, [system, {"role": "user", "content": "What is item 3?"}])
            warm, u2 = ttft(http, [system, {"role": "user", "content": "What is item 7?"}])
            ratios.append(warm / cold)
            cached = (u2.get("prompt_tokens_details") or {}).get("cached_tokens")
            print(f"round {k}: {u1['prompt_tokens']} prompt tokens; cold {cold:.3f} s, "
                  f"warm {warm:.3f} s ({cached} cached); warm/cold {warm / cold:.3f}")
    print(f"median warm/cold TTFT: {statistics.median(ratios):.3f} "
          f"[{min(ratios):.3f}-{max(ratios):.3f}]")


if __name__ == "__main__":
    main()
