"""A Responses request as the chat request it runs as, and chat's error params back in its terms.

Items become chat messages: `instructions` a leading system message, a string `input` one user
message, `message` items messages (`input_text`/`output_text` parts text blocks, `input_tokens`
parts as they are), `function_call_output` items tool messages. The assistant side of a turn
(consecutive assistant messages and `function_call` items) is one assistant message with its
calls; when every item of it carries `token_ids` (as a response returned them), their
concatenation is the message's `token_ids`, spliced verbatim.

Every check then runs once, in the chat service; an error names the chat field
(`messages[2].content[0].token_ids[3]`), and a `ParamMap` renames it (`input[1].content[0]...`).
"""

from __future__ import annotations

from typing import get_args

from ...errors import InvalidRequestError, UnsupportedParameterError
from ...protocol.chat import (
    ChatCompletionRequest,
    ChatMessage,
    ContentBlock,
    InputTokensBlock,
    TextBlock,
)
from ...protocol.responses import (
    INPUT_TOKEN_IDS,
    LOGPROBS,
    OUTPUT_TOKEN_IDS,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolChoice,
    InputTokensPart,
    MessageItem,
    OtherTool,
    OtherToolChoice,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)
from ...protocol.tools import (
    FunctionCall,
    FunctionDefinition,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaSpec,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolChoice,
)
from ..params import ParamMap

__all__ = ["check_request", "to_chat_request"]

_KNOWN_INCLUDES = (LOGPROBS, OUTPUT_TOKEN_IDS, INPUT_TOKEN_IDS)


def _blocks(parts: list[object]) -> list[ContentBlock]:
    out: list[ContentBlock] = []
    for p in parts:
        if isinstance(p, InputTokensPart):
            out.append(InputTokensBlock(type="input_tokens", token_ids=p.token_ids))
        else:
            out.append(TextBlock(type="text", text=p.text))  # type: ignore[attr-defined]
    return out


def _content(c: str | list[object]) -> str | list[ContentBlock]:
    return c if isinstance(c, str) else _blocks(c)


