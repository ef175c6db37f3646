"""Tokenizer sources: a Hugging Face directory (what vLLM and SGLang load) pins the same ids as
the GGUF; the files decide the template, BOS/EOS and the end-of-generation ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.upstreams import hf_tokenizer_dir
from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.probe import PROBE_CORPUS, first_mismatch
from tokenwire.tokenizers.source import TokenizerSourceError, load_tokenizer


def test_a_hugging_face_directory(tmp_path: Path, tok: HFTokenizer) -> None:
    d = hf_tokenizer_dir(tmp_path / "SmolLM2-135M-Instruct")
    src = load_tokenizer(d)
    assert src.tokenizer.version == tok.version  # named by its content, not the folder
    assert src.tokenizer.sha256 == tok.sha256  # the same bytes: the same id <-> bytes mapping
    assert (src.bos_id, src.eos_id, src.eog_ids) == (1, 2, frozenset({2}))
    assert src.chat_template and "<|im_start|>" in src.chat_template
    assert not src.add_bos
    for text in PROBE_CORPUS:
        assert src.tokenizer.encode(text) == tok.encode(text)


def test_what_the_files_say(tmp_path: Path) -> None:
    d = hf_tokenizer_dir(tmp_path / "m")
    (d / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["bos_token"] = {"content": "<|im_start|>", "lstrip": False}  # the other spelling
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    spec = json.loads((d / "tokenizer.json").read_text())
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
        {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {}}
    (d / "tokenizer.json").write_text(json.dumps(spec))
    src = load_tokenizer(d)
    assert src.chat_template == "{{ messages[0]['content'] }}"  # the .jinja file wins
    assert src.eog_ids == frozenset({0, 2}) and src.bos_id == 1
    assert src.add_bos  # the post-processor puts BOS first, as add_special_tokens does upstream
    assert load_tokenizer(d / "tokenizer.json").tokenizer.sha256 == src.tokenizer.sha256


@pytest.mark.parametrize("make", [
    lambda d: None,  # an empty directory
    lambda d: (d / "tokenizer.json").write_text("{not json"),
    lambda d: (d / "notes.txt").write_text("x"),
])
def test_unusable_sources_are_refused(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "m"
    d.mkdir()
    make(d)
    target = d / "notes.txt" if (d / "notes.txt").exists() else d
    with pytest.raises(TokenizerSourceError):
        load_tokenizer(target)


@pytest.mark.anyio
async def test_the_probe_names_the_first_difference(tmp_path: Path, tok: HFTokenizer) -> None:
    broken = load_tokenizer(hf_tokenizer_dir(tmp_path / "b", break_merge=True)).tokenizer

    async def reference(texts: list[str]) -> list[list[int]]:
        return [tok.encode(t, parse_special=True) for t in texts]

    assert await first_mismatch(tok, reference) is None
    miss = await first_mismatch(broken, reference)
    assert miss is not None and miss.ours != miss.theirs
    assert miss.theirs == tok.encode(miss.text, parse_special=True)
    assert "on ' the '" in miss.describe("upstream x")

    async def plain(texts: list[str]) -> list[list[int]]:  # marker strings kept as text
        return [tok.encode(t) for t in texts]

    assert await first_mismatch(tok, plain) is None  # a policy, not a different tokenizer
