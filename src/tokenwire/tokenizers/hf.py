"""A tokenizer version backed by a Hugging Face `tokenizers` artifact (tokenizer.json).

The artifact is what the server publishes, so serving from it means clients that load the same
bytes get exactly the server's ids. The bytes of each id are computed once from the vocabulary
(byte-level BPE, or SentencePiece pieces with byte fallback), so decoding is a join.

The artifact is read in two modes. Text (a prompt, a message's content) is encoded with the
`tokenizers` settings in `text_encoding`, which the artifact cannot carry (`tokenizer.json` has
no field for them) and so are published beside it; a chat template's own text is encoded with
the library's defaults, which parse control-token strings.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from .base import make_version
from .conversions import record
from .fingerprint import Fingerprint, family_of, fingerprint

__all__ = ["HFTokenizer", "canonical_json"]


def canonical_json(obj: Any) -> bytes:
    """One byte string per JSON value: the artifact's bytes, and so its hash, are reproducible."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1))
    bs += list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_BYTE_DECODER = _byte_decoder()


def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (what byte-level BPE pieces spell)."""
    return {b: c for c, b in _BYTE_DECODER.items()}


def _piece_bytes(model: dict[str, Any], piece: str) -> bytes:
    if model["type"] == "BPE" and not model.get("byte_fallback"):
        # a character outside GPT-2's byte alphabet (Command R's vocabulary has some) is its own
        # UTF-8, as the ByteLevel decoder of the tokenizers library reads it
        return b"".join(bytes([_BYTE_DECODER[c]]) if c in _BYTE_DECODER else c.encode()
                        for c in piece)
    # SentencePiece-style: "▁" is a space, "<0xAB>" is one raw byte
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode()


_SP_SPACE = "\u2581"
_INNER_SPACE = re.compile("[^\u2581]\u2581")
"""A SentencePiece piece with a (visible) space after another character."""
_SPACE_WORD = re.compile(r" *[^ ]+| +")
"""A segment of `HFTokenizer._space_words`: spaces, then the characters up to the next space."""

_LONG_TEXT = 4096
"""Characters beyond which `encode` releases the GIL while it works."""


class HFTokenizer:
    """Implements `Tokenizer` over the bytes of a tokenizer.json."""

    fingerprint: Fingerprint
    """What the version hashes (`fingerprint.py`): the same for every artifact of one tokenizer."""

    def __init__(self, artifact: bytes, *, family: str | None = None,
                 encode_special_tokens: bool = True, add_special_tokens: bool = False):
        """`family`: the readable half of the version; None (the servers' way) names it from
        the content (`fingerprint.family_of`), never from a file or folder name.
        `encode_special_tokens`, `add_special_tokens`: the text mode (`text_encoding`); the
        defaults are the server's, a client applies what the server publishes. Neither
        changes the version."""
        self.artifact = artifact
        self.sha256 = hashlib.sha256(artifact).hexdigest()
        spec = json.loads(artifact)
        # two instances: one keeps control-token strings as text, one parses them (templates)
        self._plain = _HFTokenizer.from_str(artifact.decode())
        self._add_special = add_special_tokens
        self._special = _HFTokenizer.from_str(artifact.decode())
        vocab: dict[str, int] = spec["model"]["vocab"]
        if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            vocab = {p: i for i, (p, _) in enumerate(vocab)}
        added = {t["id"]: t for t in spec.get("added_tokens", [])}
        size = max([*vocab.values(), *added.keys()]) + 1
        strs = [""] * size
        for piece, i in vocab.items():
            strs[i] = piece
        self._strs = strs
        table: list[bytes] = []
        for i, piece in enumerate(strs):
            if i in added:
                table.append(added[i]["content"].encode())
            else:
                table.append(_piece_bytes(spec["model"], piece))
        self._bytes = table
        self._special_ids = frozenset(i for i, t in added.items() if t.get("special"))
        self._special_by_text = {added[i]["content"]: i for i in self._special_ids}
        self._plain.encode_special_tokens = True  # the fingerprint's plain mode, whatever ours
        self.fingerprint = fingerprint(spec, table, plain=self._plain, parsing=self._special)
        self._plain.encode_special_tokens = encode_special_tokens
        self._model_type = str(spec["model"]["type"])
        self._family = family or family_of(self.fingerprint, self._model_type, size)
        self._version = make_version(self._family, self.fingerprint.digest)

    @property
    def version(self) -> str:
        return self._version

    def labelled(self, family: str | None) -> HFTokenizer:
        """This tokenizer under another family (None: named from its content), sharing all
        else: the family is a label, not part of what the version identifies."""
        twin = copy.copy(self)
        twin._family = family or family_of(self.fingerprint, self._model_type, self.vocab_size)
        twin._version = make_version(twin._family, self.fingerprint.digest)
        return twin

    @property
    def family(self) -> str:
        return self._family

    @property
    def vocab_size(self) -> int:
        return len(self._bytes)

    @property
    def text_encoding(self) -> dict[str, bool]:
        """How `encode` reads text with the artifact, as `tokenizers` names it: the attribute
        `encode_special_tokens` (true: a typed `<|im_end|>` is text, never the control token)
        and the `encode` argument `add_special_tokens` (false: no post-processor; a prompt's
        BOS is the caller's to add)."""
        return {"encode_special_tokens": self._plain.encode_special_tokens,
                "add_special_tokens": self._add_special}

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    def special_id(self, text: str) -> int | None:
        """The id of a control token spelled `text`, if there is one."""
        return self._special_by_text.get(text)

    def encode(self, text: str, *, parse_special: bool = False) -> list[int]:
        if not text:
            return []
        record("encode")
        tok = self._special if parse_special else self._plain
        add = self._add_special and not parse_special
        if len(text) > _LONG_TEXT:
            # `encode` holds the GIL throughout (~70 ms per 100k characters here), the batch
            # call releases it: a long prompt planned off the event loop then stalls nothing
            return tok.encode_batch([text], add_special_tokens=add)[0].ids
        return tok.encode(text, add_special_tokens=add).ids

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of `text` with control tokens parsed, and each one's (start, end) character
        offsets in it (a rendered prompt's contents are found by them)."""
        if not text:
            return [], []
        record("encode")
        enc = self._special.encode_batch([text], add_special_tokens=False)[0]
        return enc.ids, enc.offsets

    def encode_segments(self, segments: Sequence[str]) -> list[int]:
        """The ids of text already cut into pre-tokenizer segments, each encoded on its own
        (a segment's ids do not depend on what follows it; its re-split alone might)."""
        if not segments:
            return []
        record("encode")
        return self._plain.encode(list(segments), is_pretokenized=True,
                                  add_special_tokens=False).ids

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        if ids:  # as `encode`: nothing converted, nothing counted
            record("decode")
        return self._join(ids)

    def decode(self, ids: Sequence[int]) -> str:
        if ids:
            record("decode")
        return self._join(ids).decode("utf-8", errors="replace")

    def _join(self, ids: Sequence[int]) -> bytes:
        table = self._bytes
        return b"".join([table[i] for i in ids])

    def token_str(self, token_id: int) -> str:
        return self._strs[token_id]

    def pre_tokenize(self, text: str) -> list[tuple[int, int]]:
        """The (start, end) character offsets of the segments BPE encodes one by one."""
        pre = self._plain.pre_tokenizer
        if pre is None:
            if self._space_words is not None:
                return self._space_segments(text, self._space_words)
            return [(0, len(text))] if text else []
        return [span for _, span in pre.pre_tokenize_str(text)]

    @cached_property
    def segment_local(self) -> bool:
        """Is encode(a + b) == encode(a) + encode(b) whenever a ends at a segment boundary?
        True for byte-level BPE without a normalizer (the GGUF-built artifacts), and for the
        SentencePiece BPE of `_space_words`; not for other normalizers or a SentencePiece
        prefix that only the first word gets."""
        if self._space_words is not None:
            return True
        spec = json.loads(self.artifact)
        pre = spec.get("pre_tokenizer") or {}
        kinds = [p.get("type") for p in pre.get("pretokenizers", [pre])]
        return (spec.get("normalizer") is None and spec["model"]["type"] == "BPE"
                and bool(kinds) and all(k in ("Split", "ByteLevel", "Digits") for k in kinds)
                and not any(p.get("add_prefix_space") for p in pre.get("pretokenizers", [pre])))

    @cached_property
    def _space_words(self) -> tuple[str, ...] | None:
        """SentencePiece BPE as the GGUF-built artifacts have it (spaces made "▁", no
        pre-tokenizer, no dummy prefix). A token can span a point where a space follows another
        character only if its piece has "▁" after another character: of Gemma 3's 262k pieces
        one does (`>▁</`). So the text is cut before each run of spaces that follows a character
        (`_SPACE_WORD`), except inside an occurrence of such a piece's text; BPE merges then
        never cross a cut, and the pieces encode one by one exactly as the whole. Returns those
        pieces' texts; None where the artifact is not of this kind, or where such a piece spans
        more than one cut (the incremental encoder holds back only two segments)."""
        spec = json.loads(self.artifact)
        norm = spec.get("normalizer") or {}
        if not (spec.get("pre_tokenizer") is None and spec["model"]["type"] == "BPE"
                and norm.get("type") == "Replace" and norm.get("content") == _SP_SPACE
                and norm.get("pattern") == {"String": " "}):
            return None
        spanning = [p for p in self._strs if _INNER_SPACE.search(p)]
        if any(len(_INNER_SPACE.findall(p)) > 1 for p in spanning):
            return None
        return tuple(sorted({p.replace(_SP_SPACE, " ") for p in spanning}))

    def _space_segments(self, text: str, spanning: tuple[str, ...]) -> list[tuple[int, int]]:
        spans = [m.span() for m in _SPACE_WORD.finditer(text)]
        inside: set[int] = set()  # no cut inside an occurrence of a piece that spans one
        for piece in spanning:
            i = text.find(piece)
            while i >= 0:
                inside.update(range(i + 1, i + len(piece)))
                i = text.find(piece, i + 1)
        if not inside:
            return spans
        out: list[tuple[int, int]] = []
        for a, b in spans:
            if out and a in inside:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        return out

    @cached_property
    def special_tokens(self) -> dict[str, int]:
        return dict(sorted(self._special_by_text.items(), key=lambda kv: kv[1]))

    def __repr__(self) -> str:
        return f"HFTokenizer({self._version!r}, vocab_size={self.vocab_size})"
