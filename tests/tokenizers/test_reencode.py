"""Text in pieces -> ids: the streamed ids are exactly the ids of the whole text."""

from __future__ import annotations

import sysconfig
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.probe import PROBE_CORPUS
from tokenwire.tokenizers.reencode import IncrementalEncoder

_SOURCE = (Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py").read_text()
_ALPHABET = st.sampled_from(list(PROBE_CORPUS) + ["a", " ", "\n", "\r", "é", "1", "'", "🎉"])


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
def test_streamed_ids_equal_whole_encoding(tok: HFTokenizer, pieces: list[str],
                                           data: st.DataObject) -> None:
    text = "".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    assert streamed(tok, text, cuts) == tok.encode(text)


def test_a_real_file_streamed_in_small_pieces(tok: HFTokenizer) -> None:
    cuts = list(range(0, len(_SOURCE), 3))
    assert streamed(tok, _SOURCE, cuts) == tok.encode(_SOURCE)


def test_ids_flow_before_the_end(tok: HFTokenizer) -> None:
    enc = IncrementalEncoder(tok)
    early = enc.push("The quick brown fox jumps over")
    assert early and tok.decode(early) == "The quick brown fox"  # two segments held
    assert early + enc.push(" the lazy dog.") + enc.finish() == tok.encode(
        "The quick brown fox jumps over the lazy dog.")


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
