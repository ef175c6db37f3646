"""Tokenizer versions: the protocol, the registry, and portable artifacts built from GGUF."""

from .base import VERSION_RE, Tokenizer, make_version
from .gguf import GGUFTokenizerInfo, UnsupportedTokenizerError, tokenizer_from_gguf
from .hf import HFTokenizer
from .registry import TokenizerEntry, TokenizerRegistry

__all__ = [
    "VERSION_RE",
    "GGUFTokenizerInfo",
    "HFTokenizer",
    "Tokenizer",
    "TokenizerEntry",
    "TokenizerRegistry",
    "UnsupportedTokenizerError",
    "make_version",
    "tokenizer_from_gguf",
]
