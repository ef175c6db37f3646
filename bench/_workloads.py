"""The workloads of bench/compare.py: greedy chat completions streamed over HTTP, the same
bytes sent to every contender. Each takes a `nonce` that starts its prompts, so no contender
answers from a cache filled by an earlier round (except where the cache is the point).

Completion tokens are the server's `usage` where it streams one, else its content chunks
(llama-cpp-python streams no usage, and one chunk per token).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench._servers import Server

__all__ = ["WorkloadError", "agent", "concurrent", "prefix_cache", "single"]

STORY = "Write a long story about a dragon who learns to cook."
DOC = " ".join(f"Item {i} is a small fact about the number {i}." for i in range(100))  # ~1.5k
AGENT_SYSTEM = ("You are a monitoring agent. After each tool result, say briefly what you "
                "learned and which tool you will call next.")


class WorkloadError(Exception):
    """A workload that got no usable answer (the message says what came back)."""


@dataclass
class Stream:
    """One streamed chat completion, timed from the moment the request was sent."""

    tokens: int = 0
    ttft: float | None = None  # first chunk with text (the answer's or the reasoning's)
    last: float = 0.0  # last chunk with text
    elapsed: float = 0.0  # the whole request
    finish: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    reasoning: str = ""
    """What a model that reasons wrote before its answer (`delta.reasoning`, tokenwire's and
    vLLM's, or llama-server's `reasoning_content`)."""


async def chat(http: httpx.AsyncClient, server: Server, messages: list[dict[str, str]],
               max_tokens: int) -> Stream:
    body = {"model": server.model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    out, chunks, parts, thought = Stream(), 0, [], []
    request = http.build_request("POST", f"{server.url}/v1/chat/completions", json=body)
    t0 = time.perf_counter()
    try:
        r = await http.send(request, stream=True)
    except httpx.RemoteProtocolError:
        # a pooled connection the server closed after its last response, unannounced
        # (llama-server does so after a request that took over 5 s): sent once more, on a
        # new connection, and timed from there
        t0 = time.perf_counter()
        r = await http.send(request, stream=True)
    try:
        if r.status_code != 200:
            raise WorkloadError(f"{r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                text = delta.get("content")
                piece = delta.get("reasoning") or delta.get("reasoning_content")
                if text or piece:
                    out.last = time.perf_counter() - t0
                    out.ttft = out.ttft if out.ttft is not None else out.last
                    chunks += 1
                    (parts if text else thought).append(text or piece)
                out.finish = choice.get("finish_reason") or out.finish
            out.usage = chunk.get("usage") or out.usage
    finally:
        await r.aclose()
    out.elapsed = time.perf_counter() - t0
    out.text = "".join(parts)
    out.reasoning = "".join(thought)
    out.tokens = int(out.usage.get("completion_tokens", chunks))
    return out


def _text(s: Stream) -> Stream:
    if s.ttft is None:
        raise WorkloadError(f"no text came back (finish_reason {s.finish})")
    return s


def _story(nonce: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Story {nonce}. {STORY}"}]


async def single(http: httpx.AsyncClient, server: Server, tokens: int,
                 nonce: str) -> dict[str, Any]:
    """One stream: tokens/s over the whole request (sent to last token), and decode-only."""
    s = _text(await chat(http, server, _story(nonce), tokens))
    decode = (s.tokens - 1) / (s.last - s.ttft) if s.ttft is not None and s.last > s.ttft else 0
    return {"tok_s": s.tokens / s.elapsed, "decode_tok_s": decode, "tokens": s.tokens,
            "ttft_s": s.ttft, "elapsed_s": s.elapsed}


async def concurrent(http: httpx.AsyncClient, server: Server, tokens: int, n: int,
                     nonce: str) -> dict[str, Any]:
    """`n` simultaneous streams of one prompt: aggregate tokens/s (all tokens over the wall
    time of the whole batch), their TTFT p50, and the server's resident memory, sampled every
    50 ms, at its most. `cut`: streams that ended with no finish_reason (cut short by the
    server: llama-cpp-python's default interrupt_requests); their TTFT counts where they
    brought any text."""
    peak = server.rss()
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, server.rss())
            try:
                await asyncio.wait_for(done.wait(), 0.05)
            except TimeoutError:
                pass

    sampler = asyncio.create_task(sample())
    t0 = time.perf_counter()
    try:
        runs = await asyncio.gather(*(chat(http, server, _story(nonce), tokens)
                                      for _ in range(n)))
    finally:
        done.set()
        await sampler
    wall = time.perf_counter() - t0
    ttfts = [s.ttft for s in runs if s.ttft is not None]
    if not ttfts:
        raise WorkloadError(f"no text came back on any of the {n} streams")
    return {"agg_tok_s": sum(s.tokens for s in runs) / wall, "wall_s": wall,
            "ttft_p50_s": statistics.median(ttfts),
            "tokens": [s.tokens for s in runs], "cut": sum(s.finish is None for s in runs),
            "rss_max_mib": peak / 2**20}


async def prefix_cache(http: httpx.AsyncClient, server: Server, nonce: str) -> dict[str, Any]:
    """TTFT of a question on a fresh ~1.5k-token system prompt (cold), then of another
    question on the same prompt (warm): what a prefix cache saves."""
    system = {"role": "system", "content": f"[document {nonce}] {DOC}"}
    cold = _text(await chat(http, server, [system, {"role": "user",
                                                    "content": "What is item 3?"}], 8))
    warm = _text(await chat(http, server, [system, {"role": "user",
                                                    "content": "What is item 7?"}], 8))
    assert cold.ttft is not None and warm.ttft is not None
    cached = (warm.usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"cold_ttft_s": cold.ttft, "warm_ttft_s": warm.ttft,
            "warm_over_cold": warm.ttft / cold.ttft,
            "prompt_tokens": cold.usage.get("prompt_tokens"), "warm_cached_tokens": cached}


def _tool_result(turn: int, nonce: str) -> str:
    """~115 tokens of tool output (with the reply and the template's markers, each turn adds
    ~200 tokens; 10 turns fit a 2048-token sequence)."""
    rows = "\n".join(f"- sensor s{turn}.{i}: {20 + (7 * i + 3 * turn) % 17}.{(i * turn) % 10} C,"
                     " status ok" for i in range(5))
    return (f"Tool result {turn} (job {nonce}):\n{rows}\n"
            "Summarize these readings and say which sensor to check next.")


async def agent(http: httpx.AsyncClient, server: Server, turns: int, max_tokens: int,
                nonce: str) -> dict[str, Any]:
    """One conversation of `turns` requests, each appending the previous reply and a new
    tool result: the wall time of the whole conversation."""
    messages = [{"role": "system", "content": AGENT_SYSTEM}]
    completion = 0
    prompt_tokens: list[int] = []
    t0 = time.perf_counter()
    for turn in range(turns):
        messages.append({"role": "user", "content": _tool_result(turn, nonce)})
        s = _text(await chat(http, server, messages, max_tokens))
        messages.append({"role": "assistant", "content": s.text})
        completion += s.tokens
        prompt_tokens.append(int(s.usage.get("prompt_tokens", 0)))
    return {"wall_s": time.perf_counter() - t0, "completion_tokens": completion,
            "prompt_tokens": prompt_tokens}
