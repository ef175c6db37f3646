"""Text arriving in pieces -> ids, emitted only where later text can no longer change them.

Encoding each piece on its own is wrong (`"Hel" + "lo"` are not the ids of `"Hello"`), and
re-encoding the whole text at every piece costs quadratic time. A BPE tokenizer whose
pre-tokenizer splits text into segments encodes each segment on its own, so the ids of every
segment that more text cannot extend or re-split are final. The last two segments are held
back (appending text can grow the last one, and a lookahead such as `\\s+(?!\\S)` can re-split
the boundary before it); every segment before them is encoded once, on its own, and emitted.

So concat(push(...) ... finish()) == encode(whole text), which the tests check on random text
cut at random places. Tokenizers whose encoding is not segment-local (a normalizer, or a
SentencePiece prefix on the first word only), or that cannot show their segments (not an
`HFTokenizer`), hold every id until `finish`: correct, only late.
"""

from __future__ import annotations

from .base import Tokenizer
from .hf import HFTokenizer

__all__ = ["IncrementalEncoder"]

_HELD_SEGMENTS = 2


class IncrementalEncoder:
    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._hf = tokenizer if isinstance(tokenizer, HFTokenizer) and tokenizer.segment_local \
            else None
        self._text = ""
        self._done = 0
        """Characters of `_text` whose ids have been emitted."""

    def push(self, piece: str) -> list[int]:
        """Take more text; returns the ids that are final now (maybe none)."""
        self._text += piece
        if self._hf is None:
            return []
        tail = self._text[self._done:]
        segments = self._hf.pre_tokenize(tail)
        if len(segments) <= _HELD_SEGMENTS:
            return []
        final = segments[:-_HELD_SEGMENTS]
        self._done += final[-1][1]
        # segment by segment: encoding the final text as one string would let its end re-split
        # (`"\r\n"` is one segment at the end of a string, two before a letter)
        return self._hf.encode_segments([tail[a:b] for a, b in final])

    def finish(self) -> list[int]:
        """The ids of everything not emitted yet (no more text will come)."""
        rest = self._text[self._done:]
        self._done = len(self._text)
        return self._tok.encode(rest)
