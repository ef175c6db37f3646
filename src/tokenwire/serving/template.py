"""Chat templates applied in token space.

The model's Jinja template is rendered once per request with a unique marker in place of each
message's content. The rendered text is then cut at the markers of the contents sent as ids: each
such marker is replaced by that message's ids exactly as serving built them (`input_tokens`
blocks, an assistant's `token_ids`), so sent ids reach the model untouched. Everything between
them, the template's own structure (role markers, separators, tool definitions) and the contents
sent as text, is encoded as one string with control-token parsing ON, exactly as llama.cpp and
Hugging Face encode a rendered prompt: so a conversation in text gets their ids, merges across a
content's edge included (Qwen's ".\n\n" after a system prompt, SentencePiece's dummy prefix after
a control token). A text content's span is the tokens wholly inside it; a token that straddles
its edge belongs to the structure. A text content that holds a control token's text is encoded
on its own with parsing OFF, as a content sent as ids is placed: a user cannot forge a turn by
typing its markers.

Every other client string a template can print (a message's `name`, `tool_call_id`, tool
definitions, call arguments) that holds a control token's text reaches it wrapped in another
pair of private-use characters; what the template prints between them is encoded with parsing
OFF, so the control token typed there stays text. Other strings are left as they are, so they
tokenize with the text around them, as Hugging Face's rendering does.

A template that trims a content (`| trim`, as Gemma's does) trims its marker; a text content is
trimmed as text; the ids of a content sent as ids are trimmed in token space: canonical ids
become the encoding of the trimmed text, exactly what rendering the text and encoding the whole
would give; other sent ids lose only their whitespace tokens at the trimmed ends (an end token
that mixes whitespace and text is re-encoded without it), so the rest reach the model as sent.

Ids placed between two stretches of text are a seam no merge crosses: text right after a content
sent as ids may tokenize differently from the same conversation sent as text (docs/api/chat.md).

The structure is the same few pieces in every request (`<|im_start|>user\n`, a default system
prompt), so each short piece's ids are kept once encoded: a warm server renders a conversation
sent as ids without encoding anything (the token-native path converts nothing, and
/metrics' `tokenwire_tokenizer_conversions_total` shows it).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import InvalidRequestError
from ..tokenizers.base import Tokenizer
from ..tokenizers.conversions import conversion_reason

__all__ = ["RESERVED", "RESERVED_VARIABLES", "ChatTemplate", "Rendered", "TemplateMessage"]

_MARK = "\ue000tw{}\ue001"  # private-use characters: no template produces them
_OPEN, _CLOSE = "\ue002", "\ue003"  # around client strings inside template variables
# a marker may carry `l`/`r`: the template trimmed that end of the content
_PIECE_RE = re.compile("\ue000tw(\\d+)([lr]*)\ue001|\ue002([^\ue003]*)\ue003")
_HEAD_MARK = re.compile("^\ue000tw(\\d+)([lr]*)\ue001")
_TAIL_MARK = re.compile("\ue000tw(\\d+)([lr]*)\ue001\\Z")
RESERVED = re.compile("[\ue000-\ue003]")
"""Characters a client string printed by a template may not hold (refused by serving)."""
RESERVED_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token",
                                "eos_token", "raise_exception", "strftime_now"})
"""Template variables serving sets itself (a request's `chat_template_kwargs` may not)."""
_KEPT_PIECES = 512
"""Structure pieces whose ids a template keeps (least recently used ones go)."""
_KEPT_CHARS = 1024
"""Longer structure pieces (a template printing tool definitions) are encoded every time."""


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Hugging Face's `tojson` (Jinja's own escapes HTML characters, which templates do not
    expect); a filter's lazy sequence (`tools | map(attribute='function')`, which llama.cpp's
    Jinja engine prints as a list) is a list."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys,
                      default=lambda o: list(o) if isinstance(o, Iterator) else _refuse(o))


def _refuse(o: Any) -> Any:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


@dataclass
class Rendered:
    ids: list[int]
    spans: list[tuple[int, int, int]]
    """(message index, start, end) of each message's content ids in `ids`, in prompt order (a
    template that prints a content twice gives two spans; one it drops, none)."""


