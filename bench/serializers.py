"""Reading and writing a whole answer's per-token arrays: which library, measured.

On one recorded vLLM 0.32 unstreamed generate body (bench/gateways.py --record; logprobs with
the sampled token and the most likely ones), microseconds per token, best of `--repeat`:
- reading the body: the stdlib's `json`, `orjson`, and `msgspec` decoding straight into the
  structs tokenwire reads (engines/vllm.py `_Whole`: what is not declared is skipped);
- writing chat's `logprobs.content` (top 1): pydantic models dumped by pydantic (how tokenwire
  wrote them before), plain dicts dumped by orjson, msgspec structs encoded by msgspec, and the
  entries written as JSON text from each id's cached head (serving/logprobs.py, what tokenwire
  does now) spliced in by orjson.

    .venv/bin/python bench/serializers.py --recorded rec.json [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.upstreams import hf_model_dir  # noqa: E402

from tokenwire.engines.base import SamplingParams  # noqa: E402
from tokenwire.engines.vllm import _WHOLE, _VllmDecoder  # noqa: E402
from tokenwire.protocol.chat import ChoiceLogprobs  # noqa: E402
from tokenwire.serving.logprobs import chat_logprobs, chat_logprobs_json, token_text  # noqa: E402
from tokenwire.tokenizers.source import load_tokenizer  # noqa: E402


def per_token(f: Callable[[], Any], tokens: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best / tokens * 1e6


class _Top(msgspec.Struct):
    token: str
    bytes: list[int]
    logprob: float
    id: int


class _Entry(msgspec.Struct):
    token: str
    bytes: list[int]
    logprob: float
    id: int
    top_logprobs: list[_Top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recorded", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    body = json.dumps(json.loads(args.recorded.read_text())["generate_whole"]).encode()
    tok = load_tokenizer(hf_model_dir()).tokenizer
    dec = _VllmDecoder([1], SamplingParams(max_tokens=1 << 20, logprobs=1), frozenset())
    run = dec.feed(dec.parse(body))[0]
    events = list(run)  # type: ignore[arg-type]
    n = len(events)
    r = args.repeat
    read = {
        "json": per_token(lambda: json.loads(body), n, r),
        "orjson": per_token(lambda: orjson.loads(body), n, r),
        "msgspec (typed structs)": per_token(lambda: _WHOLE.decode(body), n, r),
    }

    def models() -> bytes:
        return ChoiceLogprobs(content=chat_logprobs(tok, events)).model_dump_json().encode()

    def dicts() -> bytes:
        return orjson.dumps([{
            "token": token_text(tok, e.token_id), "bytes": list(tok.token_bytes(e.token_id)),
            "logprob": e.logprob, "id": e.token_id, "top_logprobs": [
                {"token": token_text(tok, t), "bytes": list(tok.token_bytes(t)), "logprob": lp,
                 "id": t} for t, lp in e.top_logprobs]} for e in events])

    enc = msgspec.json.Encoder()

    def structs() -> bytes:
        return enc.encode([_Entry(token_text(tok, e.token_id), list(tok.token_bytes(e.token_id)),
                                  e.logprob or 0.0, e.token_id,
                                  [_Top(token_text(tok, t), list(tok.token_bytes(t)), lp, t)
                                   for t, lp in e.top_logprobs]) for e in events])

    def fragments() -> bytes:
        return orjson.dumps({"content": chat_logprobs_json(tok, run)}, default=lambda o:
                            orjson.Fragment(o.data))

    same = [json.loads(f())["content"] if f is fragments else json.loads(f())
            for f in (models, dicts, structs, fragments)]
    assert all(json.loads(models())["content"] == s for s in [same[1], same[2], same[3]]), \
        "the writers disagree"
    write = {
        "pydantic models (before)": per_token(models, n, r),
        "orjson (dicts)": per_token(dicts, n, r),
        "msgspec (structs)": per_token(structs, n, r),
        "cached heads + orjson Fragment (now)": per_token(fragments, n, r),
    }
    out = {"tokens": n, "read_us_per_token": read, "write_us_per_token": write}
    for title, rows in (("read the body", read), ("write logprobs (top 1)", write)):
        print(f"{title}, us per token ({n} tokens):")
        for k, v in rows.items():
            print(f"  {k:40s} {v:.3f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
