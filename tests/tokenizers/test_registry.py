"""Tokenizer versions: content-addressed, immutable, kept on disk, addressable forever."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.fakes import other_tokenizer
from tokenwire.errors import TokenizerNotFoundError, UnknownTokenizerVersionError
from tokenwire.tokenizers.base import VERSION_RE
from tokenwire.tokenizers.gguf import tokenizer_from_gguf
from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.registry import TokenizerRegistry


def test_version_is_content_addressed(tok: HFTokenizer, model_path: Path) -> None:
    assert VERSION_RE.match(tok.version)
    assert tok.version.startswith("smollm2-49k@sha256:")
    assert tok.sha256 == hashlib.sha256(tok.artifact).hexdigest()
    assert tok.version.endswith(tok.sha256[:16])
    # the same file gives the same bytes, and so the same version
    assert tokenizer_from_gguf(model_path).tokenizer.artifact == tok.artifact
    assert other_tokenizer().version != tok.version


def test_store_keeps_versions_after_their_model_is_gone(tmp_path: Path,
                                                        tok: HFTokenizer) -> None:
    first = TokenizerRegistry(tmp_path)
    first.register(tok, aliases=["smollm2-49k"], chat_template="{{ x }}")
    first.register(other_tokenizer(), aliases=["tiny"])
    later = TokenizerRegistry(tmp_path)  # a new server, serving no model yet
    assert later.load_store() == 2
    entry = later.resolve(tok.version)
    assert entry.tokenizer.encode("hello world") == tok.encode("hello world")
    assert entry.chat_template == "{{ x }}"
    assert later.resolve("tiny").version == other_tokenizer().version


def test_tampered_store_entries_are_skipped(tmp_path: Path, tok: HFTokenizer) -> None:
    TokenizerRegistry(tmp_path).register(tok)
    art = tmp_path / tok.sha256 / "tokenizer.json"
    art.write_bytes(art.read_bytes().replace(b'"hello"', b'"hullo"'))
    assert TokenizerRegistry(tmp_path).load_store() == 0


def test_aliases_move_versions_do_not(tok: HFTokenizer) -> None:
    reg = TokenizerRegistry(None)
    reg.register(tok, aliases=["current"])
    other = other_tokenizer()
    reg.register(other, aliases=["current"])
    assert reg.resolve("current").version == other.version
    assert reg.resolve(tok.version).version == tok.version
    assert "current" not in reg.resolve(tok.version).aliases


def test_unknown_versions(tok: HFTokenizer) -> None:
    reg = TokenizerRegistry(None)
    with pytest.raises(UnknownTokenizerVersionError) as info:
        reg.resolve("smollm2-49k@sha256:0000000000000000")
    assert info.value.param == "tokenizer_version"
    with pytest.raises(UnknownTokenizerVersionError, match="expected"):
        reg.resolve("not a version")
    with pytest.raises(TokenizerNotFoundError):
        reg.get("nope")
