"""One tokenizer, one version: the id is a fingerprint of what the ids mean, not of one file.

The same tokenizer from the GGUF or a Hugging Face directory (whatever the folder is called,
however the file spells it) has one version; a tokenizer that gives some text other ids never
shares it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.fakes import other_tokenizer
from tests.tokenizers.spellings import DIGITS_THEN_BYTE_LEVEL, TRANSFORMERS_PRE, respelled
from tests.upstreams import hf_tokenizer_dir
from tokenwire.tokenizers._corpus import CORPUS
from tokenwire.tokenizers.base import VERSION_RE
from tokenwire.tokenizers.hf import HFTokenizer, canonical_json
from tokenwire.tokenizers.probe import PROBE_CORPUS
from tokenwire.tokenizers.source import TokenizerSource, load_tokenizer

#: the versions of the two families shipped (docs/api.md quotes them)
SMOLLM2 = "smollm2-49k@sha256:cb25111eba2751ff"
GEMMA3 = "gemma-3-262k@sha256:53ac2e4ad961f854"

def test_the_families_shipped(tok: HFTokenizer, gemma_tok: HFTokenizer) -> None:
    assert tok.version == SMOLLM2 and gemma_tok.version == GEMMA3
    assert VERSION_RE.match(tok.version)
    assert tok.version.endswith(tok.fingerprint.digest[:16])
    # the artifact is the same bytes as before the fingerprint, published with their sha256
    assert tok.sha256 == hashlib.sha256(tok.artifact).hexdigest()
    assert tok.sha256.startswith("1396d3e34dbb484a")


def test_the_corpus_is_frozen() -> None:
    """Its ids are hashed into every version: a changed string changes every id (a new
    fingerprint scheme, never an edit)."""
    assert PROBE_CORPUS == CORPUS
    digest = hashlib.sha256("\0".join(CORPUS).encode()).hexdigest()
    assert digest == "1439efd58fac9fdc91c18b6e9cfbc6bbc2aba4eb1657756b198b32288803721d"


@pytest.mark.parametrize("folder", ["SmolLM2-135M-Instruct", "m", "Some Other Name.v2"])
def test_a_directory_has_the_gguf_version_whatever_its_name(tmp_path: Path, tok: HFTokenizer,
                                                            folder: str) -> None:
    src = load_tokenizer(hf_tokenizer_dir(tmp_path / folder))
    assert src.tokenizer.version == tok.version
    assert src.tokenizer.family == "smollm2-49k"


def test_another_spelling_of_the_same_tokenizer(tmp_path: Path, tok: HFTokenizer) -> None:
    """Other pre-tokenizer, decoder and post-processor JSON, "" for null, old-style merges:
    other bytes, the same ids for every text, so the same version."""
    d = respelled(hf_tokenizer_dir(tmp_path / "respelled"), DIGITS_THEN_BYTE_LEVEL)
    spec = json.loads((d / "tokenizer.json").read_text())
    spec["model"]["merges"] = [" ".join(m) for m in spec["model"]["merges"]]
    (d / "tokenizer.json").write_text(json.dumps(spec))
    other = load_tokenizer(d).tokenizer
    assert other.sha256 != tok.sha256
    assert other.version == tok.version
    # the text mode a client applies is no part of the version
    assert HFTokenizer(tok.artifact, encode_special_tokens=False).version == tok.version


def test_transformers_conversion_of_the_gguf_is_another_tokenizer(tmp_path: Path,
                                                                  tok: HFTokenizer) -> None:
    """`transformers` turns the GGUF's `smollm` pre-tokenizer into plain byte-level BPE: the
    digit split is gone, and a digit after spaces gets other ids. Same vocabulary (so the same
    family), another version."""
    d = respelled(hf_tokenizer_dir(tmp_path / "SmolLM2-135M-Instruct"), TRANSFORMERS_PRE)
    converted = load_tokenizer(d).tokenizer
    # these are the bytes of the directory scripts/hf-model-from-gguf.py makes
    assert converted.sha256.startswith("ccfa9f7cf67748ee")
    assert converted.encode("  42") != tok.encode("  42")
    assert converted.family == tok.family and converted.version != tok.version


def test_a_different_tokenizer_never_shares_a_version(tmp_path: Path, tok: HFTokenizer,
                                                      gemma_tok: HFTokenizer) -> None:
    broken = load_tokenizer(hf_tokenizer_dir(tmp_path / "b", break_merge=True)).tokenizer
    spec = json.loads(tok.artifact)
    spec["model"]["merges"] = spec["model"]["merges"][:-1]  # the rarest merge: in no corpus
    rare = HFTokenizer(canonical_json(spec))
    spec = json.loads(tok.artifact)
    spec["added_tokens"][5]["special"] = False  # a control token made a plain added token
    unspecial = HFTokenizer(canonical_json(spec))
    versions = {t.version for t in (tok, gemma_tok, broken, rare, unspecial, other_tokenizer())}
    assert len(versions) == 6
    assert broken.family == "bpe-49k"  # one merge fewer: not the tokenizer shipped


def test_a_family_not_shipped_is_named_by_its_content(tok: HFTokenizer) -> None:
    """Never by a folder's or a file's name."""
    raw = other_tokenizer()
    assert HFTokenizer(raw.artifact).version.startswith(f"bpe-{raw.vocab_size}@sha256:")
    spec = json.loads(tok.artifact)
    spec["added_tokens"][5]["special"] = False  # no longer SmolLM2's tokenizer
    assert HFTokenizer(canonical_json(spec)).family == "bpe-49k"


def test_a_directory_remembers_its_id_from_before_the_fingerprint(tmp_path: Path,
                                                                  gguf_info: TokenizerSource,
                                                                  ) -> None:
    """What data stored by an earlier release names: the family a name, the hash the
    artifact's."""
    assert gguf_info.legacy_version == "smollm2-49k@sha256:1396d3e34dbb484a"
    src = load_tokenizer(hf_tokenizer_dir(tmp_path / "SmolLM2-135M-Instruct"))
    assert src.legacy_version == "smollm2-135m-instruct-49k@sha256:1396d3e34dbb484a"
