"""Build a portable tokenizer.json from a GGUF file's tokenizer metadata.

The result must give exactly the ids llama.cpp gives for the same model (tests/tokenizers prove
it on llama.cpp's own vocabulary files for every family: docs/engines.md), so each piece mirrors
llama.cpp's `llama-vocab.cpp`: for byte-level BPE (`gpt2`), the pre-tokenizer regexes of the
file's `tokenizer.ggml.pre` (_pretokenizers.py) and its merges; for SentencePiece (`llama`:
Llama 2, Mistral, Phi-3, Gemma 3), spaces as "▁", its dummy prefix, merges ranked by the pieces'
scores and byte fallback; for Gemma 4 (`gemma4`), BPE merges over "▁"-spaced UTF-8; for all,
tokens typed as llama.cpp types them: control tokens as special added tokens (never matched in
plain text; matched in chat-template structure) and user-defined tokens as added tokens matched
everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import UnsupportedTokenizerError
from ._gguf import read_metadata
from ._pretokenizers import PRE_TOKENIZERS
from ._source import TokenizerSource, legacy_family
from .base import make_version
from .chat_templates import fallback_template
from .hf import HFTokenizer, canonical_json

__all__ = ["UnsupportedTokenizerError", "tokenizer_from_gguf"]

# llama.cpp token types (enum llama_token_type)
_UNKNOWN = 2
_CONTROL = 3
_USER_DEFINED = 4
#: token types llama.cpp matches in text before it pre-tokenizes (user-defined ones always,
#: the others only when special tokens are parsed)
_SPECIAL = {_UNKNOWN: True, _CONTROL: True, _USER_DEFINED: False}

#: texts llama.cpp makes control tokens whatever the file says (its end-of-turn, end-of-generation
#: and fill-in-the-middle markers, found by name in llama_vocab::impl::load)
_CONTROL_BY_TEXT = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<｜end▁of▁sentence｜>",
    "<end_of_utterance>", "<|eom_id|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "</s>", "<eos>", "<turn|>", "<|tool_response>", "[e~[",
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
    "▁<PRE>", "<|code_prefix|>", "<|prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
    "▁<SUF>", "<|code_suffix|>", "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
    "▁<MID>", "<|code_middle|>", "<|middle|>",
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
})
#: gpt-oss's markers, which llama.cpp makes user-defined so that they are always rendered
_USER_DEFINED_BY_TEXT = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})
_BY_TEXT = _CONTROL_BY_TEXT | _USER_DEFINED_BY_TEXT


def _token_types(meta: dict[str, Any], tokens: list[str]) -> list[int]:
    """Each token's type as llama.cpp uses it: the file's, with its overrides by text. (Of two
    fill-in-the-middle spellings in one vocabulary, CodeLlama's `<PRE>` and `▁<PRE>`, llama.cpp
    makes only the first it finds a control token; here both are: no vocabulary file has two.)"""
    types: list[int] = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    ids = {t: i for i, t in enumerate(tokens) if t in _BY_TEXT}
    for text, i in ids.items():
        if text in _USER_DEFINED_BY_TEXT:
            types[i] = _USER_DEFINED
        elif types[i] != _UNKNOWN:
            types[i] = _CONTROL
    # gpt-oss and Solar Open end a message with "<|end|>" but keep generating: llama.cpp makes it
    # user-defined there; where "<|tool_response>" (Gemma 4) or "<|plamo:eos|>" ends a turn,
    # "</s>" is plain text
    has_call = "<|call|>" in ids or "<|calls|>" in ids
    if "<|end|>" in ids and has_call and ("<|return|>" in ids or "<|flush|>" in ids):
        types[ids["<|end|>"]] = _USER_DEFINED
    if "</s>" in ids and ("<|tool_response>" in ids or "<|plamo:eos|>" in tokens):
        types[ids["</s>"]] = 1
    return types


def _split(pattern: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
               "use_regex": False}


def _rstrip_ids(meta: dict[str, Any], tokens: list[str], types: list[int]) -> set[int]:
    """Tokens after which llama.cpp drops whitespace: for Phi-3 it sets RSTRIP on every special
    token but a few, by the model's name (llama_vocab::impl::load)."""
    name = str(meta.get("general.name", "")).lower()
    if "phi-3" not in name and "phi3" not in name:
        return set()
    out = {i for i, t in enumerate(types) if t in _SPECIAL}
    out |= {i for i, t in enumerate(tokens) if t == "</s>"}
    return {i for i in out if tokens[i] not in ("<unk>", "<s>", "<|endoftext|>")}


def _added_tokens(meta: dict[str, Any], tokens: list[str],
                  types: list[int]) -> list[dict[str, Any]]:
    rstrip = _rstrip_ids(meta, tokens, types)
    return [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False,
         "rstrip": i in rstrip, "normalized": False, "special": _SPECIAL[types[i]]}
        for i in range(len(tokens))
        if types[i] in _SPECIAL
    ]


def _spec(meta: dict[str, Any], merges: list[list[str]], *, normalizer: Any,
          pre_tokenizer: Any, decoder: Any, unk_token: str | None = None, fuse_unk: bool = False,
          byte_fallback: bool = False, ignore_merges: bool = False) -> dict[str, Any]:
    """The tokenizer.json of a BPE model over the file's tokens (every builder's shape): its
    added tokens typed as llama.cpp types them, the rest as each family needs."""
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(meta, tokens, _token_types(meta, tokens)),
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": decoder,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unk_token,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": fuse_unk,
            "byte_fallback": byte_fallback,
            "ignore_merges": ignore_merges,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
    }


