"""Chat messages -> prompt ids: the checks, the ids they carry, and the token-space render.

Shared by the chat endpoint and /v1/tokenize, so tokenizing messages gives exactly the ids the
chat endpoint feeds the model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError, TokenwireError
from ..protocol.chat import ChatMessage, InputDocumentBlock, InputTokensBlock, TextBlock
from ..protocol.common import ResponseWarning
from ..protocol.render import MessageSpan
from ..protocol.tools import Tool, ToolCall
from ..tokenizers.conversions import conversion_reason
from .template import RESERVED, RESERVED_VARIABLES, ChatTemplate, Rendered, TemplateMessage
from .tokens import IdSpan, TokenSpace
from .toolcalls import HERMES, ToolFormat

__all__ = ["Conversation", "carries_ids", "check_messages", "check_tools", "drift_warnings",
           "ends_turn", "message_id_spans", "message_texts", "render_messages",
           "template_variables", "tool_texts"]


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
        if m.tool_calls is not None and m.role != "assistant":
            raise InvalidRequestError("only assistant messages may carry tool_calls",
                                      param=f"messages[{i}].tool_calls", code="invalid_value")
        if m.content is None and m.token_ids is None and not m.tool_calls:
            raise InvalidRequestError("a message needs content", param=f"messages[{i}].content",
                                      code="missing_required_parameter")
        if m.role == "tool" and m.tool_call_id is None:
            raise InvalidRequestError("a tool message needs the tool_call_id it answers",
                                      param=f"messages[{i}].tool_call_id",
                                      code="missing_required_parameter")
        if isinstance(m.content, list) and not m.content:
            raise InvalidRequestError("content must not be an empty array",
                                      param=f"messages[{i}].content", code="invalid_value")


def ends_turn(m: ChatMessage, special: frozenset[int]) -> bool:
    """An assistant message whose `token_ids` end with the control id the model sampled to end
    its turn (vLLM's `token_ids` keep it): the render puts it where the template closes the
    turn, and its `sampled_mask` marks it; anywhere else it is refused."""
    return m.role == "assistant" and bool(m.token_ids) and m.token_ids[-1] in special  # type: ignore[index]


def carries_ids(messages: Sequence[ChatMessage]) -> bool:
    """Does any message carry ids (`token_ids`, `input_tokens` blocks)? What the token space is
    resolved by; the spans themselves are built once, by the guard's checks."""
    for m in messages:
        c = m.content
        if m.token_ids is not None or isinstance(c, InputTokensBlock) or (
                isinstance(c, list) and any(isinstance(b, InputTokensBlock) for b in c)):
            return True
    return False


def message_id_spans(messages: Sequence[ChatMessage],
                     special: frozenset[int] = frozenset()) -> list[IdSpan]:
    """Every run of ids the messages carry, with its param path (an assistant's sampled end of
    turn, `ends_turn` with the `special` ids, left out: the render checks it). Documents must
    have been spliced in by then (only chat and its render read them from storage)."""
    spans = []
    for i, m in enumerate(messages):
        mine = m.role == "assistant"
        if m.token_ids is not None:
            ids = m.token_ids[:-1] if ends_turn(m, special) else m.token_ids
            spans.append(IdSpan(f"messages[{i}].token_ids", ids, mine))
            continue
        c = m.content
        for j, b in enumerate(c if isinstance(c, list) else [c]):
            if isinstance(b, InputDocumentBlock):
                at = f"[{j}]" if isinstance(c, list) else ""
                raise InvalidRequestError(
                    "input_document blocks are read by /v1/chat/completions (and its render) "
                    "only", param=f"messages[{i}].content{at}", code="invalid_value")
        if isinstance(c, InputTokensBlock):
            spans.append(IdSpan(f"messages[{i}].content.token_ids", c.token_ids, mine))
        elif isinstance(c, list):
            for j, b in enumerate(c):
                if isinstance(b, InputTokensBlock):
                    spans.append(IdSpan(f"messages[{i}].content[{j}].token_ids", b.token_ids,
                                        mine))
    return spans


def _content_ids(m: ChatMessage, space: TokenSpace, closed: bool = False) -> list[int]:
    """A message's content in the model's ids: text encoded with control tokens off, sent ids
    spliced as they are (or via text when translating); `closed`: its `token_ids` end with the
    end of turn it sampled, which the template puts in (`_turn_end`)."""
    enc = space.model.tokenizer.encode

    def from_ids(ids: list[int]) -> list[int]:
        if not space.translate:
            return list(ids)
        with conversion_reason("translate"):
            return enc(space.client.tokenizer.decode(ids))

    if m.token_ids is not None:
        return from_ids(m.token_ids[:-1] if closed else m.token_ids)
    c = m.content
    if isinstance(c, str):
        return enc(c)
    if isinstance(c, TextBlock):
        return enc(c.text)
    if isinstance(c, InputTokensBlock):
        return from_ids(c.token_ids)
    ids: list[int] = []
    for b in _blocks(c):
        ids += enc(b.text) if isinstance(b, TextBlock) else from_ids(b.token_ids)
    return ids


def _content_text(m: ChatMessage) -> str | None:
    """A content sent as one text (the template encodes it with the text around it)."""
    if m.token_ids is not None:
        return None
    c = m.content
    if isinstance(c, str):
        return c
    return c.text if isinstance(c, TextBlock) else None


def _blocks(c: object) -> list[TextBlock | InputTokensBlock]:
    """A content list once its documents were spliced in (`message_id_spans` refuses them
    before any content is read)."""
    if not isinstance(c, list):
        assert c is None, c
        return []
    assert not any(isinstance(b, InputDocumentBlock) for b in c)
    return c


def _check_client_text(value: Any, param: str) -> None:
    """A client string a template prints must not hold the characters that delimit content
    and client text in the rendering (they would let it pass as template structure)."""
    if isinstance(value, str):
        if RESERVED.search(value):
            raise InvalidRequestError(
                "this string holds a reserved character (U+E000 to U+E003)", param=param,
                code="invalid_value")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_client_text(k, param)
            _check_client_text(v, f"{param}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_client_text(v, f"{param}[{i}]")


@dataclass
class Conversation:
    """A rendered prompt and where every message went in it."""

    ids: list[int]
    spans: list[tuple[int, int, int]]
    """(message index, start, end) of each message's ids (its content, and for the default
    tool format its calls or its result wrapping); template structure is in no span."""
    sampled: list[int]
    """1 for each id that came from an assistant message's `token_ids`, else 0."""

    def message_spans(self, messages: Sequence[ChatMessage]) -> list[MessageSpan]:
        return [MessageSpan(message_index=i, role=messages[i].role, start=a, end=b)
                for i, a, b in self.spans]


def _template_call(c: ToolCall, param: str) -> dict[str, Any]:
    """A call as templates read it: vLLM's convention, `arguments` parsed when it is JSON (and
    checked again: JSON escapes can spell the reserved characters)."""
    try:
        args: Any = json.loads(c.function.arguments)
    except (json.JSONDecodeError, RecursionError):
        args = c.function.arguments
    _check_client_text(args, f"{param}.function.arguments")
    return {"id": c.id, "type": c.type, "function": {"name": c.function.name, "arguments": args}}


def template_variables(kwargs: dict[str, Any] | None,
                       template: ChatTemplate) -> dict[str, Any] | None:
    """A request's `chat_template_kwargs` as template variables (checked like every client
    string a template prints)."""
    if not kwargs:
        return None
    for key in kwargs:
        if key in RESERVED_VARIABLES:
            raise InvalidRequestError(
                f"{key!r} is set by the server; it cannot be a chat template variable",
                param=f"chat_template_kwargs.{key}", code="invalid_value")
    _check_client_text(kwargs, "chat_template_kwargs")
    return {k: template.client_text(v) for k, v in kwargs.items()}


def sampled_openings(messages: Sequence[ChatMessage], template: ChatTemplate,
                     variables: dict[str, Any] | None) -> dict[int, list[int]]:
    """What the template's generation prompt writes after the assistant's header that its
    history does not write back (DeepSeek-R1's `<think>\\n`, with `</think>` too when thinking
    is off; Qwen 3.5's `<think>\\n`: their history drops the reasoning), by the index of each
    assistant message sent as the ids it sampled: `render_messages` puts those ids back before
    them, so the next prompt is the last prompt and the sampled ids, exactly (a turn whose ids
    begin with them already is left as sent). History as ids under `keep_reasoning` (the
    default) is the ids as sampled, a turn cut inside its reasoning included; a client that
    sends an answer's ids alone says `keep_reasoning: false`, which puts nothing back."""
    turns = [i for i, m in enumerate(messages) if m.role == "assistant" and m.token_ids]
    if not turns:
        return {}
    probe = list((messages[turns[0]].token_ids or [])[:1])  # ids only: nothing is encoded
    user = TemplateMessage("user", probe)
    try:
        prompt = template.render([user], variables=variables).ids
        history = template.render([user, TemplateMessage("assistant", probe), user],
                                  add_generation_prompt=False, variables=variables)
    except TokenwireError:  # a template that will not render the probe: nothing to put back
        return {}
    at = next((a for k, a, _ in history.spans if k == 1), None)
    if at is None or prompt[:at] != history.ids[:at]:
        return {}
    opening = prompt[at:]
    return {i: opening for i in turns
            if opening and (messages[i].token_ids or [])[:len(opening)] != opening}


def render_messages(messages: Sequence[ChatMessage], space: TokenSpace,
                    template: ChatTemplate, *, tools: Sequence[Tool] = (),
                    add_generation_prompt: bool = True, continue_final: bool = False,
                    variables: dict[str, Any] | None = None, control_ids: bool = False,
                    content_ends: frozenset[int] = frozenset(),
                    fmt: ToolFormat = HERMES,
                    openings: Mapping[int, Sequence[int]] | None = None) -> Conversation:
    """The conversation in the model's ids. A template that renders tools gets them (and each
    call) as variables, its client strings marked as text; any other gets them in `fmt` (the
    model's tool format, Hermes's by default), rendered here as content text.
    `continue_final`: the prompt ends where the last message's ids end (no end of turn), so the
    model continues it.

    An assistant's `token_ids` that end with a control id end with its sampled end of turn
    (`ends_turn`), which must be the id the template closes the turn with; if it is not, a
    caller allowed control ids in messages (`control_ids`) has it kept as content (the
    messages in `content_ends`), anyone else is refused. `openings`: ids the generation prompt
    put before an assistant message's sampled ids (`<think>\\n`, where the template's prompt
    opens the reasoning and its history does not), put back before them, in no span and not
    sampled."""
    openings = openings or {}
    ended = {i: None if i in content_ends else _turn_end(m, i, space)
             for i, m in enumerate(messages)}  # each message's sampled end of turn, if any
    tool_vars = template.client_text(fmt.template_tools(tools)) \
        if tools and template.renders_tools else None
    while True:
        out, index = _template_messages(messages, space, template, tools, fmt, ended,
                                        continue_final, openings)
        r = template.render(out, add_generation_prompt=add_generation_prompt, tools=tool_vars,
                            variables=variables)
        if continue_final:
            _cut_after_final(r, index, len(messages))
        misplaced = _misplaced_end(r, index, ended)
        if misplaced is None:
            return _conversation(r, index, messages, ended, openings)
        i, end = misplaced
        if control_ids and not continue_final:
            ended[i] = None  # the model sampled it mid-turn: content; render again
            continue
        raise InvalidRequestError(
            f"messages[{i}].token_ids end with the control id {ended[i]}, but the "
            "chat template does not close the turn with it there"
            + (" (a message that ends its turn cannot be continued)"
               if continue_final and end >= len(r.ids) else ""),
            param=f"messages[{i}].token_ids[{len(messages[i].token_ids or []) - 1}]",
            code="invalid_value")


def _template_messages(messages: Sequence[ChatMessage], space: TokenSpace,
                       template: ChatTemplate, tools: Sequence[Tool], fmt: ToolFormat,
                       ended: Mapping[int, int | None], continue_final: bool,
                       openings: Mapping[int, Sequence[int]]
                       ) -> tuple[list[TemplateMessage], list[int]]:
    """What the template renders, and the message index of each (-1: one added here, the
    system message that gives a template that does not render tools their `fmt` text)."""
    out: list[TemplateMessage] = []
    index: list[int] = []
    rest = list(enumerate(messages))
    if tools and not template.renders_tools:
        enc = space.model.tokenizer.encode
        system = fmt.system_text(tools)
        if messages and messages[0].role in ("system", "developer"):
            first = messages[0]
            head = _content_ids(first, space, ended[0] is not None)
            text_ids = enc(("\n\n" if head else "") + system)
            out.append(TemplateMessage(first.role, head + text_ids,
                                       **_extras(first, template)))
            index.append(0)
            rest = rest[1:]
        else:
            out.append(TemplateMessage("system", enc(system)))
            index.append(-1)
    for i, m in rest:
        last = continue_final and i == len(messages) - 1
        out.append(_template_message(i, m, space, template, fmt, ended[i] is not None, last,
                                     openings.get(i)))
        index.append(i)
    return out, index


def _template_message(i: int, m: ChatMessage, space: TokenSpace, template: ChatTemplate,
                      fmt: ToolFormat, closed: bool, last: bool,
                      opening: Sequence[int] | None) -> TemplateMessage:
    """Message `i` as the template reads it: its content as text or ids, its calls and its
    other fields; `closed`: its ids end with its sampled end of turn; `last`: the continued
    prompt ends in it; `opening`: ids put back before it (`sampled_openings`)."""
    enc = space.model.tokenizer.encode
    native = template.renders_tools
    # a text content is encoded by the template, with the text around it (not one that
    # gets the default tool format's text here, nor the one a continued prompt ends in)
    hermes = not native and (bool(m.tool_calls and m.token_ids is None) or m.role == "tool")
    text = None if hermes or last else _content_text(m)
    ids = _content_ids(m, space, closed) \
        if text is None and (m.content is not None or m.token_ids is not None) else []
    extra = _extras(m, template)
    if m.reasoning is not None and m.token_ids is None:  # ids: the message as sampled
        extra["reasoning_content"] = template.client_text(m.reasoning)
    if m.tool_calls and m.token_ids is None:
        if native:
            extra["tool_calls"] = template.client_text(
                [_template_call(c, f"messages[{i}].tool_calls[{j}]")
                 for j, c in enumerate(m.tool_calls)])
        else:
            tail = fmt.calls_text("", m.tool_calls)
            ids = ids + enc(("\n" if ids else "") + tail)
    elif m.role == "tool" and not native:
        ids = enc(fmt.result_open) + ids + enc(fmt.result_close)
    if opening is not None:
        ids = [*opening, *ids]
    return TemplateMessage(m.role, ids, text=text, **extra)


def _cut_after_final(r: Rendered, index: Sequence[int], count: int) -> None:
    """`continue_final`: the rendering ends where the last message's ids end."""
    ends = [end for k, _, end in r.spans if index[k] == count - 1]
    if not ends or not count:
        raise InvalidRequestError(
            "continue_final_message needs a last message whose content the template "
            "prints", param="continue_final_message", code="invalid_value")
    cut = max(ends)
    r.ids = r.ids[:cut]
    r.spans = [(k, a, min(b, cut)) for k, a, b in r.spans if a < cut]


def _last_spans(r: Rendered, index: Sequence[int]) -> dict[int, int]:
    """Each message's last span in the rendering, by message index."""
    return {index[k]: n for n, (k, _, _) in enumerate(r.spans)}


def _misplaced_end(r: Rendered, index: Sequence[int],
                   ended: Mapping[int, int | None]) -> tuple[int, int] | None:
    """The first message (its index, and where its last span ends) whose ids end with its
    sampled end of turn where the template does not close the turn with that id."""
    last_span = _last_spans(r, index)
    for n, (k, _, end) in enumerate(r.spans):
        i = index[k]
        if i >= 0 and ended[i] is not None and last_span[i] == n \
                and (end >= len(r.ids) or r.ids[end] != ended[i]):
            return i, end
    return None


def _conversation(r: Rendered, index: Sequence[int], messages: Sequence[ChatMessage],
                  ended: Mapping[int, int | None],
                  openings: Mapping[int, Sequence[int]]) -> Conversation:
    """The rendering's spans by message (a sampled end of turn in its message's span, an
    opening put back out of it) and its sampled ids."""
    sampled = [0] * len(r.ids)
    spans = []
    last_span = _last_spans(r, index)
    for n, (k, start, end) in enumerate(r.spans):
        i = index[k]
        if i < 0:
            continue
        if ended[i] is not None and last_span[i] == n:
            end += 1  # the template's end of turn is the id the model sampled
        start += len(openings.get(i, ()))
        spans.append((i, start, end))
        if messages[i].token_ids is not None and messages[i].role == "assistant":
            sampled[start:end] = [1] * (end - start)
    return Conversation(r.ids, spans, sampled)


def _turn_end(m: ChatMessage, i: int, space: TokenSpace) -> int | None:
    """The sampled end-of-turn id an assistant message's `token_ids` end with (`ends_turn`),
    in the model's ids; None if they end otherwise."""
    if not ends_turn(m, space.client.tokenizer.special_ids):
        return None
    sent = m.token_ids[-1]  # type: ignore[index]
    if not space.translate:
        return sent
    name = space.client.tokenizer.token_str(sent)
    mapped = space.model.tokenizer.special_tokens.get(name)
    if mapped is None:
        raise InvalidRequestError(
            f"messages[{i}].token_ids end with the control token {name!r}, which the model's "
            "tokenizer does not have", param=f"messages[{i}].token_ids", code="invalid_value")
    return mapped


def _extras(m: ChatMessage, template: ChatTemplate) -> dict[str, Any]:
    """The message's other fields a template may print (checked by `check_tools`)."""
    return {key: template.client_text(getattr(m, key)) for key in ("name", "tool_call_id")
            if getattr(m, key) is not None}


def check_tools(tools: Sequence[Tool], messages: Sequence[ChatMessage]) -> None:
    """What a template may print beside contents: the tools, and each message's `name`,
    `tool_call_id`, `reasoning` and calls (parsed arguments are checked again when
    rendered)."""
    for i, t in enumerate(tools):
        _check_client_text(t.model_dump(exclude_none=True), f"tools[{i}]")
    for i, m in enumerate(messages):
        for key in ("name", "tool_call_id", "reasoning"):
            if getattr(m, key) is not None:
                _check_client_text(getattr(m, key), f"messages[{i}].{key}")
        for j, c in enumerate(m.tool_calls or []):
            _check_client_text(c.model_dump(), f"messages[{i}].tool_calls[{j}]")


def message_texts(messages: Sequence[ChatMessage], space: TokenSpace) -> list[str]:
    """Each message's content as text (ids decoded with their own version): what the content
    policy reads, whichever way the content was sent (the caller names the reason)."""
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
                               for b in _blocks(c)))
    return out


