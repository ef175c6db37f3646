"""Is the pinned tokenizer the engine's own? A probe corpus, compared string by string.

Every engine runs this at start against its own tokenizer (llama.cpp's, or an upstream's
`/tokenize`), so a gateway never serves ids that mean something else on the other side. The
corpus is a few hundred short strings: the cases where tokenizers of one family drift apart
(whitespace runs, digits, contractions, scripts, emoji, bytes that need fallback, code).
Strings that spell control tokens check the special tokens too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..errors import TokenizerParityError
from ._corpus import CORPUS
from .conversions import conversion_reason
from .hf import HFTokenizer

__all__ = ["PROBE_CORPUS", "TokenizerParityError", "first_mismatch"]

PROBE_CORPUS: tuple[str, ...] = CORPUS
"""The frozen corpus of `_corpus.py` (the version fingerprint hashes its ids too)."""


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
