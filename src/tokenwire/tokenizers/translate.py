"""Ids of one tokenizer version -> ids of another, exact to the byte where the target allows.

The ids' bytes are what is translated, not a decoded string: a sequence that ends inside a
UTF-8 character, or holds bytes that are no UTF-8 at all (ids a model sampled can), keeps
those bytes, carried by the target's single-byte tokens (every byte-level BPE has them, and a
SentencePiece vocabulary with byte fallback its `<0xAB>` pieces). So:
- the bytes are cut into valid UTF-8 text and the bytes outside it (`surrogateescape`); each
  run of text is encoded by the target as a text prompt is (typed markers stay text), each
  other byte becomes the target's token of that one byte;
- a control token becomes the target's control token of the same text, which also cuts the
  text there (a prompt's markers and the text between them are encoded apart, as templates
  are); one with no counterpart is its text, encoded with the text around it (or nothing,
  with `skip_special`: output whose text leaves control tokens out);
- `lossless` is true when the target's ids decode to exactly the source's bytes and every
  control token stayed a control token. It is false when the target lacks a byte's token
  (U+FFFD stands in: the texts, decoded with replacement, still agree), a control token had
  no counterpart, or the target's encoding does not round-trip (a normalizer).

`TranslationStream` does the same to ids that arrive in pieces, emitting target ids only where
later ids cannot change them (`IncrementalEncoder`), so concat(push(...) ... finish()) ==
translate(all ids) exactly, wherever the pieces are cut.

Every conversion here counts with reason "translate" (conversions.py): the target's encodes as
the tokenizer records them, and one decode per translation (per stream, per new logprob id).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .base import Tokenizer
from .conversions import conversion_reason, record
from .reencode import IncrementalEncoder

__all__ = ["Translation", "TranslationStream", "Translator", "translator"]

_ESCAPED = re.compile("([\udc80-\udcff])")
_UNSEEN = object()
"""A byte outside valid UTF-8, as `surrogateescape` decodes it."""


@dataclass(frozen=True)
class Translation:
    token_ids: list[int]
    text_bytes: int
    """How many bytes the source ids stand for."""
    lossless: bool


class Translator:
    """Translation from `source` ids to `target` ids (both immutable: build once, reuse)."""

    @conversion_reason("translate")
    def __init__(self, source: Tokenizer, target: Tokenizer):
        self.source = source
        self.target = target
        by_text = target.special_tokens
        self._controls = {i: by_text.get(source.token_bytes(i).decode(errors="replace"))
                          for i in source.special_ids}
        """Each source control token -> the target's of the same text (None: none has it)."""
        byte_ids: dict[int, int] = {}
        for i in range(target.vocab_size):
            b = target.token_bytes(i)
            if len(b) == 1 and i not in target.special_ids:
                byte_ids.setdefault(b[0], i)
        self._byte_ids = byte_ids
        self._replacement = target.encode("\ufffd")
        self._ids: dict[int, int | None] = {}
        """`token_id`'s answers so far (at most one per source id)."""

    def control(self, token_id: int) -> int | None:
        """The target's control token for a source control token, if it has one."""
        return self._controls.get(token_id)

    @conversion_reason("translate")
    def token_id(self, token_id: int) -> int | None:
        """The target's one id for a source token, where one stands for exactly its bytes: a
        control token's counterpart, the target's encoding of the token's text when that is a
        single id, the target's byte token of a lone byte outside UTF-8; else None (its bytes
        take several target ids, or none). What a logprob entry's `id` says in the client's
        version."""
        if token_id in self._controls:
            return self._controls[token_id]
        got = self._ids.get(token_id, _UNSEEN)
        if got is _UNSEEN:
            record("decode")
            data = self.source.token_bytes(token_id)
            try:
                ids = self.target.encode(data.decode("utf-8"))
            except UnicodeDecodeError:
                ids = [self._byte_ids[data[0]]] if len(data) == 1 and data[0] in self._byte_ids \
                    else []
            got = self._ids[token_id] = ids[0] if len(ids) == 1 else None
        return got  # type: ignore[return-value]

    @conversion_reason("translate")
    def translate(self, ids: Sequence[int], *, skip_special: bool = False) -> Translation:
        if ids:
            record("decode")
        out: list[int] = []
        run: list[bytes] = []
        kept = True  # every control token stayed one
        src = self.source
        for t in ids:
            if t in self._controls:
                mapped = self._controls[t]
                if mapped is not None:
                    out += self._encode_bytes(b"".join(run))
                    run = []
                    out.append(mapped)
                    continue
                kept = False
                if skip_special:
                    continue
            run.append(src.token_bytes(t))
        out += self._encode_bytes(b"".join(run))
        data = b"".join(src.token_bytes(t) for t in ids
                        if not (skip_special and t in self._controls
                                and self._controls[t] is None))
        got = b"".join(self.target.token_bytes(t) for t in out)
        return Translation(out, len(data), kept and got == data)

    def stream(self, *, skip_special: bool = False) -> TranslationStream:
        return TranslationStream(self, skip_special=skip_special)

    # -- internals -------------------------------------------------------------------------------

    def _encode_bytes(self, data: bytes) -> list[int]:
        return self._encode_text(data.decode("utf-8", errors="surrogateescape"))

    def _encode_text(self, text: str) -> list[int]:
        """`text` as `surrogateescape` decoded it: text runs encoded, escaped bytes by id."""
        if not _ESCAPED.search(text):
            return self.target.encode(text)
        out: list[int] = []
        for k, part in enumerate(_ESCAPED.split(text)):
            if k % 2 == 0:
                out += self.target.encode(part)
            else:
                out += self.byte_id(ord(part) - 0xDC00)
        return out

    def byte_id(self, byte: int) -> list[int]:
        """The target's ids of one byte outside valid UTF-8 (U+FFFD's if it has no token)."""
        t = self._byte_ids.get(byte)
        return [t] if t is not None else list(self._replacement)


