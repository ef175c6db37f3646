"""What structured output costs on the embedded engine: for each schema, a greedy streamed chat
with `response_format: json_schema` against the same request without one, side by side
(alternating, several rounds): time per output token (the median gap between chunks, which is
the per-step cost of the mask), and the time to the first token (the schema's compile at
admission shows there). Every constrained output is checked against its schema.

    .venv/bin/python bench/structured.py [--rounds 5 --tokens 48]

Starts `tokenwire serve` (the embedded default model) itself. Run on one commit, then on
another, to compare grammar libraries: the requests are the OpenAI API's, the same on both.
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
import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.upstreams import tokenwire_upstream  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "Describe a person as JSON: their name, age, a three-letter code and some tags."
SCHEMAS: dict[str, dict[str, Any]] = {
    "object": {"type": "object", "properties": {"name": {"type": "string"},
                                                 "age": {"type": "integer"}},
               "required": ["name", "age"], "additionalProperties": False},
    "enum + array": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                 "maxItems": 3}}, "required": ["color", "tags"], "additionalProperties": False},
    "nested, $ref": {"type": "object", "$defs": {"pet": {"type": "object", "properties": {
        "kind": {"type": "string"}, "legs": {"type": "integer"}}, "required": ["kind", "legs"],
        "additionalProperties": False}}, "properties": {"owner": {"type": "string"}, "pets": {
            "type": "array", "items": {"$ref": "#/$defs/pet"}, "maxItems": 2}},
        "required": ["owner", "pets"], "additionalProperties": False},
}
"""Schemas both the old grammar converter and the grammar library accept (the comparison)."""


def body(tokens: int, schema: dict[str, Any] | None) -> dict[str, Any]:
    b: dict[str, Any] = {"model": MODEL, "stream": True, "temperature": 0, "max_tokens": tokens,
                         "messages": [{"role": "user", "content": PROMPT}]}
    if schema is not None:
        b["response_format"] = {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema}}
    return b


def one(http: httpx.Client, url: str, tokens: int,
        schema: dict[str, Any] | None) -> tuple[float, float, str, int]:
    """(TTFT s, median gap between chunks s, text, chunks with text)."""
    t0 = time.perf_counter()
    stamps: list[float] = []
    text = []
    with http.stream("POST", f"{url}/v1/chat/completions", json=body(tokens, schema)) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            for c in chunk.get("choices", []):
                if c["delta"].get("content"):
                    stamps.append(time.perf_counter())
                    text.append(c["delta"]["content"])
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return stamps[0] - t0, statistics.median(gaps), "".join(text), len(stamps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tw-structured-"))
    server = tokenwire_upstream(tmp, n_parallel=1)
    rows: dict[str, dict[str, list[float]]] = {}
    cut: dict[str, int] = {}
    try:
        with httpx.Client(timeout=300) as http:
            one(http, server.url, 8, None)  # warm
            for r in range(args.rounds):
                for name, schema in SCHEMAS.items():
                    for label, s in ((f"{name}: none", None), (f"{name}: schema", schema)):
                        ttft, gap, text, _ = one(http, server.url, args.tokens, s)
                        if s is not None:  # a document valid against it, or cut off
                            try:
                                doc = json.loads(text)
                            except json.JSONDecodeError:
                                cut[name] = cut.get(name, 0) + 1
                            else:
                                jsonschema.validate(doc, s)
                        row = rows.setdefault(label, {"ttft": [], "gap": []})
                        row["ttft"].append(ttft * 1000)
                        row["gap"].append(gap * 1000)
                print(f"  round {r + 1}/{args.rounds} done", flush=True)
    finally:
        server.stop()
    print("\n| schema: constraint | TTFT ms | ms per token | TTFT over none "
          "| per token over none |")
    print("|---|---|---|---|---|")
    for name in SCHEMAS:
        base = rows[f"{name}: none"]
        for label in (f"{name}: none", f"{name}: schema"):
            row = rows[label]
            over = ["-", "-"]
            if label.endswith("schema"):
                over = [f"{statistics.median(a - b for a, b in pairs):+.2f}"
                        for pairs in (zip(row[k], base[k], strict=True) for k in ("ttft", "gap"))]
            print(f"| {label} | {statistics.median(row['ttft']):.2f} | "
                  f"{statistics.median(row['gap']):.2f} | {over[0]} | {over[1]} |")
    if cut:
        print(f"\ncut off by max_tokens (valid so far, not checked): {cut}")


if __name__ == "__main__":
    main()
