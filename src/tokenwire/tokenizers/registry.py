"""The registry of tokenizer versions: immutable, content-addressed, kept forever.

Each version is stored on disk as `<store>/<sha256>/tokenizer.json` (the artifact clients
download, whose sha256 names the directory) plus `meta.json` (family, aliases, chat template:
what is not part of the id <-> bytes mapping). A server loads every stored version at start, so a
version stays addressable for tokenize/detokenize after no model serves it any more.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TokenizerNotFoundError, UnknownTokenizerVersionError
from .base import VERSION_RE, Tokenizer
from .hf import HFTokenizer

__all__ = ["TokenizerEntry", "TokenizerRegistry"]

log = logging.getLogger(__name__)


@dataclass
class TokenizerEntry:
    tokenizer: Tokenizer
    aliases: set[str] = field(default_factory=set)
    chat_template: str | None = None
    """The chat template of the model this version was registered from, if any."""
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool = False
    models: set[str] = field(default_factory=set)
    """Models served now that read and write this version."""

    @property
    def version(self) -> str:
        return self.tokenizer.version

    @property
    def sha256(self) -> str:
        return self.tokenizer.sha256


class TokenizerRegistry:
    def __init__(self, store: Path | None = None):
        self._store = store
        self._by_version: dict[str, TokenizerEntry] = {}
        self._aliases: dict[str, str] = {}

    def load_store(self) -> int:
        """Register every version kept in the store; returns how many."""
        if self._store is None or not self._store.is_dir():
            return 0
        n = 0
        known = {e.sha256 for e in self._by_version.values()}
        for d in sorted(self._store.iterdir()):
            art, meta_path = d / "tokenizer.json", d / "meta.json"
            if d.name in known or not (art.is_file() and meta_path.is_file()):
                continue
            data = art.read_bytes()
            if hashlib.sha256(data).hexdigest() != d.name:
                log.warning("tokenizer store entry %s does not match its hash; skipped", d)
                continue
            meta = json.loads(meta_path.read_text())
            self.register(
                HFTokenizer(data, family=meta["family"]),
                aliases=meta.get("aliases", []),
                chat_template=meta.get("chat_template"),
                bos_id=meta.get("bos_id"),
                eos_id=meta.get("eos_id"),
                add_bos=meta.get("add_bos", False),
                persist=False,
            )
            n += 1
        return n

    def register(self, tokenizer: Tokenizer, *, aliases: list[str] | tuple[str, ...] = (),
                 chat_template: str | None = None, bos_id: int | None = None,
                 eos_id: int | None = None, add_bos: bool = False,
                 persist: bool = True) -> TokenizerEntry:
        entry = self._by_version.get(tokenizer.version)
        if entry is None:
            entry = TokenizerEntry(tokenizer, chat_template=chat_template, bos_id=bos_id,
                                   eos_id=eos_id, add_bos=add_bos)
            self._by_version[tokenizer.version] = entry
        elif entry.chat_template is None:
            entry.chat_template = chat_template
        for alias in aliases:
            # an alias is a movable pointer: the latest registration wins
            old = self._aliases.get(alias)
            if old is not None and old != tokenizer.version:
                self._by_version[old].aliases.discard(alias)
            self._aliases[alias] = tokenizer.version
            entry.aliases.add(alias)
        if persist:
            self._persist(entry)
        return entry

    def _persist(self, entry: TokenizerEntry) -> None:
        if self._store is None:
            return
        d = self._store / entry.sha256
        d.mkdir(parents=True, exist_ok=True)
        art = d / "tokenizer.json"
        if not art.exists():
            _atomic_write(art, entry.tokenizer.artifact)
        meta = {
            "version": entry.version,
            "family": entry.tokenizer.family,
            "aliases": sorted(entry.aliases),
            "chat_template": entry.chat_template,
            "bos_id": entry.bos_id,
            "eos_id": entry.eos_id,
            "add_bos": entry.add_bos,
        }
        _atomic_write(d / "meta.json", json.dumps(meta, indent=1).encode())

    def resolve(self, name: str, *, param: str | None = "tokenizer_version") -> TokenizerEntry:
        """The entry of a full version id or an alias; 400 unknown_tokenizer_version if none."""
        entry = self.find(name)
        if entry is None:
            hint = "" if VERSION_RE.match(name) else " (expected <family>@sha256:<16 hex>)"
            raise UnknownTokenizerVersionError(
                f"tokenizer version {name!r} is not registered here{hint}; "
                "GET /v1/tokenizers lists the known versions",
                param=param,
            )
        return entry

    def find(self, name: str) -> TokenizerEntry | None:
        return self._by_version.get(self._aliases.get(name, name))

    def get(self, name: str) -> TokenizerEntry:
        """Like `resolve`, for URL paths: 404 when unknown."""
        entry = self.find(name)
        if entry is None:
            raise TokenizerNotFoundError(f"no tokenizer version {name!r}")
        return entry

    def entries(self) -> list[TokenizerEntry]:
        return list(self._by_version.values())


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
