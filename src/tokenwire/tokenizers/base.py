"""The `Tokenizer` protocol: what serving code may ask of a tokenizer version."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["VERSION_RE", "Tokenizer", "make_version", "version_hash"]

#: `<family>@sha256:<first 16 hex of the tokenizer's fingerprint>` (`fingerprint.py`); ids an
#: earlier release issued have the same shape, with the hash of their artifact's bytes
VERSION_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*@sha256:[0-9a-f]{16}$")


def make_version(family: str, sha256_hex: str) -> str:
    return f"{family}@sha256:{sha256_hex[:16]}"


def version_hash(version: str) -> str | None:
    """The 16 hex digits of a full version id (what identifies it; the family is a label),
    None for anything else (an alias)."""
    return version.rpartition("@sha256:")[2] if VERSION_RE.match(version) else None


@runtime_checkable
class Tokenizer(Protocol):
    """One immutable tokenizer version (id <-> bytes mapping)."""

    @property
    def version(self) -> str:
        """The id, e.g. `smollm2-49k@sha256:cb25111eba2751ff`: the same for every artifact
        of one tokenizer (from a GGUF or a Hugging Face directory), another for any other."""
        ...

    @property
    def family(self) -> str: ...

    @property
    def artifact(self) -> bytes:
        """The tokenizer.json this version is served from: what is stored and published, so a
        client that loads it gets exactly the server's ids."""
        ...

    @property
    def sha256(self) -> str:
        """The full sha256 (hex) of `artifact` (names the bytes; versions before the
        fingerprint carried its first 16 digits, and still resolve by them)."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def text_encoding(self) -> dict[str, bool]:
        """The `tokenizers` settings under which the artifact encodes text as `encode` does
        (published in `GET /v1/tokenizers/{id}`: the artifact cannot carry them)."""
        ...

    @property
    def special_ids(self) -> frozenset[int]:
        """Control tokens (chat markers, BOS/EOS, ...): never produced by encoding plain text."""
        ...

    @property
    def special_tokens(self) -> dict[str, int]:
        """The control tokens by their text (`<|im_start|>` -> its id), as published in
        `GET /v1/tokenizers/{id}` and parsed out of rendered templates."""
        ...

    def encode(self, text: str, *, parse_special: bool = False) -> list[int]:
        """Ids of `text`; with `parse_special`, control-token strings become control tokens."""
        ...

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids of `text` with control tokens parsed, each with its character offsets."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one id stands for (control tokens: their text)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` (invalid UTF-8 replaced by U+FFFD)."""
        ...

    def token_str(self, token_id: int) -> str:
        """The vocabulary entry of an id, as the tokenizer spells it (e.g. `Ġthe`)."""
        ...
