"""Chat's error params back in the terms of the API a request came in by.

The Responses and Messages APIs run their requests as chat requests; every check runs there
and names a chat field (`messages[3].content[0].token_ids[2]`). A `ParamMap`, filled while the
request is translated, says where each chat message came from, so the error names the field
the client sent (`input[1].content[0].token_ids[2]`, `messages[1].content[2]...`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import TokenwireError

__all__ = ["ParamMap"]


@dataclass
class ParamMap:
    """Where each chat message came from in the request (Responses' by default; the Messages
    API fills in its own names)."""

    messages: list[str] = field(default_factory=list)
    """Per chat message: its item's path (`instructions`, `input`, `input[3]`)."""
    content: list[str] = field(default_factory=list)
    """Per chat message: what its `content` is called there (`content`, `output`, "")."""
    calls: dict[int, list[str]] = field(default_factory=dict)
    """Per assistant message: the path of each of its `tool_calls`."""
    blocks: dict[int, list[int]] = field(default_factory=dict)
    """Per chat message whose content blocks were renumbered: each block's index there."""
    ids: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    """Per assistant message whose `token_ids` are its parts' ids one after another: where
    each part's ids start there, and the part's path."""

    top: tuple[tuple[str, str], ...] = (
        (r"messages", "input"), (r"tools\[(\d+)\]\.function", r"tools[\1]"),
        (r"max_completion_tokens", "max_output_tokens"),
        (r"response_format\.json_schema\.schema", "text.format.schema"),
        (r"response_format", "text.format"), (r"logprobs", "include"),
        (r"reasoning_effort", "reasoning.effort"))
    """Chat's other params, as patterns matched at the start up to a `.` or `[`, and their
    names here (the first that matches)."""

    call: tuple[tuple[str, str], ...] = (
        (".function.arguments", ".arguments"), (".function.name", ".name"), (".function", ""),
        (".id", ".call_id"))
    """A tool call's fields and their names here."""

    def rename(self, param: str) -> str:
        m = re.match(r"messages\[(\d+)\](.*)$", param, re.S)
        if m is None:
            for pattern, name in self.top:
                t = re.match(pattern + r"(?=$|[.\[])", param)
                if t is not None:
                    return t.expand(name) + param[t.end():]
            return param
        i, rest = int(m[1]), m[2]
        if i >= len(self.messages):
            return param
        t = re.match(r"\.token_ids\[(\d+)\](.*)$", rest, re.S)
        if t is not None and self.ids.get(i):
            k = int(t[1])
            start, path = [(a, p) for a, p in self.ids[i] if a <= k][-1]
            return f"{path}.token_ids[{k - start}]{t[2]}"
        c = re.match(r"\.tool_calls\[(\d+)\](.*)$", rest, re.S)
        if c is not None and int(c[1]) < len(self.calls.get(i, [])):
            tail = c[2]
            for old, new in self.call:
                if tail.startswith(old):
                    tail = new + tail[len(old):]
                    break
            return self.calls[i][int(c[1])] + tail
        if rest.startswith(".content"):
            name = self.content[i]
            rest = rest[len(".content"):]
            b = re.match(r"\[(\d+)\](.*)$", rest, re.S)
            if b is not None and i in self.blocks and int(b[1]) < len(self.blocks[i]):
                rest = f"[{self.blocks[i][int(b[1])]}]{b[2]}"
            rest = (f".{name}" if name else "") + rest
        return self.messages[i] + rest

    def prepend(self, n: int, path: str) -> None:
        """`n` chat messages now come first, all from `path` (a continuation's kept turns)."""
        self.messages[:0] = [path] * n
        self.content[:0] = [""] * n
        self.calls = {i + n: v for i, v in self.calls.items()}
        self.blocks = {i + n: v for i, v in self.blocks.items()}
        self.ids = {i + n: v for i, v in self.ids.items()}

    @contextlib.contextmanager
    def renaming(self) -> Iterator[None]:
        """An error raised inside names the request's own fields."""
        try:
            yield
        except TokenwireError as exc:
            self.translate(exc)
            raise

    def translate(self, exc: TokenwireError) -> TokenwireError:
        """The same error, its param (and the param quoted in its message) renamed."""
        if exc.param:
            new = self.rename(exc.param)
            exc.message = exc.message.replace(exc.param, new)
            exc.args = (exc.message,)
            exc.param = new
        return exc