class TranslationStream:
    """`Translator.translate` of ids that arrive in pieces."""

    def __init__(self, translator: Translator, *, skip_special: bool = False):
        self._tr = translator
        self._skip = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self._enc = IncrementalEncoder(translator.target)
        self._counted = False

    @conversion_reason("translate")
    def push(self, ids: Sequence[int]) -> list[int]:
        """Take more source ids; returns the target ids that are final now (maybe none)."""
        tr, src = self._tr, self._tr.source
        if ids and not self._counted:  # one decode per stream, however it is cut
            record("decode")
            self._counted = True
        out: list[int] = []
        pending: list[bytes] = []
        for t in ids:
            if t in tr._controls:
                mapped = tr._controls[t]
                if mapped is not None:
                    out += self._text(b"".join(pending), final=True)
                    pending = []
                    out.append(mapped)
                    continue
                if self._skip:
                    continue
            pending.append(src.token_bytes(t))
        return out + self._text(b"".join(pending), final=False)

    @conversion_reason("translate")
    def finish(self) -> list[int]:
        """The ids of everything not emitted yet (no more ids will come)."""
        return self._text(b"", final=True)

    def _text(self, data: bytes, *, final: bool) -> list[int]:
        text = self._utf8.decode(data, final=final)
        out: list[int] = []
        for k, part in enumerate(_ESCAPED.split(text)):
            if k % 2 == 0:
                if part:
                    out += self._enc.push(part)
            else:
                # a byte outside UTF-8 ends the run of text before it, as in `translate`
                out += self._enc.finish()
                out += self._tr.byte_id(ord(part) - 0xDC00)
        if final:
            out += self._enc.finish()
        return out


_BUILT: dict[tuple[str, str], Translator] = {}
_KEEP = 32


def translator(source: Tokenizer, target: Tokenizer) -> Translator:
    """The translator of a pair of versions, built once (it reads the target's vocabulary);
    versions are immutable, so their ids are the key."""
    key = (source.version, target.version)
    tr = _BUILT.get(key)
    if tr is None:
        if len(_BUILT) >= _KEEP:
            del _BUILT[next(iter(_BUILT))]
        tr = _BUILT[key] = Translator(source, target)
    return tr