def tool_texts(tools: Sequence[Tool], messages: Sequence[ChatMessage]) -> list[tuple[str, str]]:
    """What the content policy reads beside the contents: the tool definitions, the
    arguments of the calls in history (tool results are the tool messages' content) and the
    reasoning of assistant history sent as text."""
    out = [(f"tools[{i}]", json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False))
           for i, t in enumerate(tools)]
    for i, m in enumerate(messages):
        if m.reasoning is not None:
            out.append((f"messages[{i}].reasoning", m.reasoning))
        for j, c in enumerate(m.tool_calls or []):
            out.append((f"messages[{i}].tool_calls[{j}].function.arguments",
                        c.function.arguments))
    return out


def drift_warnings(messages: Sequence[ChatMessage], space: TokenSpace,
                   template: ChatTemplate, fmt: ToolFormat = HERMES) -> list[ResponseWarning]:
    """Assistant messages whose `token_ids` are not what their text encodes to: the ids are
    used (they are what the model sampled), and the client learns where the two part."""
    with conversion_reason("drift"):
        return _drift(messages, space, template, fmt)


def _drift(messages: Sequence[ChatMessage], space: TokenSpace,
           template: ChatTemplate, fmt: ToolFormat) -> list[ResponseWarning]:
    enc = space.client.tokenizer.encode
    out = []
    for i, m in enumerate(messages):
        if m.role != "assistant" or m.token_ids is None:
            continue
        text = m.content if isinstance(m.content, str) else (
            m.content.text if isinstance(m.content, TextBlock) else None)
        if m.tool_calls and not template.renders_tools:
            text = fmt.calls_text(text or "", m.tool_calls)
        elif m.tool_calls or text is None:
            continue  # no text to compare (ids only, or calls a template renders itself)
        canonical = enc(text)
        sent = m.token_ids[:-1] if ends_turn(m, space.client.tokenizer.special_ids) \
            else m.token_ids
        if canonical == sent:
            continue
        pos = next((k for k, (a, b) in enumerate(zip(sent, canonical, strict=False)) if a != b),
                   min(len(sent), len(canonical)))
        have = sent[pos] if pos < len(sent) else None
        want = canonical[pos] if pos < len(canonical) else None
        out.append(ResponseWarning(
            code="token_drift", param=f"messages[{i}].token_ids", message_index=i,
            position=pos, token_id=have, canonical_token_id=want,
            message=f"messages[{i}].token_ids differ from the encoding of its content at "
                    f"position {pos} ({have} sent, {want} canonical); the sent ids were used"))
    return out
