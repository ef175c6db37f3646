"""The published artifact tokenizes exactly like llama.cpp, on a real corpus, both ways: for
each family shipped, SmolLM2 (byte-level BPE) and Gemma 3 (SentencePiece, byte fallback)."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import NamedTuple

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
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<bos><eos><pad><unk>",
    "<start_of_turn", "end_of_turn>", "<<start_of_turn>>", "<START_OF_TURN>", "<unused0>",
    "<0x00><0x0A> <0xFF>", "\u2581 \u2581\u2581x ▁▁", "<b>bold</b> <table><tr><td>1</td></tr>",
    "\t\t\tindent\n    four\n" + " " * 40 + "forty\n" + "\n" * 40,
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


class Family(NamedTuple):
    engine: LlamaCppEngine
    tok: HFTokenizer
    sentencepiece: bool
    """Its space is "▁" (U+2581): a typed "▁" decodes as a space, in llama.cpp as here."""
    turn: tuple[str, str]
    """Its chat template's markers that open and close a turn."""
    corpus: list[tuple[str, str]]
    """What it is compared on: Gemma 3 on every extra text and a third of the files (its
    encode and decode tests took 55 s each on the whole corpus, the slowest of the main pass;
    they passed on all of it when this was cut)."""

    def decoded(self, text: str) -> str:
        """What decoding the ids of `text` gives back."""
        return text.replace("\u2581", " ") if self.sentencepiece else text


@pytest.fixture(params=["smollm2", "gemma3"])
def family(request: pytest.FixtureRequest) -> Family:
    """llama.cpp and our artifact, for one family."""
    if request.param == "smollm2":
        return Family(request.getfixturevalue("engine"), request.getfixturevalue("tok"), False,
                      ("<|im_start|>", "<|im_end|>"), CORPUS)
    return Family(request.getfixturevalue("gemma_engine"), request.getfixturevalue("gemma_tok"),
                  True, ("<start_of_turn>", "<end_of_turn>"),
                  CORPUS[:len(EXTRA)] + CORPUS[len(EXTRA)::3])


def test_corpus_is_real() -> None:
    assert len(CORPUS) > 300
    assert sum(len(s) for _, s in CORPUS) > 3_000_000


def test_encode_matches_llamacpp(family: Family) -> None:
    engine, tok = family.engine, family.tok
    misses = []
    for name, text in family.corpus:
        if engine.llama.tokenize(text) != tok.encode(text):
            misses.append(name)
    assert misses == []


def test_decode_both_ways(family: Family) -> None:
    llama = family.engine.llama
    for name, text in family.corpus:
        ids = llama.tokenize(text)
        assert family.tok.decode(ids) == family.decoded(text), name
        assert b"".join(llama.piece(t) for t in ids) == family.decoded(text).encode(), name


def test_every_id_has_the_same_bytes(family: Family) -> None:
    engine, tok = family.engine, family.tok
    assert tok.vocab_size == engine.llama.n_vocab
    bad = [i for i in range(tok.vocab_size) if engine.llama.piece(i) != tok.token_bytes(i)]
    assert bad == []


def test_control_strings_in_text_stay_text(family: Family) -> None:
    tok, llama = family.tok, family.engine.llama
    start, end = family.turn
    text = f"{start}user\nhi{end}"
    ids = tok.encode(text)
    assert not set(ids) & tok.special_ids
    assert ids == llama.tokenize(text, parse_special=False)
    parsed = tok.encode(text, parse_special=True)
    assert parsed == llama.tokenize(text, parse_special=True)
    assert parsed[0] == tok.special_id(start)


def test_gemma_is_sentencepiece_without_a_dummy_prefix(gemma_engine: LlamaCppEngine,
                                                       gemma_tok: HFTokenizer) -> None:
    """Gemma 3's GGUF sets add_space_prefix false: llama.cpp puts no "▁" before a text, so a
    text encoded on its own starts as it does after a newline or a control token."""
    llama = gemma_engine.llama
    ids = gemma_tok.encode("Hello world")
    assert [gemma_tok.token_str(i) for i in ids] == ["Hello", "\u2581world"]
    assert ids == llama.tokenize("Hello world")
    after = llama.tokenize("<start_of_turn>user\nHello world", parse_special=True)
    assert after[-len(ids):] == ids
    assert gemma_tok.version.startswith("gemma-3-262k@sha256:")
    assert gemma_tok.vocab_size == 262144
    docs = Path(__file__).parents[2] / "docs" / "api.md"
    assert gemma_tok.version in docs.read_text(encoding="utf-8")  # the id the docs quote


def test_artifact_loads_in_the_tokenizers_library(family: Family) -> None:
    """What a client gets: the published bytes, loaded with plain `tokenizers`."""
    tok = family.tok
    raw = RawHFTokenizer.from_str(tok.artifact.decode())
    raw.encode_special_tokens = True
    for _, text in CORPUS[:60]:
        assert raw.encode(text, add_special_tokens=False).ids == tok.encode(text)
