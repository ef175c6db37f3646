"""The registry of tokenizer versions: immutable, kept forever, found by every id they had.

A version id is `<family>@sha256:<16 hex>` (`fingerprint.py`): the hash identifies it, the
family is a label. An entry also answers to its legacy ids: each artifact registered for it
gives one (a version id was `<family>@sha256:<first 16 hex of the artifact's sha256>` before
the fingerprint, its family a folder's or file's name: so only the hash is matched), and so
does every id it was issued under before. Two artifacts of one tokenizer (the tokenizer.json
built from a GGUF, and another spelling of it) are one entry: the first registered keeps
serving its bytes, the other's id becomes a legacy one.

Each version is stored on disk as `<store>/<sha256>/tokenizer.json` (the artifact clients
download, whose sha256 names the directory) plus `meta.json` (its version, family, legacy
ids, aliases, chat template: what is not part of the id <-> bytes mapping). A server loads
every stored version at start, so a version stays addressable for tokenize/detokenize after no
model serves it any more. A store written before the fingerprint loads as it is: each entry's
version is computed from its bytes, and the id it had is a legacy one.
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
from .base import VERSION_RE, Tokenizer, make_version, version_hash
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
    legacy: set[str] = field(default_factory=set)
    """Other ids of this version, found by their hashes: each artifact's id before the
    fingerprint (`<family>@sha256:<its sha256>`), ids it was issued under before. Data
    stored then (documents) names these."""

    @property
    def version(self) -> str:
        return self.tokenizer.version

    @property
    def sha256(self) -> str:
        return self.tokenizer.sha256


class TokenizerRegistry:
    def __init__(self, store: Path | None = None):
        self._store = store
        self._entries: dict[str, TokenizerEntry] = {}
        """By the hash of their version, in the order registered."""
        self._by_hash: dict[str, TokenizerEntry] = {}
        """Every hash an entry answers to: its version's and its legacy ones."""
        self._aliases: dict[str, str] = {}

    def load_store(self) -> int:
        """Register every version kept in the store; returns how many directories it read
        (two artifacts of one tokenizer, stored by an earlier release, make one entry)."""
        if self._store is None or not self._store.is_dir():
            return 0
        n = 0
        for d in sorted(self._store.iterdir()):
            art, meta_path = d / "tokenizer.json", d / "meta.json"
            if d.name[:16] in self._by_hash or not (art.is_file() and meta_path.is_file()):
                continue
            data = art.read_bytes()
            if hashlib.sha256(data).hexdigest() != d.name:
                log.warning("tokenizer store entry %s does not match its hash; skipped", d)
                continue
            meta = json.loads(meta_path.read_text())
            # the id it was issued under (before the fingerprint: `<family>@sha256:<d.name>`)
            legacy = [v for v in [meta.get("version"), *meta.get("legacy", [])]
                      if isinstance(v, str)]
            # a family recorded since the fingerprint is the one its id was issued with; one
            # recorded before was a folder's or a file's name, and is named afresh
            family = meta.get("family") if "legacy" in meta else None
            self.register(
                HFTokenizer(data, family=family),
                aliases=meta.get("aliases", []),
                chat_template=meta.get("chat_template"),
                bos_id=meta.get("bos_id"),
                eos_id=meta.get("eos_id"),
                add_bos=meta.get("add_bos", False),
                legacy=legacy,
                persist=False,
            )
            n += 1
        return n

    def register(self, tokenizer: Tokenizer, *, aliases: list[str] | tuple[str, ...] = (),
                 chat_template: str | None = None, bos_id: int | None = None,
                 eos_id: int | None = None, add_bos: bool = False,
                 legacy: list[str] | tuple[str, ...] = (),
                 persist: bool = True) -> TokenizerEntry:
        """The entry of `tokenizer`'s version: a new one, or the one registered before under
        any of its hashes (which keeps its artifact; this one's id joins its legacy ones).
        `legacy`: ids the version was issued under before (`TokenizerSource.legacy_version`)."""
        key = version_hash(tokenizer.version)
        if key is None:
            raise ValueError(f"{tokenizer.version!r} is not a tokenizer version id")
        entry = self._by_hash.get(key)
        if entry is None:
            entry = TokenizerEntry(tokenizer, chat_template=chat_template, bos_id=bos_id,
                                   eos_id=eos_id, add_bos=add_bos)
            self._entries[key] = self._by_hash[key] = entry
        elif entry.chat_template is None:
            entry.chat_template = chat_template
        # this artifact's id before the fingerprint (the family then may have been another)
        before = make_version(tokenizer.family, tokenizer.sha256)
        for v in (tokenizer.version, before, *legacy):
            h = version_hash(v)
            if h is not None and v != entry.version and self._by_hash.setdefault(h, entry) is entry:
                entry.legacy.add(v)
        for alias in aliases:
            # an alias is a movable pointer: the latest registration wins
            old = self.find(alias)
            if old is not None and old is not entry:
                old.aliases.discard(alias)
            self._aliases[alias] = entry.version
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
            "legacy": sorted(entry.legacy),
            "aliases": sorted(entry.aliases),
            "chat_template": entry.chat_template,
            "bos_id": entry.bos_id,
            "eos_id": entry.eos_id,
            "add_bos": entry.add_bos,
        }
        _atomic_write(d / "meta.json", json.dumps(meta, indent=1).encode())

    def resolve(self, name: str, *, param: str | None = "tokenizer_version") -> TokenizerEntry:
        """The entry of a version id (current or legacy) or an alias; 400
        unknown_tokenizer_version if none."""
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
        """By alias, or by the hash of a version id: the family half is a label (a legacy
        id's was a folder's name), so `any-49k@sha256:<hash>` finds the hash's entry."""
        h = version_hash(self._aliases.get(name, name))
        return self._by_hash.get(h) if h is not None else None

    def get(self, name: str) -> TokenizerEntry:
        """Like `resolve`, for URL paths: 404 when unknown."""
        entry = self.find(name)
        if entry is None:
            raise TokenizerNotFoundError(f"no tokenizer version {name!r}")
        return entry

    def entries(self) -> list[TokenizerEntry]:
        return list(self._entries.values())


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