class _Turn:
    """The assistant side of one turn, gathered from its items."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.blocks: list[ContentBlock] = []
        self.text_path: str | None = None
        self.calls: list[ToolCall] = []
        self.call_paths: list[str] = []
        self.ids: list[int] = []
        self.starts: list[tuple[int, str]] = []
        self.with_ids: list[bool] = []

    def add(self, item: MessageItem | FunctionCallItem, path: str) -> None:
        self.paths.append(path)
        self.with_ids.append(item.token_ids is not None)
        self.starts.append((len(self.ids), path))
        self.ids += item.token_ids or []
        if isinstance(item, MessageItem):
            self.text_path = self.text_path or path
            c = _content(item.content)  # type: ignore[arg-type]
            self.blocks += [TextBlock(type="text", text=c)] if isinstance(c, str) else c
        else:
            self.calls.append(ToolCall(id=item.call_id, function=FunctionCall(
                name=item.name, arguments=item.arguments)))
            self.call_paths.append(path)

    def message(self) -> ChatMessage:
        if any(self.with_ids) and not all(self.with_ids):
            lacking = self.paths[self.with_ids.index(False)]
            raise InvalidRequestError(
                "token_ids are used only when every item of an assistant turn (its messages "
                "and function calls) carries them, as a response returned them",
                param=f"{lacking}.token_ids", code="invalid_value")
        content: str | list[ContentBlock] | None = self.blocks or None
        if self.blocks and all(isinstance(b, TextBlock) for b in self.blocks):
            content = "".join(b.text for b in self.blocks)  # type: ignore[union-attr]
        return ChatMessage(role="assistant", content=content, tool_calls=self.calls or None,
                           token_ids=self.ids if all(self.with_ids) else None)


def _messages(req: ResponsesRequest) -> tuple[list[ChatMessage], ParamMap]:
    pm = ParamMap()
    out: list[ChatMessage] = []

    def add(m: ChatMessage, path: str, content: str) -> None:
        out.append(m)
        pm.messages.append(path)
        pm.content.append(content)

    if req.instructions is not None:
        add(ChatMessage(role="system", content=req.instructions), "instructions", "")
    if isinstance(req.input, str):
        add(ChatMessage(role="user", content=req.input), "input", "")
        return out, pm
    turn: _Turn | None = None

    def close() -> None:
        nonlocal turn
        if turn is not None:
            pm.calls[len(out)] = turn.call_paths
            pm.ids[len(out)] = turn.starts
            add(turn.message(), turn.text_path or turn.paths[0], "content")
            turn = None

    for j, item in enumerate(req.input):
        path = f"input[{j}]"
        if isinstance(item, FunctionCallItem) or (isinstance(item, MessageItem)
                                                  and item.role == "assistant"):
            turn = turn or _Turn()
            turn.add(item, path)
            continue
        close()
        if isinstance(item, FunctionCallOutputItem):
            add(ChatMessage(role="tool", tool_call_id=item.call_id,
                            content=_content(item.output)), path, "output")  # type: ignore[arg-type]
        else:
            if item.token_ids is not None:
                raise InvalidRequestError(
                    "only assistant messages may carry token_ids; send other ids as an "
                    "input_tokens content part", param=f"{path}.token_ids", code="invalid_value")
            add(ChatMessage(role=item.role, content=_content(item.content)),  # type: ignore[arg-type]
                path, "content")
    close()
    if not req.input:
        raise InvalidRequestError("input must contain at least one item", param="input",
                                  code="invalid_value")
    return out, pm


def _tools(req: ResponsesRequest) -> list[Tool] | None:
    tools = []
    for i, t in enumerate(req.tools or []):
        if isinstance(t, OtherTool):
            raise UnsupportedParameterError(
                f"tool type {t.type!r} is not supported by this server (function tools only)",
                param=f"tools[{i}].type")
        tools.append(Tool(type="function", function=FunctionDefinition(
            name=t.name, description=t.description, parameters=t.parameters, strict=t.strict)))
    return tools or None


def _tool_choice(req: ResponsesRequest) -> ToolChoice | None:
    c = req.tool_choice
    if isinstance(c, OtherToolChoice):
        raise UnsupportedParameterError(
            f"tool_choice of type {c.type!r} is not supported by this server",
            param="tool_choice.type")
    if isinstance(c, FunctionToolChoice):
        return NamedToolChoice.model_validate({"type": "function", "function": {"name": c.name}})
    return c


def _response_format(req: ResponsesRequest) -> ResponseFormat | None:
    if req.text is None:
        return None
    if req.text.verbosity not in (None, "medium"):
        raise UnsupportedParameterError("'text.verbosity' is not supported by this server",
                                        param="text.verbosity")
    f = req.text.format
    if isinstance(f, TextFormatJsonSchema):
        return JsonSchemaFormat(type="json_schema", json_schema=JsonSchemaSpec.model_validate(
            {"name": f.name, "description": f.description, "schema": f.schema_,
             "strict": f.strict}))
    if isinstance(f, TextFormatJsonObject):
        return JsonObjectFormat(type="json_object")
    return None


EFFORTS: tuple[str, ...] = get_args(
    get_args(ChatCompletionRequest.model_fields["reasoning_effort"].annotation)[0])
"""chat's `reasoning_effort` levels (vLLM's)."""


def check_request(req: ResponsesRequest) -> None:
    """What only a Responses request can get wrong (the chat service checks the rest)."""
    for name, neutral in type(req).unsupported.items():
        if getattr(req, name) not in neutral:
            raise UnsupportedParameterError(f"{name!r} is not supported by this server",
                                            param=name)
    for key, value in (req.reasoning or {}).items():
        if key == "effort":
            if value is not None and value not in EFFORTS:
                raise InvalidRequestError(f"reasoning.effort must be one of {', '.join(EFFORTS)}",
                                          param="reasoning.effort", code="invalid_value")
        elif value is not None:  # summary, generate_summary
            raise UnsupportedParameterError("reasoning summaries are not made by this server",
                                            param=f"reasoning.{key}")
    seen: set[str] = set()
    for i, item in enumerate(req.input if isinstance(req.input, list) else []):
        if item.id is not None:  # kept responses list their items by id (`after`)
            if item.id in seen:
                raise InvalidRequestError(f"two input items have the id {item.id!r}",
                                          param=f"input[{i}].id", code="invalid_value")
            seen.add(item.id)
    for i, entry in enumerate(req.include or []):
        if entry not in _KNOWN_INCLUDES:
            raise UnsupportedParameterError(
                f"include entry {entry!r} is not supported by this server (supported: "
                f"{', '.join(_KNOWN_INCLUDES)})", param=f"include[{i}]")


def to_chat_request(req: ResponsesRequest) -> tuple[ChatCompletionRequest, ParamMap]:
    check_request(req)
    messages, pm = _messages(req)
    logprobs = req.includes(LOGPROBS)
    chat = ChatCompletionRequest(
        model=req.model, messages=messages, tokenizer_version=req.tokenizer_version,
        min_weight_version=req.min_weight_version, max_staleness=req.max_staleness,
        tokenizer_fallback=req.tokenizer_fallback,
        response_format_tokens=req.includes(OUTPUT_TOKEN_IDS),
        return_token_ids=req.includes(INPUT_TOKEN_IDS),
        logprobs=logprobs, top_logprobs=req.top_logprobs if logprobs else None,
        temperature=req.temperature, top_p=req.top_p, seed=req.seed,
        max_completion_tokens=req.max_output_tokens, stream=bool(req.stream),
        tools=_tools(req), tool_choice=_tool_choice(req),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        response_format=_response_format(req),
        reasoning_effort=(req.reasoning or {}).get("effort"),
    )
    return chat, pm
