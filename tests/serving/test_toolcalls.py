"""The tool-call parser: however the text is split into pushes, the same content, calls and ids
come out, and every id goes out exactly once, in order."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from tokenwire.serving.output import Delta
from tokenwire.serving.toolcalls import HERMES, ToolCallParser

CALL = '<tool_call>\n{"name": "f", "arguments": {"a": "x}y", "b": [1, {"c": 2}]}}\n</tool_call>'
TEXTS = [
    "plain answer, no call \n",
    f"Let me look.\n{CALL}",
    f"{CALL}\n{CALL}\n",
    f"{CALL} and then some text",
    "<tool_call> not a call",
    '<tool_call>\n{"arguments": {"a": 1}, "name": "f"}\n</tool_call>',  # keys the other way
    '<tool_call>\n{"name": "f", "arguments": 7}\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": {"a": [1, 2',  # cut short
    "a < b <tool_ca",
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}} I will wait\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": {"a": 1</tool_call> Sorry.',
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\nthen more <tool_call> x',
    "Use   <tool_call> tags",
    f"{CALL}\nDone.  ",
]


def run(text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]], list[int], list]:
    p = ToolCallParser(HERMES)
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    content, ids, pieces = "", [], []
    for k, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        for d in (p.push(Delta(ids=[k], text=text[a:b])),):
            content += d.content
            ids += d.ids
            pieces += d.calls
    d = p.finish()
    content, ids, pieces = content + d.content, ids + d.ids, pieces + d.calls
    assert ids == list(range(len(bounds) - 1))
    calls = [(c.name, c.arguments) for c in p.calls]
    streamed = {}
    for piece in pieces:
        name, args = streamed.get(piece.index, ("", ""))
        streamed[piece.index] = (name + (piece.name or ""), args + piece.arguments)
    assert [streamed[k] for k in sorted(streamed)] == calls
    return content, calls, ids, pieces


@given(st.sampled_from(TEXTS), st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_any_split_gives_the_same_result(text: str, cuts: list[int]) -> None:
    content, calls, _, _ = run(text, cuts)
    whole_content, whole_calls, _, _ = run(text, [])
    assert (content, calls) == (whole_content, whole_calls)


def test_what_is_content_and_what_is_a_call() -> None:
    args = '{"a": "x}y", "b": [1, {"c": 2}]}'
    assert run(TEXTS[0], [])[:2] == (TEXTS[0], [])
    assert run(TEXTS[1], [])[:2] == ("Let me look.", [("f", args)])
    assert run(TEXTS[2], [])[:2] == ("", [("f", args), ("f", args)])
    assert run(TEXTS[3], [])[:2] == ("and then some text", [("f", args)])
    assert run(TEXTS[4], [])[:2] == ("<tool_call> not a call", [])
    assert run(TEXTS[5], [])[1] == [("f", json.dumps({"a": 1}))]
    assert run(TEXTS[6], [])[1] == [("f", "7")]
    assert run(TEXTS[7], [])[1] == [("f", '{"a": [1, 2')]  # as far as it got
    assert run(TEXTS[8], [])[:2] == ("a < b <tool_ca", [])
    # nothing the model wrote is dropped: text around a malformed call stays content
    assert run(TEXTS[9], [])[:2] == ("I will wait", [("f", '{"a": 1}')])
    assert run(TEXTS[10], [])[:2] == ("Sorry.", [("f", '{"a": 1')])
    assert run(TEXTS[11], [])[:2] == ("then more <tool_call> x", [("f", '{"a": 1}')])
    assert run(TEXTS[12], [])[:2] == ("Use   <tool_call> tags", [])
    assert run(TEXTS[13], [])[:2] == ("Done.  ", [("f", args)])
    # a second call cut short in its head (length): its text is content, never dropped
    assert run(f'{CALL}\n<tool_call>\n{{"na', [])[:2] == ('<tool_call>\n{"na', [("f", args)])


def test_ids_go_out_with_the_text_they_carry() -> None:
    """Whitespace before a tag waits with its ids until it is known to be content or syntax."""
    p = ToolCallParser(HERMES)
    first = p.push(Delta(ids=[0], text="Use  "))
    assert (first.content, first.ids) == ("Use", [])  # "  " may precede a call
    second = p.push(Delta(ids=[1], text="<tool_call> tags"))
    assert (second.content, second.ids) == ("  <tool_call> tags", [0, 1])
