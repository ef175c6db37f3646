"""The published artifact tokenizes exactly like llama.cpp, on a real corpus, both ways."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
from tokenizers import Tokenizer as RawHFTokenizer

from tokenwire.engines.llamacpp import LlamaCppEngine
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.engine

EXTRA = [
    "",
    " ",
    "\n\n\n",
    "   lots   of\n\n\n  space\t\t \r\n \u00a0\u2003 end  ",
    "héllo wörld, naïve café, Ærøskøbing, straße",
    "日本語のテキストと中文文本，한국어 텍스트",
    "עברית ועربية، русский текст, ελληνικά, हिन्दी, ไทย",
    "emoji 🎉🎉 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 ✔️ 1️⃣",
    "digits 1234567890 3.14159 1e-10 ١٢٣٤ ۴۵۶ 五 ⅷ ½ x² ²³",
    "<|im_start|>system\nYou are evil<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name><file_sep><filename>",
    "<|im_start|", "|im_end|>", "<<|im_start|>>", "<|IM_START|>",
    "'s 't 're 've 'm 'll 'd 'S 'T",
    "\x00\x01\x02 control \x7f bytes \ufeff bom \u200b zwsp",
    "a" * 3000,
    "🎉" * 500,
    "\U0010ffff \U0001f9ff \ud7ff",
]


def _corpus() -> list[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    picked = files[:: max(1, len(files) // 400)]
    out = [(f"extra[{i}]", s) for i, s in enumerate(EXTRA)]
    for p in picked:
        try:
            out.append((str(p.relative_to(stdlib)), p.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return out


CORPUS = _corpus()


def test_corpus_is_real() -> None:
    assert len(CORPUS) > 300
    assert sum(len(s) for _, s in CORPUS) > 3_000_000


def test_encode_matches_llamacpp(engine: LlamaCppEngine, tok: HFTokenizer) -> None:
    misses = []
    for name, text in CORPUS:
        if engine.llama.tokenize(text) != tok.encode(text):
            misses.append(name)
    assert misses == []


def test_decode_both_ways(engine: LlamaCppEngine, tok: HFTokenizer) -> None:
    llama = engine.llama
    for name, text in CORPUS:
        ids = llama.tokenize(text)
        assert tok.decode(ids) == text, name
        assert b"".join(llama.piece(t) for t in ids) == text.encode(), name


def test_every_id_has_the_same_bytes(engine: LlamaCppEngine, tok: HFTokenizer) -> None:
    assert tok.vocab_size == engine.llama.n_vocab
    bad = [i for i in range(tok.vocab_size) if engine.llama.piece(i) != tok.token_bytes(i)]
    assert bad == []


def test_control_strings_in_text_stay_text(engine: LlamaCppEngine, tok: HFTokenizer) -> None:
    text = "<|im_start|>system\nhi<|im_end|>"
    ids = tok.encode(text)
    assert not set(ids) & tok.special_ids
    assert ids == engine.llama.tokenize(text, parse_special=False)
    parsed = tok.encode(text, parse_special=True)
    assert parsed == engine.llama.tokenize(text, parse_special=True)
    assert parsed[0] == tok.special_id("<|im_start|>")


def test_artifact_loads_in_the_tokenizers_library(tok: HFTokenizer) -> None:
    """What a client gets: the published bytes, loaded with plain `tokenizers`."""
    raw = RawHFTokenizer.from_str(tok.artifact.decode())
    raw.encode_special_tokens = True
    for _, text in CORPUS[:60]:
        assert raw.encode(text, add_special_tokens=False).ids == tok.encode(text)
