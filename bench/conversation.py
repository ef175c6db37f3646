"""What a conversation kept by the server costs, against the client sending its history: the
same greedy multi-turn Responses conversation three ways, side by side (alternating, several
rounds), on the embedded engine:
- `by id`: each turn sends only its new message and `previous_response_id` (the server keeps
  every response, `store`, and continues from the kept ids);
- `history, ids`: `store: false`, each turn sends the whole history, the returned items with
  their `token_ids` (spliced verbatim);
- `history, text`: `store: false`, the whole history as text (rendered and encoded again).
Per turn: the wall time, the prompt tokens the prefix cache served, the request's size. The
three prompts are checked to be the same ids turn by turn (the by-id and ids ways), so only the
work around them differs; then one-turn requests with `store` true and false side by side give
the cost of the durable write.

    .venv/bin/python bench/conversation.py [--rounds 5 --turns 8]

Starts `tokenwire serve` (the embedded default model, SQLite storage in a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.upstreams import tokenwire_upstream  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
IDS = ["input.token_ids", "output.token_ids"]
ASKS = ["Name a large animal.", "And a small one?", "Which of the two is faster?",
        "Where does the first one live?", "What does the second one eat?",
        "Name a third animal.", "Which of the three is the oldest species?",
        "Say goodbye in one word."]


def turn(http: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any], int]:
    payload = json.dumps({"model": MODEL, "temperature": 0, "max_output_tokens": 24,
                          "include": IDS, **body}).encode()
    t0 = time.perf_counter()
    r = http.post(f"{url}/v1/responses", content=payload,
                  headers={"content-type": "application/json"})
    took = time.perf_counter() - t0
    r.raise_for_status()
    return took, r.json(), len(payload)


def conversation(http: httpx.Client, url: str, way: str, turns: int,
                 ) -> list[tuple[float, int, int, list[int]]]:
    """Per turn: (seconds, cached prompt tokens, request bytes, prompt ids)."""
    out = []
    history: list[dict[str, Any]] = []
    last: str | None = None
    version = ""
    for ask in ASKS[:turns]:
        user = {"role": "user", "content": ask}
        if way == "by id":
            body: dict[str, Any] = {"input": [user]}
            if last is not None:
                body["previous_response_id"] = last
        else:
            body = {"input": [*history, user], "store": False}
            if history and way == "history, ids":
                body["tokenizer_version"] = version
        took, resp, size = turn(http, url, body)
        last, version = resp["id"], resp["tokenizer_version"]
        output = resp["output"]
        if way == "history, text":
            output = [{k: v for k, v in item.items() if k != "token_ids"} for item in output]
        history += [user, *output]
        cached = resp["usage"]["input_tokens_details"]["cached_tokens"]
        out.append((took, cached, size, resp["input_token_ids"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--turns", type=int, default=len(ASKS))
    args = ap.parse_args()
    ways = ["by id", "history, ids", "history, text"]
    up = tokenwire_upstream(Path(tempfile.mkdtemp()))
    try:
        with httpx.Client(timeout=300) as http:
            conversation(http, up.url, "by id", 2)  # warm
            got: dict[str, list[list[tuple[float, int, int, list[int]]]]] = {w: [] for w in ways}
            for r in range(args.rounds):
                for w in ways[r % 3:] + ways[:r % 3]:
                    got[w].append(conversation(http, up.url, w, args.turns))
            for a, b in zip(got["by id"], got["history, ids"], strict=True):
                assert [t[3] for t in a] == [t[3] for t in b], "the prompts differ"
            print(f"{args.turns}-turn conversation, {args.rounds} rounds, medians per turn:")
            print("| turn | " + " | ".join(f"{w}: ms, cached, bytes" for w in ways) + " |")
            print("| --- |" + " --- |" * len(ways))
            for k in range(args.turns):
                cells = []
                for w in ways:
                    ms = statistics.median(run[k][0] for run in got[w]) * 1000
                    cached = statistics.median(run[k][1] for run in got[w])
                    size = statistics.median(run[k][2] for run in got[w])
                    cells.append(f"{ms:.0f}, {cached:.0f}, {size:.0f}")
                prompt = len(got["by id"][0][k][3])
                print(f"| {k + 1} ({prompt} prompt ids) | " + " | ".join(cells) + " |")
            stored: dict[bool, list[float]] = {True: [], False: []}
            for r in range(args.rounds * 4):
                for keep in ((True, False) if r % 2 else (False, True)):
                    stored[keep].append(turn(http, up.url, {"input": "Say only yes.",
                                                            "store": keep})[0])
            on, off = (statistics.median(stored[k]) * 1000 for k in (True, False))
            print(f"one turn, store true vs false: {on:.1f} ms vs {off:.1f} ms "
                  f"({on - off:+.1f} ms)")
    finally:
        up.stop()


if __name__ == "__main__":
    main()
