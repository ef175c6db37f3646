"""Tokenizer versions: the protocol, fingerprints, the registry, sources (GGUF, Hugging Face),
probes."""

from .base import VERSION_RE, Tokenizer, make_version, version_hash
from .fingerprint import Fingerprint
from .gguf import UnsupportedTokenizerError, tokenizer_from_gguf
from .hf import HFTokenizer
from .probe import PROBE_CORPUS, TokenizerParityError
from .registry import TokenizerEntry, TokenizerRegistry
from .source import TokenizerSource, TokenizerSourceError, load_hf_dir, load_tokenizer

__all__ = [
    "VERSION_RE",
    "Fingerprint",
    "HFTokenizer",
    "PROBE_CORPUS",
    "Tokenizer",
    "TokenizerEntry",
    "TokenizerParityError",
    "TokenizerRegistry",
    "TokenizerSource",
    "TokenizerSourceError",
    "UnsupportedTokenizerError",
    "load_hf_dir",
    "load_tokenizer",
    "make_version",
    "tokenizer_from_gguf",
    "version_hash",
]
