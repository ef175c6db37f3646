"""Compact ids (`encoding_format: "base64"`): bytes and CPU on both sides, measured.

A whole generate answer as an RL step reads it: `n` choices of `--ids` sampled ids each and the
prompt's ids, the ids real text makes (this repository's docs, tokenized) in two vocabularies:
SmolLM2's 49k (the default model) and Qwen2's 151k (llama.cpp's vocabulary file, as most
current models' vocabularies are 128-262k). Per id, best of `--repeat`:
- bytes on the wire: a JSON list (`[504,4354,...]`) against base64 of little-endian int32;
- the server writing the answer (`json_bytes`, tokenwire's `GenerateResponse`; with base64,
  `pack_ids` first);
- a client reading it: `orjson.loads` alone (a raw client: a list of ints, or the base64
  decoded into an `array`), and tokenwire's client model (`model_validate_json`, ids as a list
  either way).

    make bench BENCH="compact_ids --json docs/compact_ids.json"   # or, with
    TOKENWIRE_LLAMA_CPP_MODELS set: .venv/bin/python bench/compact_ids.py [--ids 1024 --n 8]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.serializers import per_token  # noqa: E402
from tokenwire.config import default_model_path  # noqa: E402
from tokenwire.protocol._base import pack_ids  # noqa: E402
from tokenwire.protocol.generate import GenerateChoice, GenerateResponse  # noqa: E402
from tokenwire.tokenizers.gguf import tokenizer_from_gguf  # noqa: E402

QWEN2 = "ggml-vocab-qwen2.gguf"  # in llama.cpp's vocabulary files (`make bench` names them)


def measure(name: str, ids: list[int], n: int, length: int, repeat: int) -> dict[str, Any]:
    choices = [GenerateChoice(index=i, finish_reason="length",
                              token_ids=ids[(i + 1) * length:(i + 2) * length])
               for i in range(n)]
    resp = GenerateResponse(request_id="gen-1", model="m", choices=choices,
                            prompt_token_ids=ids[:length])
    total = (n + 1) * length
    as_list, as_b64 = resp.json_bytes(), pack_ids(resp).json_bytes()

    def raw_b64() -> None:
        body = orjson.loads(as_b64)
        for c in body["choices"]:
            array("i", base64.b64decode(c["token_ids"]))

    assert GenerateResponse.model_validate_json(as_b64).choices == \
        GenerateResponse.model_validate_json(as_list).choices
    def us(f: Callable[[], Any]) -> float:
        return round(per_token(f, total, repeat), 4)

    return {
        "vocabulary": name, "ids": total,
        "bytes_per_id": {"list": round(len(as_list) / total, 2),
                         "base64": round(len(as_b64) / total, 2)},
        "write_us_per_id": {"list": us(resp.json_bytes),
                            "base64": us(lambda: pack_ids(resp).json_bytes())},
        "read_raw_us_per_id": {"list": us(lambda: orjson.loads(as_list)), "base64": us(raw_b64)},
        "read_model_us_per_id": {
            "list": us(lambda: GenerateResponse.model_validate_json(as_list)),
            "base64": us(lambda: GenerateResponse.model_validate_json(as_b64))},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ids", type=int, default=1024, help="ids per choice (and the prompt's)")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    text = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    need = (args.n + 1) * args.ids
    rows = []
    models = Path(os.environ.get("TOKENWIRE_LLAMA_CPP_MODELS", "")).expanduser()
    if not (models / QWEN2).is_file():
        sys.exit("TOKENWIRE_LLAMA_CPP_MODELS names no folder of llama.cpp's vocabulary files "
                 "(`make bench BENCH=compact_ids` sets it)")
    for name, path in (("SmolLM2 49k", default_model_path()), ("Qwen2 151k", models / QWEN2)):
        ids = tokenizer_from_gguf(path).tokenizer.encode(text)
        assert len(ids) >= need, f"{len(ids)} ids of text, {need} wanted"
        rows.append(measure(name, ids, args.n, args.ids, args.repeat))
    print(f"{'vocabulary':<12} {'bytes/id list':>14} {'base64':>7} {'write us/id list':>17}"
          f" {'base64':>7} {'read raw list':>14} {'base64':>7} {'read model list':>16}"
          f" {'base64':>7}")
    for r in rows:
        b, w, rr, rm = (r["bytes_per_id"], r["write_us_per_id"], r["read_raw_us_per_id"],
                        r["read_model_us_per_id"])
        print(f"{r['vocabulary']:<12} {b['list']:>14} {b['base64']:>7} {w['list']:>17}"
              f" {w['base64']:>7} {rr['list']:>14} {rr['base64']:>7} {rm['list']:>16}"
              f" {rm['base64']:>7}")
    if args.json:
        args.json.write_text(json.dumps({"n": args.n, "ids_per_choice": args.ids,
                                         "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
