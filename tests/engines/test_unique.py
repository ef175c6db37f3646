"""uniqueItems on arrays of free strings (engines/grammars/_unique.py): where it is kept, and
the ban."""

from __future__ import annotations

import numpy as np

from tokenwire.engines.grammars._unique import Scanner, split_unique

STRINGS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}


def test_only_arrays_of_free_strings_are_kept_here() -> None:
    schema = {"type": "object", "properties": {
        "tags": STRINGS,
        "rows": {"type": "array", "items": {"type": "object", "properties": {"t": STRINGS}}},
        "pair": {"prefixItems": [STRINGS]},
        "codes": {**STRINGS, "items": {"type": "string", "maxLength": 3}},  # may run out
        "nums": {**STRINGS, "items": {"type": "integer"}},
    }}
    rest, paths = split_unique(schema)
    assert paths == [("tags",), ("rows", None, "t"), ("pair", 0)]
    props = rest["properties"]
    assert "uniqueItems" not in props["tags"] and "uniqueItems" not in props["pair"][
        "prefixItems"][0]
    assert props["codes"]["uniqueItems"] and props["nums"]["uniqueItems"]  # for llguidance
    assert split_unique(STRINGS) == ({"type": "array", "items": {"type": "string"}}, [()])


def closers(*pieces: bytes) -> list[tuple[int, bytes]]:
    return list(enumerate(pieces))


def banned(scanner: Scanner, pieces: list[tuple[int, bytes]]) -> list[int]:
    logits = np.zeros(len(pieces), dtype=np.float32)
    scanner.ban(logits, pieces)
    return [int(i) for i in np.flatnonzero(np.isinf(logits))]


def test_an_item_equal_to_an_earlier_one_cannot_close() -> None:
    pieces = closers(b'"', b'",', b'b"]', b'\\"', b'"}')
    s = Scanner([("tags",)])
    s.feed(b'{"name": "a", "tags": ["a", "ab", "')
    assert banned(s, pieces) == []  # "" is new
    s.feed(b"a")
    assert banned(s, pieces) == [0, 1, 2, 4]  # "a" again, and 'b"]' would make "ab" again
    s.feed(b"b")
    assert banned(s, pieces) == [0, 1, 4]  # "ab" again; 'b"]' makes "abb", new
    s.feed(b'c"')
    assert banned(s, pieces) == []  # between items: nothing to close


def test_escapes_keys_and_other_arrays() -> None:
    pieces = closers(b'"', b'\\""', b'""')
    s = Scanner([("tags",)])
    s.feed(b'{"tags": ["x\\"", "x')
    assert banned(s, pieces) == [1]  # x, an escaped quote, the end: 'x"', the earlier item
    s.feed(b"\\")  # a pending escape: the next quote is the string's own, not its end
    assert banned(s, pieces) == [2]  # '""': the escaped quote, then the end: 'x"' again
    s.feed(b'n"], "other": ["x", "')  # another array: not kept unique
    assert banned(s, pieces) == []
    t = Scanner([("tags",)])
    t.feed(b'{"tags": ["k"], "k": {"tags": ["k", "')  # a deeper "tags": another path
    assert banned(t, closers(b'k"')) == []
