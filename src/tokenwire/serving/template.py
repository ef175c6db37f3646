"""Chat templates applied in token space.

The model's Jinja template is rendered once per request with a unique marker in place of each
message's content. The rendered text is then cut at the markers: the pieces in between are the
template's own structure (role markers, separators), encoded with control-token parsing ON, and
each marker is replaced by that message's content ids exactly as serving built them (user text
encoded with parsing OFF, `input_tokens` blocks as sent). So sent ids reach the model untouched,
and a text and its canonical ids give the same prompt.

Every other client string a template can print (a message's `name`, `tool_call_id`, tool
definitions, call arguments) that holds a control token's text reaches it wrapped in another
pair of private-use characters; what the template prints between them is encoded with parsing
OFF, so the control token typed there stays text. Other strings are left as they are, so they
tokenize with the text around them, as Hugging Face's rendering does.

A template that trims a content (`| trim`, as Gemma's does) trims its marker; the content's
ids are then trimmed in token space: canonical ids (every text content) become the encoding of
the trimmed text, exactly what rendering the text and encoding the whole would give; other sent
ids lose only their whitespace tokens at the trimmed ends (an end token that mixes whitespace and
text is re-encoded without it), so the rest reach the model as sent.

The structure and each content are encoded separately, as a control token would separate them
anyway; content that starts with whitespace right after a template newline may therefore
tokenize differently from encoding the whole rendered string at once (docs/api.md).

The structure is the same few pieces in every request (`<|im_start|>user\n`, a default system
prompt), so each short piece's ids are kept once encoded: a warm server renders a conversation
sent as ids without encoding anything (the token-native path converts nothing, and
/metrics' `tokenwire_tokenizer_conversions_total` shows it).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
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
    expect)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@dataclass
class Rendered:
    ids: list[int]
    spans: list[tuple[int, int, int]]
    """(message index, start, end) of each message's content ids in `ids`, in prompt order (a
    template that prints a content twice gives two spans; one it drops, none)."""


class TemplateMessage:
    """A message as the template sees it: its role, its content as ids, and other fields
    templates may read (`name`, `tool_call_id`, `tool_calls`), already `client_text`."""

    __slots__ = ("extra", "ids", "role")

    def __init__(self, role: str, ids: Sequence[int], **extra: Any):
        self.role = role
        self.ids = ids
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
        marked: list[dict[str, Any]] = [
            {**m.extra, "role": m.role, "content": _MARK.format(i)}
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
        enc = self._tok.encode
        ids: list[int] = []
        spans: list[tuple[int, int, int]] = []
        pos = 0
        for m in _PIECE_RE.finditer(text):
            ids += self._structure(text[pos:m.start()])
            if m.group(1) is not None:
                i, ends = int(m.group(1)), m.group(2)
                content = self._trimmed(messages[i].ids, "l" in ends, "r" in ends) if ends \
                    else messages[i].ids
                spans.append((i, len(ids), len(ids) + len(content)))
                ids += content
            else:
                ids += enc(m.group(3))
            pos = m.end()
        ids += self._structure(text[pos:])
        if self._add_bos and (not ids or ids[0] != self._bos_id):
            ids.insert(0, self._bos_id)  # type: ignore[arg-type]
            spans = [(i, a + 1, b + 1) for i, a, b in spans]
        return Rendered(ids, spans)

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