def _merges(merges: list[str]) -> list[list[str]]:
    """GGUF's "a b" merges as tokenizer.json's pairs."""
    return [m.split(" ", 1) for m in merges]


def _bpe(meta: dict[str, Any]) -> dict[str, Any]:
    name = meta.get("tokenizer.ggml.pre", "default")
    pre = PRE_TOKENIZERS.get(name)
    if pre is None:
        raise UnsupportedTokenizerError(
            f"BPE pre-tokenizer {name!r} has no portable equivalent yet (llama.cpp's regexes for "
            f"it are not expressed for the tokenizers library; supported: "
            f"{', '.join(sorted(PRE_TOKENIZERS))}); serve it behind a gateway with its own "
            "tokenizer.json (--tokenizer)")
    return _spec(
        meta, _merges(meta.get("tokenizer.ggml.merges", [])), normalizer=None,
        pre_tokenizer={"type": "Sequence",
                       "pretokenizers": [*(_split(p) for p in pre.regexes), _BYTE_LEVEL]},
        decoder={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                 "use_regex": False},
        ignore_merges=pre.ignore_merges)


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


_SPM_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": _SPACE}, "content": " "},
    {"type": "ByteFallback"},
    {"type": "Fuse"},
]}
# llama.cpp escapes only the space (other whitespace stays as it is)
_ESCAPE_SPACE = {"type": "Replace", "pattern": {"String": " "}, "content": _SPACE}


def _spm(meta: dict[str, Any]) -> dict[str, Any]:
    if meta.get("tokenizer.ggml.remove_extra_whitespaces", False):
        raise UnsupportedTokenizerError(
            "SentencePiece with tokenizer.ggml.remove_extra_whitespaces has no portable "
            "equivalent yet (llama.cpp collapses whitespace runs its own way; no vocabulary "
            "test file has it)")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    scores: list[float] = meta.get("tokenizer.ggml.scores", [0.0] * len(tokens))
    unk = meta.get("tokenizer.ggml.unknown_token_id", 0)
    normalizer: dict[str, Any] = _ESCAPE_SPACE
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        # llama.cpp's dummy prefix: a space before the text at the start and after every token
        # it matched in the text (special or user-defined); the tokenizers library normalizes
        # each stretch of text between added tokens on its own, so a Prepend does the same
        normalizer = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": _SPACE}, _ESCAPE_SPACE]}
    return _spec(meta, _spm_merges(tokens, scores), normalizer=normalizer, pre_tokenizer=None,
                 decoder=_SPM_DECODER, unk_token=tokens[unk] if 0 <= unk < len(tokens) else None,
                 fuse_unk=True, byte_fallback=True)


def _gemma4(meta: dict[str, Any]) -> dict[str, Any]:
    """Gemma 4: BPE merges over raw UTF-8 with spaces as "▁" (SentencePiece's pieces), the text
    split only at newlines, `<0xXX>` byte tokens for what no piece covers (llama.cpp's
    LLAMA_VOCAB_PRE_TYPE_GEMMA4)."""
    return _spec(meta, _merges(meta["tokenizer.ggml.merges"]), normalizer=_ESCAPE_SPACE,
                 pre_tokenizer=_split(r"[^\n]+|[\n]+"), decoder=_SPM_DECODER, byte_fallback=True)


#: `tokenizer.ggml.model` -> builder of the tokenizer.json structure
_BUILDERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "gpt2": _bpe,
    "llama": _spm,
    "gemma4": _gemma4,
}

#: `tokenizer.ggml.pre` values after which llama.cpp adds BOS when the file does not say
_BOS_BY_DEFAULT = {"llama-bpe", "llama3", "llama-v3", "falcon3"}


def _add_bos(meta: dict[str, Any]) -> bool:
    """llama.cpp's default for `tokenizer.ggml.add_bos_token` when a file has none: true for
    SentencePiece and the Llama 3 pre-tokenizer."""
    default = (meta.get("tokenizer.ggml.model") == "llama"
               or meta.get("tokenizer.ggml.pre") in _BOS_BY_DEFAULT)
    return bool(meta.get("tokenizer.ggml.add_bos_token", default))


def tokenizer_from_gguf(path: str | Path) -> TokenizerSource:
    meta = read_metadata(path)
    kind = meta.get("tokenizer.ggml.model")
    builder = _BUILDERS.get(str(kind))
    if builder is None:
        raise UnsupportedTokenizerError(
            f"tokenizer model {kind!r} is not supported (tokenwire builds {', '.join(_BUILDERS)}: "
            "the generative families; WordPiece ('bert'), Unigram ('t5') and RWKV vocabularies "
            "would each need a builder and llama.cpp's vectors to test it on)")
    spec = builder(meta)
    arch = meta.get("general.architecture")
    tok = HFTokenizer(canonical_json(spec))  # its family: from its content, as a directory's
    base = meta.get("general.basename") or meta.get("general.name") or kind
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    return TokenizerSource(
        tokenizer=tok,
        chat_template=meta.get("tokenizer.chat_template") or fallback_template(arch),
        bos_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_id=meta.get("tokenizer.ggml.eos_token_id"),
        add_bos=_add_bos(meta),
        context_length=meta.get(f"{arch}.context_length") if arch else None,
        name=meta.get("general.name"),
        legacy_version=make_version(legacy_family(str(base), n_vocab), tok.sha256),
    )