class TemplateMessage:
    """A message as the template sees it: its role, its content as ids, and other fields
    templates may read (`name`, `tool_call_id`, `tool_calls`), already `client_text`;
    `text`: the content's text when it was sent as text (`ids` are then unused), which is
    encoded with the template's text around it."""

    __slots__ = ("extra", "ids", "role", "text")

    def __init__(self, role: str, ids: Sequence[int], *, text: str | None = None, **extra: Any):
        self.role = role
        self.ids = ids
        self.text = text
        self.extra = extra


def _trim(value: Any, chars: str | None = None) -> str:
    """Jinja's `trim`, and a content at either end of what it trims is marked to be trimmed
    there too (the marker stands for text the template does not see)."""
    text = str(value).strip(chars)
    if chars is not None:
        return text

    def flag(end: str) -> Any:
        return lambda m: f"\ue000tw{m.group(1)}{''.join(sorted(set(m.group(2) + end)))}\ue001"

    return _TAIL_MARK.sub(flag("r"), _HEAD_MARK.sub(flag("l"), text))


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strip(text: str, ends: str) -> str:
    text = text.lstrip() if "l" in ends else text
    return text.rstrip() if "r" in ends else text


class _Run:
    """The prompt as it is rendered: stretches of text (structure and text contents, encoded
    together when a content sent as ids or the end closes them) and ids placed as they are."""

    def __init__(self, template: ChatTemplate):
        self._template = template
        self._text: list[str] = []
        self._size = 0
        self._contents: list[tuple[int, int, int]] = []  # (message, start, end) in the text
        self._ids: list[int] = []
        self._spans: list[tuple[int, int, int]] = []

    def structure(self, text: str) -> None:
        self._text.append(text)
        self._size += len(text)

    def text(self, message: int, text: str) -> None:
        self._contents.append((message, self._size, self._size + len(text)))
        self.structure(text)

    def ids(self, message: int | None, ids: Sequence[int]) -> None:
        self._flush()
        if message is not None:
            self._spans.append((message, len(self._ids), len(self._ids) + len(ids)))
        self._ids += ids

    def _flush(self) -> None:
        if not self._size:
            for message, _, _ in self._contents:  # empty contents: empty spans
                self._spans.append((message, len(self._ids), len(self._ids)))
        else:
            ids, spans = self._template._encode_run("".join(self._text), self._contents)
            self._spans += [(i, a + len(self._ids), b + len(self._ids)) for i, a, b in spans]
            self._ids += ids
        self._text, self._size, self._contents = [], 0, []

    def finish(self) -> tuple[list[int], list[tuple[int, int, int]]]:
        self._flush()
        return self._ids, self._spans


