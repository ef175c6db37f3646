"""Build a portable tokenizer.json from a GGUF file's tokenizer metadata.

The result must give exactly the ids llama.cpp gives for the same model (tests/tokenizers prove
it on a corpus), so each piece mirrors llama.cpp's `llama-vocab.cpp`: for byte-level BPE
(`gpt2`), the pre-tokenizer regexes of the file's `tokenizer.ggml.pre` and its merges; for
SentencePiece (`llama`: Gemma, Llama 2), spaces as "▁", merges ranked by the pieces' scores and
byte fallback; for both, control tokens as special added tokens (never matched in plain text;
matched in chat-template structure) and user-defined tokens as added tokens matched everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import UnsupportedTokenizerError
from ._gguf import read_metadata
from .base import make_version
from .chat_templates import fallback_template
from .hf import HFTokenizer, canonical_json
from .source import TokenizerSource, legacy_family

__all__ = ["UnsupportedTokenizerError", "tokenizer_from_gguf"]

# llama.cpp token types (enum llama_token_type)
_CONTROL = 3
_USER_DEFINED = 4

_GPT2_REGEX = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)


def _split(pattern: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
               "use_regex": False}

#: `tokenizer.ggml.pre` -> the regexes llama.cpp splits with, in order (llama-vocab.cpp)
_BPE_PRE: dict[str, list[str]] = {
    "smollm": [r"\p{N}", _GPT2_REGEX],
    "starcoder": [r"\p{N}", _GPT2_REGEX],
    "refact": [r"\p{N}", _GPT2_REGEX],
    "gpt-2": [_GPT2_REGEX],
}


def _added_tokens(tokens: list[str], types: list[int]) -> list[dict[str, Any]]:
    return [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": types[i] == _CONTROL}
        for i in range(len(tokens))
        if types[i] in (_CONTROL, _USER_DEFINED)
    ]


def _bpe(meta: dict[str, Any]) -> dict[str, Any]:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _BPE_PRE:
        raise UnsupportedTokenizerError(
            f"BPE pre-tokenizer {pre!r} has no portable equivalent yet "
            f"(supported: {', '.join(sorted(_BPE_PRE))})"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges: list[str] = meta.get("tokenizer.ggml.merges", [])
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(tokens, types),
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [*(_split(p) for p in _BPE_PRE[pre]), _BYTE_LEVEL],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [m.split(" ", 1) for m in merges],
        },
    }


_SPACE = "\u2581"  # SentencePiece's visible space


def _spm_merges(tokens: list[str], scores: list[float]) -> list[list[str]]:
    """llama.cpp's SentencePiece tokenizer merges, from characters up, the adjacent pair whose
    joined text is the vocabulary piece of highest score. As BPE merges: every split of every
    piece into two pieces, ranked by the joined piece's score (ties: the split's ids, as
    `transformers`' SentencePiece extractor orders them)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, i in vocab.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            li, ri = vocab.get(left), vocab.get(right)
            if li is not None and ri is not None:
                ranked.append((-scores[i], li, ri, left, right))
    ranked.sort()
    return [[left, right] for _, _, _, left, right in ranked]


def _spm(meta: dict[str, Any]) -> dict[str, Any]:
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        # llama.cpp then adds "▁" before the text after every token (a dummy prefix): no model
        # shipped with tokenwire does, so none is tested against llama.cpp yet
        raise UnsupportedTokenizerError(
            "SentencePiece with a dummy space prefix (tokenizer.ggml.add_space_prefix) has no "
            "portable equivalent yet")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    scores: list[float] = meta.get("tokenizer.ggml.scores", [0.0] * len(tokens))
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(tokens, types),
        # llama.cpp escapes only the space (other whitespace stays as it is)
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": _SPACE},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": _SPACE}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": tokens[unk] if unk is not None else None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": _spm_merges(tokens, scores),
        },
    }


#: `tokenizer.ggml.model` -> builder of the tokenizer.json structure
_BUILDERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "gpt2": _bpe,
    "llama": _spm,
}


def tokenizer_from_gguf(path: str | Path) -> TokenizerSource:
    meta = read_metadata(path)
    kind = meta.get("tokenizer.ggml.model")
    builder = _BUILDERS.get(str(kind))
    if builder is None:
        raise UnsupportedTokenizerError(f"tokenizer model {kind!r} is not supported yet")
    spec = builder(meta)
    arch = meta.get("general.architecture")
    tok = HFTokenizer(canonical_json(spec))  # its family: from its content, as a directory's
    base = meta.get("general.basename") or meta.get("general.name") or meta["tokenizer.ggml.pre"]
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    return TokenizerSource(
        tokenizer=tok,
        chat_template=meta.get("tokenizer.chat_template") or fallback_template(arch),
        bos_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_id=meta.get("tokenizer.ggml.eos_token_id"),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        context_length=meta.get(f"{arch}.context_length") if arch else None,
        name=meta.get("general.name"),
        legacy_version=make_version(legacy_family(str(base), n_vocab), tok.sha256),
    )
