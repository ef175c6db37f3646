"""A small retrieval-augmented agent loop, run twice against one tokenwire server: once in ids
(documents stored as ids, searched by ids, spliced into prompts by reference, answers kept as
the ids the model sampled) and once through text (the usual way: text stored, retrieved text
pasted into prompts, text answers). It prints what each loop sent and received, how long it
took, and how many encodes and decodes the server performed (`/metrics`).

    python docs/examples/retrieval_loop.py --base-url http://127.0.0.1:8000

Text exists in the id loop only at its edges, on the client: the human's questions (encoded
once, with the server's published tokenizer, verified by its sha256) and the last answer
(decoded once, for the human). docs/storage.md walks through it; tests run it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tokenwire.client import Client

MODEL = "SmolLM2-135M-Instruct"
PASSAGES = [
    "The Loire is the longest river in France, about 1,000 km long.",
    "Mont Blanc, in the Alps, is the highest mountain of western Europe.",
    "Honey bees live in colonies led by a single queen.",
    "The violin has four strings tuned in perfect fifths.",
    "Paris has been the capital of France since the tenth century.",
    "Octopuses have three hearts and blue blood.",
    "The Rhine flows from the Swiss Alps to the North Sea.",
    "A marathon is 42.195 kilometres long.",
]
QUESTIONS = ["Which is the longest river in France?",
             "And which mountain is the highest in western Europe?",
             "How many hearts does an octopus have?"]
CONVERSIONS = "tokenwire_tokenizer_conversions_total"


@dataclass
class Wire:
    """Bytes of every request and response body, counted as they cross the wire."""

    sent: int = 0
    received: int = 0
    calls: int = 0

    def hooks(self) -> dict[str, list[Callable[[Any], None]]]:
        def request(r: httpx.Request) -> None:
            self.sent += len(r.content)
            self.calls += 1

        def response(r: httpx.Response) -> None:
            r.read()
            self.received += len(r.content)

        return {"request": [request], "response": [response]}


@dataclass
class Run:
    name: str
    wire: Wire = field(default_factory=Wire)
    seconds: float = 0.0
    conversions: dict[str, float] = field(default_factory=dict)
    answer: str = ""


def conversions(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics").text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(CONVERSIONS + "{"):
            labels, value = line[len(CONVERSIONS) + 1:].rsplit("} ", 1)
            out[labels] = float(value)
    return out


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def chat(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 24,
                                             "temperature": 0, "store": True, **body})
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def id_loop(c: httpx.Client, version: str, passages: list[list[int]],
            questions: list[list[int]]) -> list[int]:
    docs = [c.post("/v1/documents", json={"token_ids": p, "tokenizer_version": version})
            .json()["id"] for p in passages]
    assert len(docs) == len(passages)
    history: list[dict[str, Any]] = []
    answer: list[int] = []
    for q in questions:
        hits = c.post("/v1/documents/search", json={
            "query": {"token_ids": q, "tokenizer_version": version}, "limit": 2}).json()
        blocks: list[dict[str, Any]] = [{"type": "input_document", "document_id": h["document_id"]}
                                        for h in hits["data"]]
        history.append({"role": "user", "content": [
            *blocks, {"type": "input_tokens", "token_ids": q}]})
        r = chat(c, {"messages": history, "tokenizer_version": version,
                     "response_format_tokens": "only"})
        answer = r["choices"][0]["message"]["token_ids"]
        history.append({"role": "assistant", "token_ids": answer})  # the exact ids, no drift
        # what a trainer reads back: the answer and the prompt, as the ids the model saw
        kept = c.get(f"/v1/chat/completions/{r['id']}", params={"format": "tokens"}).json()
        assert kept["choices"][0]["message"]["token_ids"] == answer
        assert kept["prompt_token_ids"]
    return answer


def text_loop(c: httpx.Client) -> str:
    docs = [c.post("/v1/documents", json={"text": p}).json()["id"] for p in PASSAGES]
    assert len(docs) == len(PASSAGES)
    history: list[dict[str, Any]] = []
    answer = ""
    for q in QUESTIONS:
        hits = c.post("/v1/documents/search", json={"query": q, "limit": 2}).json()
        context = "\n".join(c.get(f"/v1/documents/{h['document_id']}",
                                  params={"format": "text"}).json()["text"]
                            for h in hits["data"])
        history.append({"role": "user", "content": f"{context}\n{q}"})
        r = chat(c, {"messages": history})
        answer = r["choices"][0]["message"]["content"]
        history.append({"role": "assistant", "content": answer})
        # what a trainer reads back: the answer, and the prompt (as messages, in text)
        kept = c.get(f"/v1/chat/completions/{r['id']}", params={"format": "text"}).json()
        assert kept["choices"][0]["message"]["content"] == answer
        prompt = c.get(f"/v1/chat/completions/{r['id']}/messages",
                       params={"format": "text", "limit": 100}).json()
        assert len(prompt["data"]) == len(history) - 1
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, the two loops alternating (the median time is shown)")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args()
    base = args.base_url.rstrip("/").removesuffix("/v1")
    with Client(f"{base}/v1") as sdk:
        tok = sdk.tokenizer(model=MODEL)  # the server's tokenizer, checked by its sha256
    passages = [tok.encode(p) for p in PASSAGES]  # ids the client holds (from anywhere)
    questions = [tok.encode(q) for q in QUESTIONS]  # the human's words: the only encode
    # one request first: the server encodes its template's structure pieces (role markers)
    # once per process, then remembers their ids (text contents are encoded with the text
    # around them, so the warm-up sends ids)
    def said(text: str) -> list[dict[str, Any]]:
        return [{"type": "input_tokens", "token_ids": tok.encode(text)}]

    httpx.post(f"{base}/v1/chat/completions", timeout=300, json={
        "model": MODEL, "max_tokens": 1, "tokenizer_version": tok.version, "messages": [
            {"role": "user", "content": said("Hi")}, {"role": "assistant", "token_ids":
                                                      tok.encode("Hello")},
            {"role": "user", "content": said("Bye")}]})
    runs = {name: Run(name) for name in ("ids", "text")}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            run.wire = Wire()  # every round moves the same bytes: one round's are shown
            before = conversions(base)
            start = time.perf_counter()
            with httpx.Client(base_url=base, timeout=300, event_hooks=run.wire.hooks()) as c:
                if name == "ids":
                    run.answer = tok.decode(id_loop(c, tok.version, passages, questions))
                else:
                    run.answer = text_loop(c)
            times[name].append(time.perf_counter() - start)
            run.conversions = moved(before, conversions(base))
    for name, run in runs.items():
        run.seconds = statistics.median(times[name])
    ids, text = runs["ids"], runs["text"]
    if args.json:
        print(json.dumps({r.name: {"sent": r.wire.sent, "received": r.wire.received,
                                   "calls": r.wire.calls, "seconds": r.seconds,
                                   "conversions": r.conversions, "answer": r.answer}
                          for r in runs.values()}))
        return
    print(f"{'':<22}{'ids':>12}{'text':>12}{'ids/text':>10}")
    for label, a, b in (("bytes sent", ids.wire.sent, text.wire.sent),
                        ("bytes received", ids.wire.received, text.wire.received),
                        ("seconds (median)", ids.seconds, text.seconds),
                        ("server conversions", sum(ids.conversions.values()),
                         sum(text.conversions.values()))):
        ratio = f"{a / b:.2f}" if b else "-"
        print(f"{label:<22}{a:>12,.2f}{b:>12,.2f}{ratio:>10}" if label.startswith("seconds") else
              f"{label:<22}{a:>12,.0f}{b:>12,.0f}{ratio:>10}")
    for r in runs.values():
        print(f"server conversions, {r.name} loop: {r.conversions or 'none'}")
    print(f"last answer (ids loop, decoded once for you): {ids.answer!r}")


if __name__ == "__main__":
    main()
