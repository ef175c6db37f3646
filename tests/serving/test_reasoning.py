"""The reasoning split on ids, with real tokenizers: Qwen 3.5's real vocabulary (its `<think>` and
`</think>` are single ids) with its real template, and SmolLM2's (no such token: the markers are
text over several ids)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.ggufmodels import qwen35_vocabulary
from tokenwire.serving.reasoning import Part, ReasoningSplitter, reasoning_format
from tokenwire.serving.template import ChatTemplate, TemplateMessage
from tokenwire.tokenizers.gguf import tokenizer_from_gguf
from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.source import TokenizerSource

THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
                  "{% if m.role == 'assistant' %}<think>\n</think>\n\n{% endif %}"
                  "{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n<think>\n")
"""A ChatML template whose generation prompt opens the reasoning, as Qwen 3.5's does."""


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> TokenizerSource:
    return tokenizer_from_gguf(qwen35_vocabulary(tmp_path_factory.mktemp("q") / "q35.gguf"))


def _split(splitter: ReasoningSplitter, ids: list[int],
           chunks: list[int] | None = None) -> list[tuple[Part, list[int]]]:
    out: list[tuple[Part, list[int]]] = []
    pos = 0
    for n in chunks or [len(ids)]:
        out += splitter.push(ids[pos:pos + n])
        pos += n
    out += splitter.push(ids[pos:]) + splitter.finish()
    merged: list[tuple[Part, list[int]]] = []
    for part, run in out:
        if merged and merged[-1][0] == part and part != "marker":
            merged[-1][1].extend(run)
        else:
            merged.append((part, list(run)))
    return merged


def test_qwen35_markers_are_ids(qwen: TokenizerSource, llama_cpp_models: Path) -> None:
    tok = qwen.tokenizer
    template = (llama_cpp_models / "templates" / "Qwen3.5-4B.jinja").read_text()
    fmt = reasoning_format(template, tok)
    assert fmt is not None and fmt.name == "qwen3"
    assert (fmt.start_id, fmt.end_id) == (248068, 248069)  # the package's ids for them
    prompt = ChatTemplate(template, tok, bos_id=None, eos_id=None, add_bos=False).render(
        [TemplateMessage("user", [], text="What is 2+2?")]).ids
    assert fmt.starts_inside(tok, prompt)  # the generation prompt opens <think>
    sampled = tok.encode("Two and two.\nSo 4.</think>\n\nIt is 4.", parse_special=True)
    parts = _split(ReasoningSplitter(tok, fmt, inside=True), sampled)
    assert [p for p, _ in parts] == ["reasoning", "marker", "content"]
    assert [i for _, run in parts for i in run] == sampled  # a partition, in order
    assert tok.decode(parts[0][1]) == "Two and two.\nSo 4."
    assert parts[1][1] == [fmt.end_id]
    assert tok.decode(parts[2][1]) == "\n\nIt is 4."


def test_text_markers_across_ids_and_pushes(tok: HFTokenizer) -> None:
    """SmolLM2 has no `<think>` token: its markers are several ids, found on their bytes
    whatever the pushes' boundaries, and never let out half-matched."""
    fmt = reasoning_format(THINK_TEMPLATE, tok)
    assert fmt is not None and fmt.start_id is None and fmt.end_id is None
    sampled = tok.encode("I add them: 4.</think>The answer is 4.")
    assert len(tok.encode("</think>")) > 1
    whole = _split(ReasoningSplitter(tok, fmt, inside=True), sampled)
    assert [p for p, _ in whole] == ["reasoning", "marker", "content"]
    assert [i for _, run in whole for i in run] == sampled
    assert "</think>" in tok.decode(whole[1][1])
    assert tok.decode(whole[2][1]).endswith("The answer is 4.")
    rng = random.Random(3)
    for _ in range(30):  # any chunking gives the same parts
        cuts = [rng.randint(0, 3) for _ in range(len(sampled))]
        assert _split(ReasoningSplitter(tok, fmt, inside=True), sampled, cuts) == whole


def test_a_partial_marker_is_held_then_released(tok: HFTokenizer) -> None:
    fmt = reasoning_format(THINK_TEMPLATE, tok)
    assert fmt is not None
    s = ReasoningSplitter(tok, fmt, inside=True)
    first = tok.encode("so 4 </")
    out = s.push(first)
    shown = [i for _, run in out for i in run]
    assert shown == first[:len(shown)] and len(shown) < len(first)  # "</" waits
    assert "</" not in tok.decode(shown)
    rest = s.push(tok.encode("thx")) + s.finish()  # not a marker after all
    assert [p for p, _ in rest] == ["reasoning"]
    assert shown + [i for _, run in rest for i in run] == first + tok.encode("thx")
    assert s.reasoning_ids == len(first) + len(tok.encode("thx"))


def test_outside_a_start_marker_opens_the_reasoning(qwen: TokenizerSource) -> None:
    tok = qwen.tokenizer
    fmt = reasoning_format(None, tok, name="qwen3")
    assert fmt is not None
    sampled = tok.encode("<think>hmm</think>ok", parse_special=True)
    parts = _split(ReasoningSplitter(tok, fmt, inside=False), sampled)
    assert [p for p, _ in parts] == ["marker", "reasoning", "marker", "content"]
    assert not fmt.starts_inside(tok, tok.encode("<think>a</think>b", parse_special=True))


def test_no_markers_no_format(tok: HFTokenizer, gguf_info: TokenizerSource) -> None:
    assert reasoning_format(gguf_info.chat_template, tok) is None


def test_a_character_cut_short_ends_with_its_part(tok: HFTokenizer) -> None:
    """Reasoning that ends inside a UTF-8 character (its last bytes never sampled) gets U+FFFD
    where the reasoning ends, before the marker: never after the answer (SmolLM2's byte ids)."""
    from tokenwire.engines.base import TokenEvent
    from tokenwire.serving.output import Delta
    from tokenwire.serving.reasoning import ReasoningStream

    byte = {tok.token_bytes(i): i for i in range(tok.vocab_size) if len(tok.token_bytes(i)) == 1}
    fmt = reasoning_format(None, tok, "deepseek_r1")
    assert fmt is not None and fmt.end_id is None  # text markers
    ids = tok.encode("hmm ") + [byte[b"\xe3"], byte[b"\x80"]] + tok.encode("</think>ok")
    stream = ReasoningStream(tok, fmt, inside=True)
    pieces = [p for i in ids for p in stream.push(Delta([i], "", [TokenEvent(i)]))]
    pieces += stream.push(Delta(), last=True)
    parts = [part for part, _ in pieces]
    assert parts[-1] == "content" and "reasoning" not in parts[parts.index("marker"):]
    assert "".join(d.text for p, d in pieces if p == "reasoning") == "hmm \ufffd"
    assert "".join(d.text for p, d in pieces if p == "content") == "ok"
    assert [i for _, d in pieces for i in d.ids] == ids
