"""Text in pieces -> ids: the streamed ids are exactly the ids of the whole text, for both
shipped families (byte-level BPE cut by its pre-tokenizer; Gemma 3's SentencePiece cut before
runs of spaces, except inside its one piece that spans such a cut, `>▁</`)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.probe import PROBE_CORPUS
from tokenwire.tokenizers.reencode import IncrementalEncoder

_SOURCE = (Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py").read_text()
_ALPHABET = st.sampled_from(list(PROBE_CORPUS) + ["a", " ", "\n", "\r", "é", "1", "'", "🎉",
                                                  ">", "</", "> </", "  "])


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def family(request: pytest.FixtureRequest) -> HFTokenizer:
    name = "tok" if request.param == "smollm2" else "gemma_tok"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


def streamed(tok: HFTokenizer, text: str, cuts: list[int]) -> list[int]:
    enc = IncrementalEncoder(tok)
    out: list[int] = []
    prev = 0
    for c in [*sorted(set(cuts)), len(text)]:
        out += enc.push(text[prev:c])
        prev = c
    return out + enc.finish()


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_ALPHABET, max_size=30), data=st.data())
def test_streamed_ids_equal_whole_encoding(family: HFTokenizer, pieces: list[str],
                                           data: st.DataObject) -> None:
    text = "".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    assert streamed(family, text, cuts) == family.encode(text)


def test_a_real_file_streamed_in_small_pieces(family: HFTokenizer) -> None:
    cuts = list(range(0, len(_SOURCE), 3))
    assert streamed(family, _SOURCE, cuts) == family.encode(_SOURCE)
    html = "<p>a</p> </div>  > </b> x> </" * 20  # the piece that spans a cut, cut everywhere
    assert streamed(family, html, list(range(len(html)))) == family.encode(html)


def test_ids_flow_before_the_end(family: HFTokenizer) -> None:
    enc = IncrementalEncoder(family)
    early = enc.push("The quick brown fox jumps over")
    assert early and family.decode(early) == "The quick brown fox"  # two segments held
    assert early + enc.push(" the lazy dog.") + enc.finish() == family.encode(
        "The quick brown fox jumps over the lazy dog.")


def test_gemmas_segments_join_around_its_spanning_piece(gemma_tok: HFTokenizer) -> None:
    """`>▁</` is one Gemma token across a space that follows a character: no cut there."""
    text = "<b>x</b> </i> y"
    spans = [text[a:b] for a, b in gemma_tok.pre_tokenize(text)]
    assert spans == ["<b>x</b> </i>", " y"]
    assert gemma_tok.encode_segments(spans) == gemma_tok.encode(text)
    assert gemma_tok.special_id("> </") is None and "> </" in gemma_tok.decode(
        gemma_tok.encode(text))


def test_a_tokenizer_that_is_not_segment_local_holds_everything(tok: HFTokenizer) -> None:
    import json

    from tokenwire.tokenizers.hf import canonical_json

    spec = json.loads(tok.artifact)
    spec["normalizer"] = {"type": "NFC"}
    nfc = HFTokenizer(canonical_json(spec), family="nfc")
    assert not nfc.segment_local
    enc = IncrementalEncoder(nfc)
    assert enc.push("The quick brown fox jumps over") == []
    assert enc.finish() == nfc.encode("The quick brown fox jumps over")
