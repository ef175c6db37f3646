"""Tokenizer versions: fingerprints, immutable, kept on disk, addressable forever (by the ids
releases before the fingerprint gave them too)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.fakes import other_tokenizer
from tests.tokenizers.spellings import DIGITS_THEN_BYTE_LEVEL, TRANSFORMERS_PRE, respell
from tokenwire.errors import TokenizerNotFoundError, UnknownTokenizerVersionError
from tokenwire.tokenizers.base import VERSION_RE
from tokenwire.tokenizers.gguf import tokenizer_from_gguf
from tokenwire.tokenizers.hf import HFTokenizer, canonical_json
from tokenwire.tokenizers.registry import TokenizerRegistry


def test_version_is_the_tokenizers_fingerprint(tok: HFTokenizer, model_path: Path) -> None:
    assert VERSION_RE.match(tok.version)
    assert tok.version.startswith("smollm2-49k@sha256:")
    assert tok.sha256 == hashlib.sha256(tok.artifact).hexdigest()  # names the bytes
    assert tok.version.endswith(tok.fingerprint.digest[:16])
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


# -- ids from before the fingerprint ---------------------------------------------------------

#: SmolLM2's version from the GGUF before the fingerprint (its artifact's sha256)
OLD_GGUF_ID = "smollm2-49k@sha256:1396d3e34dbb484a"


def _respelled(tok: HFTokenizer) -> HFTokenizer:
    """SmolLM2's tokenizer in other bytes (`transformers`' spelling of the same tokenizer)."""
    return HFTokenizer(canonical_json(respell(json.loads(tok.artifact), DIGITS_THEN_BYTE_LEVEL)))


def test_old_ids_resolve_by_their_hash(tok: HFTokenizer) -> None:
    reg = TokenizerRegistry(None)
    entry = reg.register(tok, aliases=["smollm2-49k"])
    assert entry.version == tok.version != OLD_GGUF_ID
    # the family half of an old id was a folder's name: only the hash is matched
    for old in (OLD_GGUF_ID, "smollm2-135m-instruct-49k@sha256:1396d3e34dbb484a",
                "anything-49k@sha256:1396d3e34dbb484a"):
        assert reg.resolve(old) is entry
    assert reg.resolve("smollm2-49k") is entry and reg.get(OLD_GGUF_ID) is entry
    assert OLD_GGUF_ID in entry.legacy
    assert reg.find("smollm2-49k@sha256:1396d3e34dbb484b") is None


def test_two_artifacts_of_one_tokenizer_are_one_version(tmp_path: Path,
                                                        tok: HFTokenizer) -> None:
    """The first registered keeps serving its bytes; the other's old id joins the legacy ones,
    kept in the store."""
    other = _respelled(tok)
    assert other.version == tok.version and other.sha256 != tok.sha256
    reg = TokenizerRegistry(tmp_path)
    first = reg.register(tok, aliases=["smollm2-49k"])
    assert reg.register(other, legacy=["my-folder-49k@sha256:" + other.sha256[:16]]) is first
    assert reg.entries() == [first] and first.tokenizer is tok
    old_other = "x-49k@sha256:" + other.sha256[:16]
    assert reg.resolve(old_other) is first and reg.resolve(OLD_GGUF_ID) is first
    assert [d.name for d in tmp_path.iterdir()] == [tok.sha256]  # one artifact stored
    later = TokenizerRegistry(tmp_path)
    assert later.load_store() == 1
    entry = later.resolve(old_other)
    assert entry.version == tok.version and entry.tokenizer.artifact == tok.artifact
    assert "my-folder-49k@sha256:" + other.sha256[:16] in entry.legacy


def test_transformers_conversion_is_its_own_version(tok: HFTokenizer) -> None:
    """The directory `transformers` makes from the GGUF encodes some text otherwise: its old
    id resolves to its own version, never to the GGUF's."""
    converted = HFTokenizer(canonical_json(respell(json.loads(tok.artifact), TRANSFORMERS_PRE)))
    reg = TokenizerRegistry(None)
    mine, theirs = reg.register(tok), reg.register(converted)
    assert mine is not theirs
    old = f"x-49k@sha256:{converted.sha256[:16]}"
    assert old == "x-49k@sha256:ccfa9f7cf67748ee"  # the directory's id before the fingerprint
    assert reg.resolve(old) is theirs and reg.resolve(OLD_GGUF_ID) is mine


def _old_store_entry(store: Path, tok: HFTokenizer, family: str) -> None:
    """`<store>/<sha256>/{tokenizer.json,meta.json}` as releases before the fingerprint wrote
    it: the version was `<family>@sha256:<the artifact's sha256>`, the family a name."""
    d = store / tok.sha256
    d.mkdir(parents=True)
    (d / "tokenizer.json").write_bytes(tok.artifact)
    (d / "meta.json").write_text(json.dumps({
        "version": f"{family}@sha256:{tok.sha256[:16]}", "family": family, "aliases": [family],
        "chat_template": "{{ x }}", "bos_id": 1, "eos_id": 2, "add_bos": False}, indent=1))


def test_a_store_written_before_the_fingerprint_loads(tmp_path: Path, tok: HFTokenizer) -> None:
    _old_store_entry(tmp_path, tok, "smollm2-135m-instruct-49k")  # an HF folder's name
    _old_store_entry(tmp_path, _respelled(tok), "my-copy-49k")  # the same tokenizer, re-spelled
    reg = TokenizerRegistry(tmp_path)
    assert reg.load_store() == 2
    [entry] = reg.entries()
    assert entry.version == tok.version  # named from its content, not the folder
    assert entry.chat_template == "{{ x }}" and (entry.bos_id, entry.eos_id) == (1, 2)
    for name in ("smollm2-135m-instruct-49k@sha256:1396d3e34dbb484a", OLD_GGUF_ID,
                 "smollm2-135m-instruct-49k", "my-copy-49k", tok.version,
                 f"my-copy-49k@sha256:{_respelled(tok).sha256[:16]}"):
        assert reg.resolve(name) is entry, name
    assert entry.tokenizer.encode("hello world") == tok.encode("hello world")
    # a model registered now finds the stored version, served from the stored bytes
    assert reg.register(tok, aliases=["smollm2-49k"]) is entry
    meta = json.loads((tmp_path / tok.sha256 / "meta.json").read_text())
    assert meta["version"] == tok.version and meta["family"] == "smollm2-49k"
    assert "smollm2-135m-instruct-49k@sha256:1396d3e34dbb484a" in meta["legacy"]
