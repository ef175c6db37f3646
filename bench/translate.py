"""What translation costs (tokenizers/translate.py): median and p99 latency of one short
payload, and throughput over 100k ids (with the target's plain encode of the same text, which
dominates it), and the same 100k ids streamed 8 at a time (the translate fallback's output path),
each direction between SmolLM2's version (byte-level BPE, 49k) and Gemma 3's (SentencePiece,
262k), the two families tokenwire ships. The seed proposal quotes 121.6 us median for
decode-then-re-encode of a short payload.

    .venv/bin/python bench/translate.py
"""

from __future__ import annotations

import statistics
import sysconfig
import time
from pathlib import Path

from tokenwire.config import default_model_path
from tokenwire.packaged import gemma3_model_path
from tokenwire.tokenizers.gguf import tokenizer_from_gguf
from tokenwire.tokenizers.translate import Translator

SHORT = "Bonjour à tous! The quick brown fox jumps over the lazy dog 🎉"
N_SHORT = 5000
N_LONG = 100_000


def main() -> None:
    smol = tokenizer_from_gguf(default_model_path()).tokenizer
    other = tokenizer_from_gguf(gemma3_model_path()).tokenizer
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus = "".join(p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("*.py"))[:60])
    print(f"{'direction':<34} {'short ids':>9} {'median us':>10} {'p99 us':>8} "
          f"{'100k ids ms':>12} {'M ids/s':>8} {'of it, encode ms':>17} {'streamed ms':>12}")
    for src, dst in ((smol, other), (other, smol)):
        tr = Translator(src, dst)
        short = src.encode(SHORT)
        times = []
        for _ in range(N_SHORT):
            t0 = time.perf_counter()
            tr.translate(short)
            times.append(time.perf_counter() - t0)
        times.sort()
        median, p99 = statistics.median(times), times[int(0.99 * len(times))]
        ids = src.encode(corpus)
        while len(ids) < N_LONG:
            ids += ids
        ids = ids[:N_LONG]
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            tr.translate(ids)
            runs.append(time.perf_counter() - t0)
        best = min(runs)
        text = src.decode(ids)
        t0 = time.perf_counter()
        dst.encode(text)
        enc = time.perf_counter() - t0
        t0 = time.perf_counter()
        stream = tr.stream()
        got = [t for k in range(0, N_LONG, 8) for t in stream.push(ids[k:k + 8])]
        got += stream.finish()
        streamed = time.perf_counter() - t0
        assert got == tr.translate(ids).token_ids  # streamed == whole
        print(f"{src.family + ' -> ' + dst.family:<34} {len(short):>9} {median * 1e6:>10.1f} "
              f"{p99 * 1e6:>8.1f} {best * 1e3:>12.1f} {N_LONG / best / 1e6:>8.2f} "
              f"{enc * 1e3:>17.1f} {streamed * 1e3:>12.1f}")


if __name__ == "__main__":
    main()
