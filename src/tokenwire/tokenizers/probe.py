"""Is the pinned tokenizer the engine's own? A probe corpus, compared string by string.

Every engine runs this at start against its own tokenizer (llama.cpp's, or an upstream's
`/tokenize`), so a gateway never serves ids that mean something else on the other side. The
corpus is a few hundred short strings: the cases where tokenizers of one family drift apart
(whitespace runs, digits, contractions, scripts, emoji, bytes that need fallback, code).
Strings that spell control tokens check the special tokens too.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..errors import TokenizerParityError
from .conversions import conversion_reason
from .hf import HFTokenizer

__all__ = ["PROBE_CORPUS", "TokenizerParityError", "first_mismatch"]

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


PROBE_CORPUS: tuple[str, ...] = _corpus()


@dataclass(frozen=True)
class Mismatch:
    text: str
    ours: list[int]
    theirs: list[int]

    def describe(self, where: str) -> str:
        return (f"the pinned tokenizer does not match {where} on {self.text!r}: "
                f"ours {self.ours}, theirs {self.theirs}")


async def first_mismatch(tokenizer: HFTokenizer,
                         reference: Callable[[Sequence[str]], Awaitable[list[list[int]]]],
                         corpus: Sequence[str] = PROBE_CORPUS) -> Mismatch | None:
    """The first string of `corpus` that `reference` (the engine's own tokenizer) encodes
    differently from `tokenizer`.

    Whether a typed control-token string becomes a control token is the tokenizing server's
    policy, not its tokenizer (vLLM parses them, tokenwire keeps them text): either reading is
    accepted, and every other string must match exactly."""
    with conversion_reason("probe"):  # also a reference that falls back on `tokenizer`
        theirs = await reference(corpus)
        return _first_mismatch(tokenizer, corpus, theirs)


def _first_mismatch(tokenizer: HFTokenizer, corpus: Sequence[str],
                    theirs: Sequence[list[int]]) -> Mismatch | None:
    for text, ids in zip(corpus, theirs, strict=True):
        parsed = tokenizer.encode(text, parse_special=True)
        if ids != parsed and ids != tokenizer.encode(text):
            return Mismatch(text, parsed, ids)
    return None
