"""The probe corpus: a few hundred short strings where tokenizers of one family drift apart.

Whitespace runs, digits, contractions, scripts, emoji, bytes that need fallback, code, and
strings that spell control tokens. Two uses: the start-up parity probe (`probe.py`) and the
version fingerprint (`fingerprint.py`), which hashes the ids of these strings. So this corpus
is FROZEN: a changed string changes every tokenizer version id. A probe that needs more strings
adds them in probe.py; the fingerprint changes only with a new scheme (`fingerprint.SCHEME`),
and a test pins the corpus's hash.
"""

from __future__ import annotations

import itertools

__all__ = ["CORPUS"]

_WORDS = ["the", "token", "Hello", "world", "ids", "naïve", "café", "straße", "Æther", "don't",
          "it's", "we'll", "I'M", "x", "Z", "über", "Ωmega", "résumé"]
_PIECES = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u2003", "\u3000",
    "0", "7", "42", "1234567", "3.14159", "1e-10", "-5", "١٢٣", "五", "½", "x²",
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S",
    "日本語", "中文文本", "한국어", "עברית", "عربية", "русский", "ελληνικά", "हिन्दी", "ไทย",
    "🎉", "👨‍👩‍👧", "🏳️‍🌈", "🇫🇷", "1️⃣", "✔️",
    "def f(x):", "    return x ** 2", "{\"a\": [1, 2]}", "<div class='x'>", "a->b", "i++;",
    "\x00", "\x7f", "\ufeff", "\u200b", "\U0010ffff", "\ud7ff",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<|im_start|",
    "|im_end|>", "<<|im_start|>>", "<|IM_START|>",
]


def _corpus() -> tuple[str, ...]:
    out: list[str] = [p for p in _PIECES if p]
    # every piece between words, and pairs of pieces: boundaries are where tokenizers differ
    for i, p in enumerate(_PIECES):
        w = _WORDS[i % len(_WORDS)]
        out.append(f"{w}{p}{_WORDS[(i + 3) % len(_WORDS)]}")
        out.append(f" {p}{w} ")
    for a, b in itertools.islice(itertools.combinations(_PIECES[1:40], 2), 0, None, 7):
        out.append(a + b)
    out += [
        "   lots   of\n\n\n  space\t\t \r\n \u00a0\u2003 end  ",
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nhi",
        "The quick brown fox jumps over the lazy dog. " * 4,
        "a" * 200, "🎉" * 40, " " * 33, "\n" * 17, "1" * 50,
    ]
    return tuple(dict.fromkeys(out))  # unique, in order


CORPUS: tuple[str, ...] = _corpus()
