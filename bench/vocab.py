"""A production-size vocabulary side by side with the default one: Qwen2's byte-level BPE
(151,936 ids, 151,387 merges: llama.cpp's ggml-vocab-qwen2.gguf, which `make bench` fetches) and
SmolLM2's (49,152 ids), in one run.

What a server pays once per tokenizer (read the GGUF, build the tokenizer.json, load it and
fingerprint it into a version, publish it to the store, load the store at the next start) and
per request (encode and decode throughput on the same text; a short chat prompt rendered and a
short completion decoded, which must cost O(prompt), not O(vocabulary)).

    .venv/bin/python bench/vocab.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenwire.config import default_model_path
from tokenwire.serving.template import ChatTemplate, TemplateMessage
from tokenwire.tokenizers._gguf import read_metadata
from tokenwire.tokenizers.gguf import _BUILDERS, tokenizer_from_gguf
from tokenwire.tokenizers.hf import HFTokenizer, canonical_json
from tokenwire.tokenizers.registry import TokenizerRegistry

QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                 "{% endfor %}<|im_start|>assistant\n")


def _best(fn: Callable[[], Any], rounds: int) -> float:
    """The fastest of `rounds` runs, in seconds (the least disturbed by the other core)."""
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _text() -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("*.py"))[:30])
    return text + " naïve café 日本語のテキスト 🎉 Привет мир " * 300


def measure(path: Path, rounds: int) -> dict[str, float]:
    out: dict[str, float] = {}
    meta: dict[str, Any] = {}

    def read() -> None:
        meta.update(read_metadata(path))

    out["read GGUF metadata (s)"] = _best(read, rounds)
    spec: dict[str, Any] = {}
    out["build tokenizer.json (s)"] = _best(
        lambda: spec.update(_BUILDERS[meta["tokenizer.ggml.model"]](meta)), rounds)
    artifact = canonical_json(spec)
    out["artifact (MB)"] = len(artifact) / 1e6
    toks: list[HFTokenizer] = []
    out["load + fingerprint (s)"] = _best(lambda: toks.append(HFTokenizer(artifact)), rounds)
    out["whole tokenizer_from_gguf (s)"] = _best(lambda: tokenizer_from_gguf(path), rounds)
    tok = toks[-1]
    with tempfile.TemporaryDirectory() as d:
        out["publish to the store (s)"] = _best(
            lambda: TokenizerRegistry(Path(d) / os.urandom(4).hex()).register(tok), rounds)
        store = Path(d) / "store"
        TokenizerRegistry(store).register(tok)
        out["load the store at start (s)"] = _best(
            lambda: TokenizerRegistry(store).load_store(), rounds)
    text = _text()
    ids = tok.encode(text)
    out["encode (MB/s)"] = len(text.encode()) / 1e6 / _best(lambda: tok.encode(text), rounds)
    out["decode (M ids/s)"] = len(ids) / 1e6 / _best(lambda: tok.decode(ids), rounds)
    template = ChatTemplate(QWEN_TEMPLATE, tok, bos_id=None, eos_id=None, add_bos=False)
    chat = [TemplateMessage("system", [], text="You are terse."),
            TemplateMessage("user", [], text="What is the capital of France? One word.")]
    short = ids[:32]
    n = 200
    out["render a short chat (µs)"] = 1e6 * _best(
        lambda: [template.render(chat) for _ in range(n)], rounds) / n
    out["decode 32 ids (µs)"] = 1e6 * _best(lambda: [tok.decode(short) for _ in range(n)],
                                            rounds) / n
    out["vocabulary (ids)"] = float(tok.vocab_size)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    models = Path(os.environ.get("TOKENWIRE_LLAMA_CPP_MODELS", "")).expanduser()
    qwen = models / "ggml-vocab-qwen2.gguf"
    if not qwen.is_file():
        raise SystemExit(f"{qwen}: missing (`make bench` fetches llama.cpp's vocabulary files)")
    rows = {"SmolLM2 (49k)": measure(default_model_path(), args.rounds),
            "Qwen2 (152k)": measure(qwen, args.rounds)}
    names = list(rows)
    print(f"best of {args.rounds} rounds; one core's worth of work, same text for both")
    print(f"{'':32s}" + "".join(f"{n:>16s}" for n in names) + f"{'ratio':>10s}")
    for key in rows[names[0]]:
        a, b = rows[names[0]][key], rows[names[1]][key]
        ratio = b / a if a else float("nan")
        print(f"{key:32s}{a:16.3f}{b:16.3f}{ratio:9.2f}x")
    size = rows[names[1]]["vocabulary (ids)"] / rows[names[0]]["vocabulary (ids)"]
    render = [rows[n]["render a short chat (µs)"] for n in names]
    print(f"per request: Qwen2 renders a short chat in {render[1] / render[0]:.2f}x SmolLM2's "
          f"time with {size:.1f}x its ids (O(prompt), not O(vocabulary))")


if __name__ == "__main__":
    main()
