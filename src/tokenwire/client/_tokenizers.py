"""Tokenizer artifacts on the client's disk: fetched once per version, verified every load.

A version id carries the first 16 hex digits of its tokenizer's fingerprint (what its ids mean:
`tokenizers/fingerprint.py`), so the client checks the bytes against the id it asked for, not
only against what the server says: it recomputes the fingerprint from them with the server's own
code, and checks them against the sha256 the server published. An id issued before the
fingerprint carried its artifact's sha256: bytes with that sha256 are its own (a cache entry
written then). Beside the bytes lies the version's published `text_encoding` (the settings under
which they encode text as the server does), applied at every load.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..errors import TokenizerIntegrityError
from ..protocol.tokenize import TextEncoding
from ..tokenizers.base import VERSION_RE
from ..tokenizers.hf import HFTokenizer

__all__ = ["TokenizerCache", "default_cache_dir"]


def default_cache_dir() -> Path:
    return Path(os.environ.get("TOKENWIRE_CLIENT_CACHE",
                               Path.home() / ".cache" / "tokenwire" / "client"))


class TokenizerCache:
    def __init__(self, directory: Path | None = None):
        self.directory = directory if directory is not None else default_cache_dir()
        self._loaded: dict[str, HFTokenizer] = {}

    @staticmethod
    def check_version(version: str) -> None:
        if not VERSION_RE.match(version):
            raise TokenizerIntegrityError(
                f"{version!r} is not a full tokenizer version (<family>@sha256:<16 hex>)")

    def verify(self, version: str, data: bytes, declared: str | None = None,
               text_encoding: TextEncoding | None = None) -> HFTokenizer:
        """The tokenizer of `data`, if it is the version's; else TokenizerIntegrityError.
        `declared`: the sha256 the server published for the bytes; `text_encoding`: the
        version's published one (None: the server's defaults)."""
        self.check_version(version)
        family, prefix = version.split("@sha256:")
        digest = hashlib.sha256(data).hexdigest()
        if declared is not None and declared != digest:
            raise TokenizerIntegrityError(
                f"the artifact for {version} hashes to {digest}, not to the declared {declared}")
        settings = text_encoding.model_dump() if text_encoding is not None else {}
        try:
            tok = HFTokenizer(data, family=family, **settings)
        except Exception as exc:  # not JSON, or not a tokenizer (the library's own errors)
            raise TokenizerIntegrityError(
                f"the artifact for {version} is not a tokenizer ({exc})") from exc
        if tok.fingerprint.digest.startswith(prefix):
            return tok
        if digest.startswith(prefix):  # an id from before the fingerprint, of these bytes
            return tok.labelled(None)
        raise TokenizerIntegrityError(
            f"the artifact for {version} is the tokenizer {tok.fingerprint.digest[:16]} "
            f"(bytes {digest[:16]}), not that version's")

    def _path(self, version: str) -> Path:
        return self.directory / version.replace("@sha256:", "-") / "tokenizer.json"

    def _encoding_path(self, version: str) -> Path:
        return self._path(version).with_name("text_encoding.json")

    def get(self, version: str) -> HFTokenizer | None:
        tok = self._loaded.get(version)
        if tok is not None:
            return tok
        path, encoding = self._path(version), self._encoding_path(version)
        if not path.is_file() or not encoding.is_file():
            return None  # (an entry cached before text_encoding was published: fetched again)
        tok = self.verify(version, path.read_bytes(), None,
                          TextEncoding.model_validate_json(encoding.read_bytes()))
        self._loaded[version] = tok
        return tok

    def remember(self, version: str, tok: HFTokenizer) -> None:
        """`version` (an id from before the fingerprint) names `tok` for this process."""
        self._loaded[version] = tok

    def put(self, version: str, data: bytes, declared: str | None = None,
            text_encoding: TextEncoding | None = None) -> HFTokenizer:
        tok = self.verify(version, data, declared, text_encoding)
        path = self._path(version)
        path.parent.mkdir(parents=True, exist_ok=True)
        # the settings first: bytes without them are not a cache hit
        self._write(self._encoding_path(version), json.dumps(tok.text_encoding).encode())
        self._write(path, data)
        self._loaded[version] = tok
        return tok

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
