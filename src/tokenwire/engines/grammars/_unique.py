"""`uniqueItems` on arrays of free strings, which no grammar library enforces (llguidance refuses
it, xgrammar drops it): taken out of the schema before llguidance compiles it, and kept here,
step by step, by banning every id that would close an item string equal to an earlier item.

Only arrays of free strings (`items: {"type": "string"}`, reached from the root through
`properties`, `items` and `prefixItems`): a free string can always go on instead, so a ban
never leaves the sampler with nothing. Any other `uniqueItems` stays in the schema, and
llguidance refuses it by name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Scanner", "split_unique"]

Path = tuple[str | int | None, ...]
"""Where an array is: property names, item indices (None: any item of an `items` array)."""
_FREE = frozenset({"type", "minLength", "title", "description", "examples", "default",
                   "$comment"})


def _free_string(items: Any) -> bool:
    return isinstance(items, dict) and items.get("type") == "string" and set(items) <= _FREE


def split_unique(schema: Any, at: Path = ()) -> tuple[Any, list[Path]]:
    """The schema without the `uniqueItems` kept here, and where those arrays are."""
    if not isinstance(schema, dict):
        return schema, []
    out = dict(schema)
    paths: list[Path] = []
    if out.get("uniqueItems") is False:
        del out["uniqueItems"]  # asks nothing
    elif out.get("uniqueItems") is True and _free_string(out.get("items")) \
            and "prefixItems" not in out:
        del out["uniqueItems"]
        paths.append(at)
    if isinstance(out.get("properties"), dict):
        props = {}
        for name, sub in out["properties"].items():
            props[name], more = split_unique(sub, (*at, name))
            paths += more
        out["properties"] = props
    if isinstance(out.get("items"), dict):
        out["items"], more = split_unique(out["items"], (*at, None))
        paths += more
    if isinstance(out.get("prefixItems"), list):
        items = []
        for i, sub in enumerate(out["prefixItems"]):
            sub, more = split_unique(sub, (*at, i))
            items.append(sub)
            paths += more
        out["prefixItems"] = items
    return out, paths


def _matches(path: Sequence[str | int], pattern: Path) -> bool:
    return len(path) == len(pattern) and all(
        p is None and isinstance(s, int) or s == p for s, p in zip(path, pattern, strict=True))


@dataclass
class _Frame:
    array: bool
    key: str | int = 0
    """An object's current key, an array's current index."""
    expect_key: bool = True
    unique: set[str] | None = None
    """An array kept unique: its items so far."""


@dataclass
class Scanner:
    """Follows a JSON document's bytes (valid: the grammar sees to it) to know when the output
    is inside an item string of an array kept unique."""

    patterns: list[Path]
    _stack: list[_Frame] = field(default_factory=list)
    _in_string: bool = False
    _is_key: bool = False
    _escape: bool = False
    _raw: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> None:
        for c in data:
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif c == 0x5C:  # backslash
                    self._escape = True
                elif c == 0x22:  # the closing quote
                    self._in_string = False
                    self._closed(json.loads(b'"' + bytes(self._raw) + b'"'))
                    continue
                self._raw.append(c)
            elif c == 0x22:
                self._in_string, self._raw = True, bytearray()
                self._is_key = bool(self._stack) and not self._stack[-1].array \
                    and self._stack[-1].expect_key
            elif c in b"{[":
                path = [f.key for f in self._stack]
                array = c == 0x5B
                unique: set[str] | None = set() if array and any(
                    _matches(path, p) for p in self.patterns) else None
                self._stack.append(_Frame(array=array, unique=unique))
            elif c in b"}]":
                self._stack.pop()
            elif c == 0x3A and self._stack:  # ':'
                self._stack[-1].expect_key = False
            elif c == 0x2C and self._stack:  # ','
                top = self._stack[-1]
                if top.array:
                    top.key = int(top.key) + 1
                else:
                    top.expect_key = True

    def _closed(self, value: str) -> None:
        top = self._stack[-1] if self._stack else None
        if top is None:
            return
        if self._is_key:
            top.key = value
        elif top.unique is not None:
            top.unique.add(value)

    def ban(self, logits: np.ndarray, closers: Sequence[tuple[int, bytes]]) -> None:
        """-inf over the ids that would close the current item string as a duplicate
        (`closers`: the ids whose bytes hold a quote, with those bytes)."""
        top = self._stack[-1] if self._stack else None
        if not self._in_string or self._is_key or top is None or not top.unique:
            return
        for token, data in closers:
            if logits[token] == -np.inf:
                continue
            escape, end = self._escape, -1
            for i, c in enumerate(data):
                if escape:
                    escape = False
                elif c == 0x5C:
                    escape = True
                elif c == 0x22:
                    end = i
                    break
            if end < 0:
                continue
            try:
                value = json.loads(b'"' + bytes(self._raw) + data[:end] + b'"')
            except ValueError:
                continue  # not a whole string (a cut escape or character): no duplicate yet
            if value in top.unique:
                logits[token] = -np.inf
