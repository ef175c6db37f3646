"""llama.cpp's BPE pre-tokenizers, as regexes the `tokenizers` library runs.

Each entry is what `llm_tokenizer_bpe` (llama.cpp `src/llama-vocab.cpp`, the llama.cpp that
llama-cpp-python 0.3.36 vendors) splits a text with for one `tokenizer.ggml.pre`: its regexes,
applied one after another (each splits the pieces of the one before, keeping what it matched and
what lay between), and whether a piece that is a whole vocabulary entry skips the merges
(`ignore_merges`). Where llama.cpp adapted a model's own regex, the adapted one is what runs
there, so it is the one here: `(?i:'s|...)` became `'[sS]|...` (ASCII letters only: "'ſ" is no
contraction to llama.cpp, but is to Oniguruma's case folding). Regexes are Oniguruma's syntax; the
few places where it reads a regex unlike C++'s std::regex cannot occur in the pieces they see
(`\\s+$` only ever sees pieces without a newline: `[\\r\\n]` splits those off first).

A pre-tokenizer not listed here is refused by name (gguf.py): listing one takes its regexes from
llama-vocab.cpp and a test on llama.cpp's ids (tests/tokenizers/test_gguf_families.py).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PRE_TOKENIZERS", "PreTokenizer"]


@dataclass(frozen=True)
class PreTokenizer:
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    """A piece that is itself a vocabulary entry is that entry (llama.cpp's LLAMA3 family)."""


_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# GPT-2's own regex; llama.cpp's lacks the last `|\s+`, which splits the same (whitespace that
# no alternative matches is a piece of its own either way)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek's own character classes (letters by script, CJK and Hangul), as llama.cpp spells them
# (escaped: several of these code points have NFC forms an editor would silently substitute)
_DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
    "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)
# llama.cpp matches these with the text's non-ASCII whitespace replaced by "\v" (std::regex's
# `\s` knows only ASCII), so a space character inside a class never matches there: the classes
# here leave them out (U+1680, U+2000-200A, U+2028-2029, U+202F, U+205F, U+3000)
_DEEPSEEK_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3001-\u3002]+"
_DEEPSEEK_CJK = ("[\u4e00-\u9fa5\u0800-\u167f\u1681-\u1fff\u200b-\u2027\u202a-\u202e"
                 "\u2030-\u205e\u2060-\u2fff\u3001-\u4e00\uac00-\ud7ff]+")

_STARCODER = PreTokenizer((r"\p{N}", _GPT2))
_GPT2_PRE = PreTokenizer((_GPT2,))
_QWEN2_PRE = PreTokenizer((_QWEN2,))
_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True)

#: `tokenizer.ggml.pre` -> how llama.cpp pre-tokenizes (the names it maps to one type share one)
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "gpt-2": _GPT2_PRE, "phi-2": _GPT2_PRE, "mpt": _GPT2_PRE, "olmo": _GPT2_PRE,
    "starcoder": _STARCODER, "refact": _STARCODER, "smollm": _STARCODER,
    "command-r": _STARCODER, "codeshell": _STARCODER, "exaone": _STARCODER,
    "qwen2": _QWEN2_PRE, "deepseek-r1-qwen": _QWEN2_PRE, "stablelm2": _QWEN2_PRE,
    "qwen35": PreTokenizer((_QWEN35,)),
    "llama-bpe": _LLAMA3_PRE, "llama3": _LLAMA3_PRE, "llama-v3": _LLAMA3_PRE,
    "falcon3": _LLAMA3_PRE, "dbrx": PreTokenizer((_LLAMA3,)), "smaug-bpe": PreTokenizer((_LLAMA3,)),
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    "deepseek-llm": PreTokenizer((r"[\r\n]", _DEEPSEEK_LETTERS, _DEEPSEEK_PUNCT, r"\s+$",
                                  _DEEPSEEK_CJK, r"\p{N}+")),
    "deepseek-coder": PreTokenizer((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DEEPSEEK_CJK,
                                    r"\p{N}")),
}
