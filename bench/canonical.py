"""What the id checks cost: canonicality (encode(decode(ids)) == ids), the control-token scan
and the content policy, per 1,000 ids, side by side in one run.

    .venv/bin/python bench/canonical.py
"""

from __future__ import annotations

import sysconfig
import timeit
from pathlib import Path

from tokenwire.config import default_model_path
from tokenwire.policy import RulePolicy
from tokenwire.serving.tokens import IdSpan, check_special_ids, is_canonical
from tokenwire.tokenizers.gguf import tokenizer_from_gguf


def main() -> None:
    tok = tokenizer_from_gguf(default_model_path()).tokenizer
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("*.py"))[:40])
    text += " naïve café 日本語のテキスト 🎉 " * 200
    ids = tok.encode(text)
    blocks = [ids[i:i + 1000] for i in range(0, len(ids) - 1000, 1000)][:200]
    odd = [tok.encode(t) for t in "".join(tok.decode(blocks[0])).split(" ")]
    odd_block = [i for piece in odd for i in piece][:1000]
    policy = RulePolicy(["forbidden recipe", "build a bomb", "credit card dump"],
                        [r"secret code \d{4}"])
    texts = [tok.decode(b) for b in blocks]

    def per_block(fn, items) -> float:  # type: ignore[no-untyped-def]
        n = 3
        t = timeit.timeit(lambda: [fn(x) for x in items], number=n)
        return 1e6 * t / (n * len(items))

    rows = {
        "decode (bytes join)": per_block(tok.decode, blocks),
        "encode of the decoded text": per_block(lambda b: tok.encode(tok.decode(b)), blocks),
        "is_canonical, canonical block": per_block(lambda b: is_canonical(b, tok), blocks),
        "is_canonical, non-canonical block": per_block(lambda b: is_canonical(b, tok),
                                                       [odd_block] * 50),
        "control-token scan": per_block(lambda b: check_special_ids([IdSpan("x", b)], tok),
                                        blocks),
        "content policy on the decoded text": per_block(policy.check, texts),
    }
    print(f"{len(blocks)} blocks of 1,000 ids ({sum(map(len, texts)) // len(texts)} chars each)")
    for name, us in rows.items():
        print(f"  {name:38s} {us:9.1f} µs per 1k ids")
    ratio = rows["is_canonical, canonical block"] / rows["encode of the decoded text"]
    print(f"  canonicality / plain encode:          {ratio:.2f}x")


if __name__ == "__main__":
    main()
