"""Token-keyed replica affinity, measured: a multi-turn chat workload through a gateway in
front of two real tokenwire replicas, and the share of requests that land on the replica
holding their prefix (the one that served the conversation's previous turn, or, for a first
turn, one that served the same system prompt before). The same request sequence is replayed
offline through the policies a gateway without token ids would use, side by side.

    .venv/bin/python bench/affinity.py [--conversations 24 --turns 4]

Starts the two replicas and the gateway itself (real processes on loopback).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.upstreams import Upstream, free_port, tokenwire_upstream  # noqa: E402

from tokenwire.config import default_model_path  # noqa: E402
from tokenwire.engines.upstream.routing import PrefixRouter  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
SYSTEMS = [  # two long shared system prompts; a third of the conversations use the default
    "You are a careful assistant for a bakery. " * 12,
    "You answer questions about astronomy in plain words, briefly and precisely. " * 10,
]


@dataclass
class Request:
    conversation: int
    turn: int
    system: int | None
    prompt: list[int]
    replica: int


def workload(http: httpx.Client, n_conv: int, turns: int, seed: int) -> list[Request]:
    """Conversations interleaved turn by turn, as concurrent users would send them; returns
    each request with the replica that served it (from /health's per-replica counters)."""
    rng = random.Random(seed)
    convs: list[list[dict[str, object]]] = []
    systems: list[int | None] = []
    for c in range(n_conv):
        s = c % 3 if c % 3 < 2 else None
        systems.append(s)
        convs.append([{"role": "system", "content": SYSTEMS[s]}] if s is not None else [])
    out = []
    for turn in range(turns):
        order = list(range(n_conv))
        rng.shuffle(order)
        for c in order:
            convs[c].append({"role": "user", "content": f"Question {turn} of user {c}: "
                             f"{rng.choice(['why?', 'how so?', 'tell me more.', 'and then?'])}"})
            before = served(http)
            r = http.post("/v1/chat/completions", json={
                "model": MODEL, "messages": convs[c], "temperature": 0, "max_tokens": 16,
                "return_token_ids": True, "response_format_tokens": True,
                "tokenizer_version": "smollm2-49k"}).json()
            after = served(http)
            replica = next(i for i in range(len(after)) if after[i] > before[i])
            convs[c].append({"role": "assistant",
                             "token_ids": r["choices"][0]["message"]["token_ids"]})
            out.append(Request(c, turn, systems[c], r["prompt_token_ids"], replica))
    return out


def served(http: httpx.Client) -> list[int]:
    reps = http.get("/health").json()["models"][MODEL]["replicas"]
    return [r["served"] for r in reps]


def share(requests: Sequence[Request], placed: Sequence[int]) -> tuple[float, float, float]:
    """(all, later turns, first turns with a shared system prompt): the share placed on a
    replica holding the prefix."""
    last: dict[int, int] = {}
    system_on: dict[int, set[int]] = {}
    hits = {"turn": [0, 0], "system": [0, 0]}
    for req, rep in zip(requests, placed, strict=True):
        if req.turn > 0:
            kind, holders = "turn", {last[req.conversation]}
        elif req.system is not None and req.system in system_on:
            kind, holders = "system", system_on[req.system]
        else:
            kind, holders = "", set()
        if kind:
            hits[kind][0] += rep in holders
            hits[kind][1] += 1
        last[req.conversation] = rep
        if req.system is not None:
            system_on.setdefault(req.system, set()).add(rep)
    t, s = hits["turn"], hits["system"]
    return ((t[0] + s[0]) / max(1, t[1] + s[1]), t[0] / max(1, t[1]), s[0] / max(1, s[1]))


def replay(requests: Sequence[Request], choose: Callable[[int, Request], int]) -> list[int]:
    return [choose(i, r) for i, r in enumerate(requests)]


def concurrent(requests: Sequence[Request], in_flight: int) -> list[int]:
    """tokenwire's router (the same code) with `in_flight` requests running at once, so its
    load guard sees the replicas' queues (the live run above is sequential)."""
    router = PrefixRouter(2)
    placed = []
    for start in range(0, len(requests), in_flight):
        busy = [0, 0]
        for r in requests[start:start + in_flight]:
            chosen = router.order(r.prompt, [True, True], busy)[0]
            router.record(r.prompt, chosen)
            busy[chosen] += 1
            placed.append(chosen)
    return placed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tw-affinity-"))
    replicas = [tokenwire_upstream(tmp), tokenwire_upstream(tmp)]
    port = free_port()
    gateway = Upstream("gateway", [sys.executable, "-m", "tokenwire", "serve", "--engine",
                                   "vllm", *(a for u in replicas for a in ("--upstream", u.url)),
                                   "--tokenizer", str(default_model_path()), "--port",
                                   str(port), "--workers", "1"],  # one router's memory
                       port, tmp / "gateway.log",
                       env={"TOKENWIRE_TOKENIZER_STORE": str(tmp / "gw-store")}).start()
    try:
        with httpx.Client(base_url=gateway.url, timeout=300) as http:
            requests = workload(http, args.conversations, args.turns, args.seed)
    finally:
        gateway.stop()
        for u in replicas:
            u.stop()
    rng = random.Random(1)
    stateless = PrefixRouter(2)  # the leading-ids hash alone: what every gateway agrees on
    policies = {
        "tokenwire (measured, live gateway)": [r.replica for r in requests],
        "round robin (a text-blind balancer)": replay(requests, lambda i, r: i % 2),
        "random": replay(requests, lambda i, r: rng.randrange(2)),
        "hash of the leading 64 ids, no memory": replay(
            requests, lambda i, r: stateless.order(r.prompt, [True, True], [0, 0])[0]),
        "tokenwire's router, 12 requests in flight (replayed)": concurrent(requests, 12),
    }
    print(f"{len(requests)} requests: {args.conversations} conversations x {args.turns} turns, "
          "2 replicas; a third of the conversations share each of 2 long system prompts")
    print("| placement | on the replica holding the prefix | later turns | first turns "
          "sharing a system prompt | split between replicas |")
    print("|---|---|---|---|---|")
    for name, placed in policies.items():
        a, t, s = share(requests, placed)
        split = sum(placed) / len(placed)
        print(f"| {name} | {a:.0%} | {t:.0%} | {s:.0%} | {1 - split:.0%} / {split:.0%} |")


if __name__ == "__main__":
    main()