class ChatTemplate:
    def __init__(self, source: str, tokenizer: Tokenizer, *, bos_id: int | None,
                 eos_id: int | None, add_bos: bool):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        env.filters["trim"] = _trim
        self._template = env.from_string(source)
        self._tok = tokenizer
        self._bos_id = bos_id
        self._add_bos = add_bos and bos_id is not None
        self._vars = {
            "bos_token": tokenizer.token_bytes(bos_id).decode() if bos_id is not None else "",
            "eos_token": tokenizer.token_bytes(eos_id).decode() if eos_id is not None else "",
        }
        self.source = source
        specials = sorted(tokenizer.special_tokens, key=len, reverse=True)
        self._special_re = re.compile("|".join(re.escape(t) for t in specials)) \
            if specials else None
        # a template that reads `tools` renders them (and calls) itself; others get ours
        self.renders_tools = re.search(r"\btools\b", source) is not None
        self._kept = lru_cache(maxsize=_KEPT_PIECES)(self._encode_structure)

    def _encode_structure(self, text: str) -> tuple[int, ...]:
        with conversion_reason("template"):
            return tuple(self._tok.encode(text, parse_special=True))

    def _structure(self, text: str) -> list[int]:
        """The ids of a piece of the template's own text (control-token parsing on)."""
        if not text:
            return []
        if len(text) > _KEPT_CHARS:
            return list(self._encode_structure(text))
        return list(self._kept(text))

    def render(self, messages: Sequence[TemplateMessage], *, add_generation_prompt: bool = True,
               tools: list[Any] | None = None, variables: dict[str, Any] | None = None,
               ) -> Rendered:
        """The prompt ids of a conversation, ready for the engine; `tools`: `client_text`
        definitions, for a template that `renders_tools`; `variables`: a request's
        `chat_template_kwargs` (`client_text`, none of `RESERVED_VARIABLES`)."""
        # an empty content beside calls the template prints is "", as it is to Hugging Face's
        # rendering (a marker would be a truthy content: Qwen3's writes a newline before a
        # call after one); elsewhere an empty content keeps its marker, so its (empty) span
        marked: list[dict[str, Any]] = [
            {**m.extra, "role": m.role, "content": "" if not (m.ids or m.text)
             and "tool_calls" in m.extra else _MARK.format(i)}
            for i, m in enumerate(messages)
        ]
        extra = {"tools": tools} if tools else {}
        try:
            text = self._template.render(**(variables or {}), messages=marked,
                                         add_generation_prompt=add_generation_prompt,
                                         **self._vars, **extra)
        except TemplateError as exc:
            raise InvalidRequestError(f"the model's chat template refused the messages: {exc}",
                                      param="messages") from exc
        run = _Run(self)
        pos = 0
        for m in _PIECE_RE.finditer(text):
            run.structure(text[pos:m.start()])
            if m.group(1) is not None:
                i, ends = int(m.group(1)), m.group(2)
                msg = messages[i]
                if msg.text is not None and not self._holds_control(msg.text):
                    run.text(i, _strip(msg.text, ends))
                elif msg.text is not None:  # typed control tokens stay text
                    run.ids(i, self._tok.encode(_strip(msg.text, ends)))
                else:
                    run.ids(i, self._trimmed(msg.ids, "l" in ends, "r" in ends) if ends
                            else msg.ids)
            else:
                run.ids(None, self._tok.encode(m.group(3)))
            pos = m.end()
        run.structure(text[pos:])
        ids, spans = run.finish()
        if self._add_bos and (not ids or ids[0] != self._bos_id):
            ids.insert(0, self._bos_id)  # type: ignore[arg-type]
            spans = [(i, a + 1, b + 1) for i, a, b in spans]
        return Rendered(ids, spans)

    def _holds_control(self, text: str) -> bool:
        return self._special_re is not None and self._special_re.search(text) is not None

    def _encode_run(self, text: str, contents: list[tuple[int, int, int]],
                    ) -> tuple[list[int], list[tuple[int, int, int]]]:
        """A stretch of structure and text contents as one string (parsing on), and each
        content's span: the tokens wholly inside its characters."""
        if not contents:
            return self._structure(text), []
        ids, offsets = self._tok.encode_offsets(text)  # client text: the caller's reason
        starts = [a for a, _ in offsets]
        ends = [b for _, b in offsets]  # both non-decreasing: tokens come in text order
        spans = []
        for i, start, end in contents:
            first = bisect.bisect_left(starts, start)
            spans.append((i, first, max(first, bisect.bisect_right(ends, end))))
        return ids, spans

    def _trimmed(self, ids: Sequence[int], left: bool, right: bool) -> Sequence[int]:
        """A content's ids with the whitespace at the trimmed ends gone (module docstring)."""
        tok = self._tok
        text = tok.decode(ids)
        want = text.lstrip() if left else text
        want = want.rstrip() if right else want
        if want == text:
            return ids
        if tok.encode(text) == list(ids):
            return tok.encode(want)
        out = list(ids)
        while left and out and not tok.decode(out[:1]).strip():
            del out[0]
        while right and out and not tok.decode(out[-1:]).strip():
            del out[-1]
        if left and out and (head := tok.decode(out[:1])) != head.lstrip():
            out[:1] = tok.encode(head.lstrip())
        if right and out and (tail := tok.decode(out[-1:])) != tail.rstrip():
            out[-1:] = tok.encode(tail.rstrip())
        return out

    def client_text(self, value: Any) -> Any:
        """A client value as a template variable: every string in it (keys too) that holds a
        control token's text marked, so that it is encoded as text."""
        if isinstance(value, str):
            if self._special_re is not None and self._special_re.search(value):
                return f"{_OPEN}{value}{_CLOSE}"
            return value
        if isinstance(value, dict):
            return {self.client_text(k): self.client_text(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.client_text(v) for v in value]
        return value

    def version(self, tool_format: str) -> str:
        """Content hash of what renders a prompt: this template and the tool format used with
        it (so a client knows when the rendering under its ids changed)."""
        digest = hashlib.sha256(f"{self.source}\0{tool_format}".encode()).hexdigest()
        return f"sha256:{digest[:16]}"
