"""Chat messages -> prompt ids: the checks, the ids they carry, and the token-space render.

Shared by the chat endpoint and /v1/tokenize, so tokenizing messages gives exactly the ids the
chat endpoint feeds the model.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidRequestError
from ..protocol.chat import ChatMessage, InputTokensBlock, TextBlock
from .template import ChatTemplate, TemplateMessage
from .tokens import IdSpan, TokenSpace

__all__ = ["check_messages", "message_id_spans", "message_texts", "render_messages"]


def check_messages(messages: Sequence[ChatMessage]) -> None:
    if not messages:
        raise InvalidRequestError("messages must contain at least one message",
                                  param="messages", code="invalid_value")
    for i, m in enumerate(messages):
        if m.token_ids is not None and m.role != "assistant":
            raise InvalidRequestError(
                "only assistant messages may carry token_ids; send other ids as an "
                "input_tokens content block", param=f"messages[{i}].token_ids",
                code="invalid_value")
        if m.content is None and m.token_ids is None:
            raise InvalidRequestError("a message needs content", param=f"messages[{i}].content",
                                      code="missing_required_parameter")
        if isinstance(m.content, list) and not m.content:
            raise InvalidRequestError("content must not be an empty array",
                                      param=f"messages[{i}].content", code="invalid_value")


def message_id_spans(messages: Sequence[ChatMessage]) -> list[IdSpan]:
    """Every run of ids the messages carry, with its param path."""
    spans = []
    for i, m in enumerate(messages):
        mine = m.role == "assistant"
        if m.token_ids is not None:
            spans.append(IdSpan(f"messages[{i}].token_ids", m.token_ids, mine))
            continue
        c = m.content
        if isinstance(c, InputTokensBlock):
            spans.append(IdSpan(f"messages[{i}].content.token_ids", c.token_ids, mine))
        elif isinstance(c, list):
            for j, b in enumerate(c):
                if isinstance(b, InputTokensBlock):
                    spans.append(IdSpan(f"messages[{i}].content[{j}].token_ids", b.token_ids,
                                        mine))
    return spans


def _content_ids(m: ChatMessage, space: TokenSpace) -> list[int]:
    """A message's content in the model's ids: text encoded with control tokens off, sent ids
    spliced as they are (or via text when translating)."""
    enc = space.model.tokenizer.encode

    def from_ids(ids: list[int]) -> list[int]:
        return enc(space.client.tokenizer.decode(ids)) if space.translate else list(ids)

    if m.token_ids is not None:
        return from_ids(m.token_ids)
    c = m.content
    if isinstance(c, str):
        return enc(c)
    if isinstance(c, TextBlock):
        return enc(c.text)
    if isinstance(c, InputTokensBlock):
        return from_ids(c.token_ids)
    ids: list[int] = []
    for b in c or []:
        ids += enc(b.text) if isinstance(b, TextBlock) else from_ids(b.token_ids)
    return ids


def render_messages(messages: Sequence[ChatMessage], space: TokenSpace,
                    template: ChatTemplate, *, add_generation_prompt: bool = True) -> list[int]:
    return template.render(
        [TemplateMessage(m.role, _content_ids(m, space),
                         **{k: v for k, v in (("name", m.name), ("tool_call_id", m.tool_call_id))
                            if v is not None})
         for m in messages],
        add_generation_prompt=add_generation_prompt)


def message_texts(messages: Sequence[ChatMessage], space: TokenSpace) -> list[str]:
    """Each message's content as text (ids decoded with their own version): what the content
    policy reads, whichever way the content was sent."""
    dec = space.client.tokenizer.decode
    out = []
    for m in messages:
        c = m.content
        if m.token_ids is not None:
            out.append(dec(m.token_ids))
        elif isinstance(c, str):
            out.append(c)
        elif isinstance(c, TextBlock):
            out.append(c.text)
        elif isinstance(c, InputTokensBlock):
            out.append(dec(c.token_ids))
        else:
            out.append("".join(b.text if isinstance(b, TextBlock) else dec(b.token_ids)
                               for b in c or []))
    return out
