"""Translation between two real tokenizer versions: exact to the byte, whole or streamed."""

from __future__ import annotations

import functools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.fakes import other_tokenizer
from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.probe import PROBE_CORPUS
from tokenwire.tokenizers.translate import Translator, translator

_OTHER = other_tokenizer()
_TEXT = st.lists(st.sampled_from(list(PROBE_CORPUS) + ["a", " ", "\n", "é", "1", "🎉", "ça"]),
                 max_size=20).map("".join)


def _bytes(tok: HFTokenizer, ids: list[int]) -> bytes:
    return b"".join(tok.token_bytes(t) for t in ids)


@functools.cache
def _plain(tok: HFTokenizer) -> list[int]:
    return [i for i in range(tok.vocab_size) if i not in tok.special_ids]


@functools.cache
def _alphabet(tok: HFTokenizer) -> set[int]:
    return {tok.token_bytes(i)[0] for i in range(tok.vocab_size)
            if len(tok.token_bytes(i)) == 1 and i not in tok.special_ids}


@pytest.fixture(scope="module",
                params=["to-other", "from-other", "smollm2-to-gemma3", "gemma3-to-smollm2"])
def pair(request: pytest.FixtureRequest, tok: HFTokenizer) -> tuple[HFTokenizer, HFTokenizer]:
    """SmolLM2 and a BPE trained here; SmolLM2 and Gemma 3 (SentencePiece), both ways."""
    if "gemma3" in request.param:
        gemma = request.getfixturevalue("gemma_tok")
        return (tok, gemma) if request.param.startswith("smollm2") else (gemma, tok)
    return (tok, _OTHER) if request.param == "to-other" else (_OTHER, tok)


@settings(max_examples=200, deadline=None)
@given(text=_TEXT)
def test_text_ids_translate_to_the_canonical_encoding(
        pair: tuple[HFTokenizer, HFTokenizer], text: str) -> None:
    src, dst = pair
    got = translator(src, dst).translate(src.encode(text))
    assert got.token_ids == dst.encode(text)
    assert got.lossless and got.text_bytes == len(text.encode())


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_ids_keep_their_bytes(pair: tuple[HFTokenizer, HFTokenizer],
                                     data: st.DataObject) -> None:
    """Non-canonical sequences, cut characters, bytes that are no UTF-8: byte for byte."""
    src, dst = pair
    ids = data.draw(st.lists(st.sampled_from(_plain(src)), max_size=24))
    want = _bytes(src, ids)
    assume(set(want) <= _alphabet(dst))  # bytes the target has no token for: below
    got = translator(src, dst).translate(ids)
    assert _bytes(dst, got.token_ids) == want
    assert got.lossless and got.text_bytes == len(want)
    assert dst.decode(got.token_ids) == src.decode(ids)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_stream_cut_anywhere_is_the_whole_translation(
        pair: tuple[HFTokenizer, HFTokenizer], data: st.DataObject) -> None:
    src, dst = pair
    ids = data.draw(st.one_of(_TEXT.map(src.encode),
                              st.lists(st.integers(0, src.vocab_size - 1), max_size=24)))
    skip = data.draw(st.booleans())
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(ids)), max_size=8))))
    tr = translator(src, dst)
    stream = tr.stream(skip_special=skip)
    out: list[int] = []
    prev = 0
    for c in [*cuts, len(ids)]:
        out += stream.push(ids[prev:c])
        prev = c
    assert out + stream.finish() == tr.translate(ids, skip_special=skip).token_ids


def test_control_tokens_map_by_their_text(tok: HFTokenizer) -> None:
    """A control token the target has (same text) stays one; one it lacks becomes its text,
    which keeps the bytes but not the meaning: not lossless."""
    import json

    from tokenwire.tokenizers.hf import canonical_json

    spec = json.loads(_OTHER.artifact)
    spec["added_tokens"].append({"id": len(spec["model"]["vocab"]), "content": "<|im_end|>",
                                 "special": True, "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False})
    dst = HFTokenizer(canonical_json(spec), family="tiny-im-end")
    end, start = tok.special_tokens["<|im_end|>"], tok.special_tokens["<|im_start|>"]
    tr = Translator(tok, dst)
    ids = tok.encode("Hi there") + [end]
    got = tr.translate(ids)
    assert got.token_ids == dst.encode("Hi there") + [dst.special_tokens["<|im_end|>"]]
    assert got.lossless
    lost = tr.translate([start, *ids])
    assert not lost.lossless
    assert _bytes(dst, lost.token_ids) == _bytes(tok, [start, *ids])  # the bytes survive
    assert tr.translate([start, *ids], skip_special=True).token_ids == got.token_ids


def test_a_byte_the_target_lacks_is_replaced_and_reported(tok: HFTokenizer) -> None:
    """SmolLM2 has no token of 0xC0 (never UTF-8): U+FFFD stands in, so the texts still agree;
    nor of 0x04 (valid text it cannot encode): either way, not lossless."""
    for missing in (0xC0, 0x04):
        assert missing not in _alphabet(tok)
        ids = _OTHER.encode("ok") + [next(i for i in range(_OTHER.vocab_size)
                                          if _OTHER.token_bytes(i) == bytes([missing]))]
        got = Translator(_OTHER, tok).translate(ids)
        assert not got.lossless
        if missing == 0xC0:
            assert tok.decode(got.token_ids) == _OTHER.decode(ids) == "ok\ufffd"


def test_ids_ending_inside_a_character_keep_the_cut(tok: HFTokenizer) -> None:
    ids = tok.encode("tous 🎉")
    cut = next(k for k in range(1, len(ids)) if not _valid(_bytes(tok, ids[:k])))
    part = Translator(tok, _OTHER).translate(ids[:cut])
    assert part.lossless and _bytes(_OTHER, part.token_ids) == _bytes(tok, ids[:cut])
    # and the rest, translated on its own, completes the character
    rest = Translator(tok, _OTHER).translate(ids[cut:])
    assert _OTHER.decode(part.token_ids + rest.token_ids) == "tous 🎉"


def _valid(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True
