"""Chat templates applied in token space.

The model's Jinja template is rendered once per request with a unique marker in place of each
message's content. The rendered text is then cut at the markers: the pieces in between are the
template's own structure (role markers, separators), encoded with control-token parsing ON, and
each marker is replaced by that message's content ids exactly as serving built them (user text
encoded with parsing OFF, `input_tokens` blocks as sent). So sent ids reach the model untouched,
and a text and its canonical ids give the same prompt.

The structure and each content are encoded separately, as a control token would separate them
anyway; content that starts with whitespace right after a template newline may therefore
tokenize differently from encoding the whole rendered string at once (docs/api.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import InvalidRequestError
from ..tokenizers.hf import HFTokenizer

__all__ = ["ChatTemplate", "TemplateMessage"]

_MARK = "\ue000tw{}\ue001"  # private-use characters: no template or user text produces them
_MARK_RE = re.compile("\ue000tw(\\d+)\ue001")


class TemplateMessage:
    """A message as the template sees it: its role, its content as ids, and other fields
    templates may read (`name`, `tool_call_id`)."""

    __slots__ = ("extra", "ids", "role")

    def __init__(self, role: str, ids: Sequence[int], **extra: str):
        self.role = role
        self.ids = ids
        self.extra = extra


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    def __init__(self, source: str, tokenizer: HFTokenizer, *, bos_id: int | None,
                 eos_id: int | None, add_bos: bool):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(source)
        self._tok = tokenizer
        self._bos_id = bos_id
        self._add_bos = add_bos and bos_id is not None
        self._vars = {
            "bos_token": tokenizer.token_bytes(bos_id).decode() if bos_id is not None else "",
            "eos_token": tokenizer.token_bytes(eos_id).decode() if eos_id is not None else "",
        }
        self.source = source

    def render(self, messages: Sequence[TemplateMessage], *,
               add_generation_prompt: bool = True) -> list[int]:
        """The prompt ids of a conversation, ready for the engine."""
        marked: list[dict[str, Any]] = [
            {**m.extra, "role": m.role, "content": _MARK.format(i)}
            for i, m in enumerate(messages)
        ]
        try:
            text = self._template.render(messages=marked,
                                         add_generation_prompt=add_generation_prompt,
                                         **self._vars)
        except TemplateError as exc:
            raise InvalidRequestError(f"the model's chat template refused the messages: {exc}",
                                      param="messages") from exc
        ids: list[int] = []
        pos = 0
        for m in _MARK_RE.finditer(text):
            ids += self._tok.encode(text[pos:m.start()], parse_special=True)
            ids += messages[int(m.group(1))].ids
            pos = m.end()
        ids += self._tok.encode(text[pos:], parse_special=True)
        if self._add_bos and (not ids or ids[0] != self._bos_id):
            ids.insert(0, self._bos_id)  # type: ignore[arg-type]
        return ids
