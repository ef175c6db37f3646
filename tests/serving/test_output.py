"""Stop strings and UTF-8 hold-back: the stream invariants, as properties over real ids."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenwire.engines.base import TokenEvent
from tokenwire.serving.output import Delta, OutputDecoder
from tokenwire.tokenizers.hf import HFTokenizer

TEXTS = st.text(alphabet=st.sampled_from(list("ab ,.\n") + list("éà日本🎉👍ç")), max_size=40)
STOPS = st.lists(st.text(alphabet=st.sampled_from(list("ab ,.\n") + ["é", "🎉", "日"]),
                         min_size=1, max_size=4), max_size=3)


def run(dec: OutputDecoder, ids: list[int]) -> list[Delta]:
    out = []
    for t in ids:
        out.append(dec.push(TokenEvent(t)))
        if dec.stop_string is not None:
            break
    out.append(dec.finish())
    return out


def joined(deltas: list[Delta]) -> tuple[list[int], str]:
    return [i for d in deltas for i in d.ids], "".join(d.text for d in deltas)


SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(text=TEXTS, stops=STOPS)
def test_aligned_text_is_the_text_of_the_ids(tok: HFTokenizer, text: str,
                                             stops: list[str]) -> None:
    ids = tok.encode(text)
    dec = OutputDecoder(tok, stops, token_aligned=True)
    out_ids, out_text = joined(run(dec, ids))
    assert out_text == tok.decode(out_ids)
    assert ids[:len(out_ids)] == out_ids
    if dec.stop_string is None:
        assert out_ids == ids
        assert not any(s in text for s in stops)
    else:
        assert dec.stop_string in text
        assert not any(s in out_text for s in stops)


@SETTINGS
@given(text=TEXTS, stops=STOPS)
def test_plain_text_ends_exactly_before_the_stop(tok: HFTokenizer, text: str,
                                                 stops: list[str]) -> None:
    dec = OutputDecoder(tok, stops, token_aligned=False)
    _, out_text = joined(run(dec, tok.encode(text)))
    # OpenAI's rule: output ends before the stop string that completes first
    found = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    cut = min(found)[1] if found else len(text)
    assert out_text == text[:cut]


@SETTINGS
@given(ids=st.lists(st.integers(min_value=0, max_value=49151), max_size=30))
def test_arbitrary_ids_decode_like_one_shot(tok: HFTokenizer, ids: list[int]) -> None:
    """Even ids that are not valid UTF-8 together: the deltas decode as the whole does."""
    out_ids, out_text = joined(run(OutputDecoder(tok), ids))
    assert out_ids == ids
    assert out_text == tok.decode(ids)


def test_partial_character_is_held_back(tok: HFTokenizer) -> None:
    ids = tok.encode(" 🎉")
    assert len(ids) == 3  # " \xf0\x9f", "\x8e", "\x89"
    dec = OutputDecoder(tok)
    deltas = [dec.push(TokenEvent(t)) for t in ids]
    assert [d.text for d in deltas] == [" ", "", "🎉"]
    assert [d.ids for d in deltas] == [[i] for i in ids]


def test_text_after_the_stop_is_never_released(tok: HFTokenizer) -> None:
    dec = OutputDecoder(tok, ["\n\n"])
    deltas = run(dec, tok.encode("one\n\ntwo"))
    assert joined(deltas)[1] == "one"
    assert dec.stop_string == "\n\n"
    assert dec.push(TokenEvent(5)) == Delta()


@SETTINGS
@given(ids=st.lists(st.sampled_from([30904, 15107, 232, 227, 46316, 47, 5549, 117, 81, 253]),
                    max_size=12),
       stops=st.lists(st.sampled_from([" va", "a", "?", "Bon", " "]), min_size=1, max_size=2))
def test_stops_after_partial_characters(tok: HFTokenizer, ids: list[int],
                                        stops: list[str]) -> None:
    """Ids that leave a character incomplete before a stop string: text still equals ids."""
    dec = OutputDecoder(tok, stops, token_aligned=True)
    out_ids, out_text = joined(run(dec, ids))
    assert out_text == tok.decode(out_ids)


def test_stop_right_after_a_cut_character(tok: HFTokenizer) -> None:
    ids = [30904, 15107, 46316, 47]  # "Bon", " \xf0\x9f" (half an emoji), " va", "?"
    out_ids, out_text = joined(run(OutputDecoder(tok, [" va"], token_aligned=True), ids))
    assert out_ids == [30904, 15107] and out_text == tok.decode(out_ids) == "Bon \ufffd"
    _, plain = joined(run(OutputDecoder(tok, [" va"], token_aligned=False), ids))
    assert plain == "Bon \ufffd"


@SETTINGS
@given(text=TEXTS, stops=STOPS)
def test_included_stop_strings_end_the_text(tok: HFTokenizer, text: str,
                                            stops: list[str]) -> None:
    """vLLM's `include_stop_str_in_output`: the text runs to the end of the stop string that
    completes first (plain), and the ids through the token that completed it."""
    ids = tok.encode(text)
    for aligned in (False, True):
        dec = OutputDecoder(tok, stops, token_aligned=aligned, include_stop=True)
        out_ids, out_text = joined(run(dec, ids))
        found = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
        if not found:
            assert dec.stop_string is None and out_ids == ids
            continue
        end = min(found)[0]
        assert dec.stop_string is not None and ids[:len(out_ids)] == out_ids
        # the ids run through the token that completed the stop string, not one further
        assert len(tok.decode_bytes(out_ids)) >= len(text[:end].encode())
        assert len(tok.decode_bytes(out_ids[:-1])) < len(text[:end].encode())
        if aligned:
            assert out_text == tok.decode(out_ids)
        else:
            assert out_text == text[:end]


def test_skipped_control_tokens_add_no_text(tok: HFTokenizer) -> None:
    start, end = tok.special_id("<|im_start|>"), tok.special_id("<|im_end|>")
    ids = [*tok.encode("a"), start, *tok.encode(" b"), end]
    _, kept = joined(run(OutputDecoder(tok), ids))
    out_ids, skipped = joined(run(OutputDecoder(tok, skip_special=True), ids))
    assert kept == "a<|im_start|> b<|im_end|>" and skipped == "a b" and out_ids == ids


def test_no_stop_string_ends_the_output_before_min_tokens(tok: HFTokenizer) -> None:
    """vLLM's rule: the first `min_tokens` tokens' text is never matched."""
    ids = tok.encode("a, b, c, d")
    early = joined(run(OutputDecoder(tok, [","], token_aligned=False), ids))[1]
    assert early == "a"
    held = OutputDecoder(tok, [","], token_aligned=False, min_tokens=3)
    out_ids, text = joined(run(held, ids))
    assert held.stop_string == "," and len(out_ids) >= 3
    assert text == "a, b" and ids[:len(out_ids)] == out_ids


@SETTINGS
@given(text=TEXTS, stops=STOPS)
def test_tgis_rule_stops_where_the_output_ends_with_a_stop(tok: HFTokenizer, text: str,
                                                         stops: list[str]) -> None:
    """TGI's stop rule (`stop_at_end`): the output stops after the first token at whose end the
    output so far ends with a stop string, that token the last; nowhere else."""
    ids = tok.encode(text)
    dec = OutputDecoder(tok, stops, token_aligned=True, keep_stop_token=True, stop_at_end=True,
                        text=None)
    out_ids, _ = joined(run(dec, ids))
    ends = [k for k in range(1, len(ids) + 1)
            if any(b"".join(tok.token_bytes(t) for t in ids[:k]).endswith(s.encode())
                   for s in stops)]
    assert out_ids == ids[:ends[0]] if ends else out_ids == ids
    assert (dec.stop_string is not None) == bool(ends)
