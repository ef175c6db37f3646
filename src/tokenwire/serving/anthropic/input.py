"""A Messages request as the chat request it runs as, and chat's error params back in its terms.

`system` becomes a leading system message (its blocks as they are, never joined); each message
its chat messages in order: a user message's `tool_result` blocks become tool messages where
they stand, its other blocks user messages; an assistant message's `text` and `tool_use` blocks
one assistant message with its calls. When every block of an assistant message carries
`token_ids` (as a response returned them), their concatenation is the message's `token_ids`,
spliced verbatim (its calls are not rendered again). A last assistant message is continued
(Anthropic's prefill): the prompt ends inside it.

Every check then runs once, in the chat service; `ParamMap` renames the chat field it names
(`messages[3].content[0].token_ids[2]` -> `messages[1].content[2].content[0].token_ids[2]`).
"""

from __future__ import annotations

import json

from pydantic import BaseModel

from ...errors import InvalidRequestError, UnsupportedParameterError
from ...protocol.anthropic import (
    AnthropicMessage,
    CountTokensRequest,
    MessagesRequest,
    ServerTool,
    TextParam,
    TokenIdsParam,
    ToolResultParam,
    ToolUseParam,
)
from ...protocol.chat import (
    ChatCompletionRequest,
    ChatMessage,
    ContentBlock,
    InputTokensBlock,
    TextBlock,
)
from ...protocol.common import ResponseWarning
from ...protocol.tools import (
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    JsonSchemaSpec,
    NamedToolChoice,
    Tool,
    ToolCall,
    ToolChoice,
)
from ..params import ParamMap

__all__ = ["chat_messages", "chat_tools", "check_request", "is_error_warning", "to_chat_request"]

_TOP = (
    (r"max_completion_tokens", "max_tokens"), (r"stop", "stop_sequences"),
    (r"tools\[(\d+)\]\.function\.parameters", r"tools[\1].input_schema"),
    (r"tools\[(\d+)\]\.function", r"tools[\1]"), (r"tool_choice\.function", "tool_choice"),
    (r"parallel_tool_calls", "tool_choice.disable_parallel_tool_use"),
    (r"response_format\.json_schema\.schema", "output_config.format.schema"),
    (r"response_format", "output_config.format"), (r"user", "metadata.user_id"),
    (r"reasoning_effort", "thinking"), (r"thinking_token_budget", "thinking.budget_tokens"),
)
_CHOICE: dict[str, ToolChoice] = {"auto": "auto", "any": "required", "none": "none"}
_CALL = ((".function.arguments", ".input"), (".function.name", ".name"), (".function", ""),
         (".id", ".id"))


def _block(b: TextParam | TokenIdsParam) -> ContentBlock:
    if isinstance(b, TokenIdsParam):
        return InputTokensBlock(type="input_tokens", token_ids=b.token_ids)
    return TextBlock(type="text", text=b.text)


def _neutral(model: BaseModel, path: str) -> None:
    """A field of `model` tokenwire does not implement holds a value that leaves it off."""
    for name, neutral in getattr(model, "unsupported", {}).items():
        if getattr(model, name) not in neutral:
            raise UnsupportedParameterError(f"{name!r} is not supported by this server",
                                            param=f"{path}.{name}")


def _check_text(b: TextParam, path: str, *, assistant: bool) -> None:
    _neutral(b, path)
    if b.token_ids is not None and not assistant:
        raise InvalidRequestError(
            "only an assistant message's blocks may carry token_ids; send other ids as a "
            "token_ids block", param=f"{path}.token_ids", code="invalid_value")


def _some(m: AnthropicMessage, path: str) -> None:
    if m.content == []:
        raise InvalidRequestError("a message needs content (a string or blocks)",
                                  param=f"{path}.content", code="invalid_value")


class _Messages:
    """The chat messages, and where each came from."""

    def __init__(self) -> None:
        self.out: list[ChatMessage] = []
        self.pm = ParamMap(top=_TOP, call=_CALL)
        self.errors: list[str] = []
        """The paths of `tool_result` blocks with `is_error` (said in a warning)."""

    def add(self, m: ChatMessage, path: str, content: str,
            blocks: list[int] | None = None) -> None:
        if blocks is not None:
            self.pm.blocks[len(self.out)] = blocks
        self.out.append(m)
        self.pm.messages.append(path)
        self.pm.content.append(content)

    def system(self, system: str | list[TextParam | TokenIdsParam]) -> None:
        if isinstance(system, str):
            self.add(ChatMessage(role="system", content=system), "system", "")
            return
        for j, b in enumerate(system):
            if isinstance(b, TextParam):
                _check_text(b, f"system[{j}]", assistant=False)
        self.add(ChatMessage(role="system", content=[_block(b) for b in system]), "system", "")

    def user(self, m: AnthropicMessage, path: str) -> None:
        _some(m, path)
        if isinstance(m.content, str):
            self.add(ChatMessage(role="user", content=m.content), path, "content")
            return
        held: list[tuple[int, ContentBlock]] = []

        def flush() -> None:
            if held:
                self.add(ChatMessage(role="user", content=[b for _, b in held]), path,
                         "content", [j for j, _ in held])
                held.clear()

        for j, b in enumerate(m.content):
            at = f"{path}.content[{j}]"
            if isinstance(b, ToolResultParam):
                flush()
                self._result(b, at)
            elif isinstance(b, ToolUseParam):
                raise InvalidRequestError("tool_use blocks belong to assistant messages",
                                          param=f"{at}.type", code="invalid_value")
            else:
                if isinstance(b, TextParam):
                    _check_text(b, at, assistant=False)
                held.append((j, _block(b)))
        flush()

    def _result(self, b: ToolResultParam, path: str) -> None:
        _neutral(b, path)
        content: str | list[ContentBlock]
        if b.content is None or isinstance(b.content, str):
            content = b.content or ""
        else:
            for k, c in enumerate(b.content):
                if isinstance(c, TextParam):
                    _check_text(c, f"{path}.content[{k}]", assistant=False)
            content = [_block(c) for c in b.content]
        if b.is_error:
            self.errors.append(path)
        self.add(ChatMessage(role="tool", tool_call_id=b.tool_use_id, content=content), path,
                 "content")

    def assistant(self, m: AnthropicMessage, path: str, *, last: bool) -> None:
        _some(m, path)
        if isinstance(m.content, str):
            self.add(ChatMessage(role="assistant", content=m.content), path, "content")
            return
        blocks: list[tuple[int, ContentBlock]] = []
        calls: list[ToolCall] = []
        call_paths: list[str] = []
        for j, b in enumerate(m.content):
            at = f"{path}.content[{j}]"
            if isinstance(b, ToolResultParam):
                raise InvalidRequestError("tool_result blocks belong to user messages",
                                          param=f"{at}.type", code="invalid_value")
            if isinstance(b, ToolUseParam):
                _neutral(b, at)
                if last:
                    raise InvalidRequestError(
                        "a last assistant message is continued (prefill); a tool call in it "
                        "cannot be: send its tool_result after it", param=at,
                        code="invalid_value")
                calls.append(ToolCall(id=b.id, function=FunctionCall(
                    name=b.name, arguments=json.dumps(b.input, ensure_ascii=False))))
                call_paths.append(at)
            else:
                if isinstance(b, TextParam):
                    _check_text(b, at, assistant=True)
                blocks.append((j, _block(b)))
        # ids on its text and tool_use blocks make the message its ids (token_ids blocks
        # count as ids there); then every such block must carry them
        with_ids = any(b.token_ids is not None for b in m.content
                       if isinstance(b, TextParam | ToolUseParam))
        if with_ids:
            for j, b in enumerate(m.content):
                if isinstance(b, TextParam | ToolUseParam) and b.token_ids is None:
                    raise InvalidRequestError(
                        "token_ids are used only when every block of an assistant message "
                        "carries them, as a response returned them",
                        param=f"{path}.content[{j}].token_ids", code="invalid_value")
            blocks = [(j, b) for j, b in blocks if isinstance(b, TextBlock)]
        ids: list[int] = []
        if with_ids:  # where each block's ids start, for errors that name one of them
            starts = []
            for j, b in enumerate(m.content):
                starts.append((len(ids), f"{path}.content[{j}]"))
                ids += b.token_ids
            self.pm.ids[len(self.out)] = starts
        content: str | list[ContentBlock] | None = [b for _, b in blocks] or None
        if content and all(isinstance(b, TextBlock) for b in content):
            content = "".join(b.text for b in content)  # type: ignore[union-attr]
        self.pm.calls[len(self.out)] = call_paths
        self.add(ChatMessage(role="assistant", content=content, tool_calls=calls or None,
                             token_ids=ids if with_ids else None),
                 path, "content", None if isinstance(content, str) else [j for j, _ in blocks])


def chat_messages(req: CountTokensRequest) -> tuple[list[ChatMessage], ParamMap, list[str]]:
    """The request's chat messages, their param map, and the `is_error` results' paths."""
    ms = _Messages()
    if req.system is not None:
        ms.system(req.system)
    if not req.messages:
        raise InvalidRequestError("messages must contain at least one message",
                                  param="messages", code="invalid_value")
    for i, m in enumerate(req.messages):
        if m.role == "user":
            ms.user(m, f"messages[{i}]")
        else:
            ms.assistant(m, f"messages[{i}]", last=i == len(req.messages) - 1)
    return ms.out, ms.pm, ms.errors


def chat_tools(req: CountTokensRequest) -> tuple[list[Tool] | None, ToolChoice | None, bool]:
    """The tools, the tool choice and whether calls may come in parallel."""
    tools = []
    for i, t in enumerate(req.tools or []):
        if isinstance(t, ServerTool):
            raise UnsupportedParameterError(
                f"tool type {t.type!r} is not supported by this server (client tools only: "
                "'custom')", param=f"tools[{i}].type")
        _neutral(t, f"tools[{i}]")
        tools.append(Tool(type="function", function=FunctionDefinition(
            name=t.name, description=t.description, parameters=t.input_schema,
            strict=t.strict)))
    c = req.tool_choice
    if c is None:
        return tools or None, None, True
    parallel = not getattr(c, "disable_parallel_tool_use", False)
    if c.type == "tool":
        return tools or None, NamedToolChoice.model_validate(
            {"type": "function", "function": {"name": c.name}}), parallel
    return tools or None, _CHOICE[c.type], parallel


def check_request(req: CountTokensRequest) -> None:
    """What only a Messages request can get wrong (the chat service checks the rest)."""
    for name, neutral in type(req).unsupported.items():
        if getattr(req, name) not in neutral:
            raise UnsupportedParameterError(f"{name!r} is not supported by this server",
                                            param=name)
    if req.output_config is not None:
        _neutral(req.output_config, "output_config")
    _thinking(req)


def _thinking(req: CountTokensRequest) -> int | None:
    """`thinking` as vLLM's Messages API reads it (anthropic/serving.py): `enabled` is a
    reasoning budget of `budget_tokens`, `disabled` turns thinking off, `adaptive` pins
    nothing; anything else is refused by name."""
    t = req.thinking
    if t is None or t == {"type": "disabled"} or t == {"type": "adaptive"}:
        return None
    if not isinstance(t, dict) or t.get("type") != "enabled":
        raise InvalidRequestError("thinking.type must be 'enabled', 'disabled' or 'adaptive'",
                                  param="thinking.type", code="invalid_value")
    budget = t.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise InvalidRequestError("thinking.budget_tokens must be a non-negative integer",
                                  param="thinking.budget_tokens", code="invalid_value")
    for key in t:
        if key not in ("type", "budget_tokens"):
            raise UnsupportedParameterError(f"{key!r} is not supported by this server",
                                            param=f"thinking.{key}")
    return budget


def is_error_warning(paths: list[str]) -> ResponseWarning:
    return ResponseWarning(
        code="tool_error_not_rendered", param=f"{paths[0]}.is_error",
        message="the chat template has no field for a failed tool call: is_error results are "
                "rendered as their content says (" + ", ".join(paths) + ")")


def to_chat_request(req: MessagesRequest) -> tuple[ChatCompletionRequest, ParamMap, list[str]]:
    check_request(req)
    messages, pm, errors = chat_messages(req)
    tools, choice, parallel = chat_tools(req)
    fmt = req.output_config.format if req.output_config is not None else None
    prefill = req.messages[-1].role == "assistant"
    chat = ChatCompletionRequest(
        model=req.model, messages=messages, tokenizer_version=req.tokenizer_version,
        min_weight_version=req.min_weight_version, max_staleness=req.max_staleness,
        tokenizer_fallback=req.tokenizer_fallback,
        response_format_tokens=req.response_format_tokens,
        return_token_ids=req.return_token_ids,
        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed,
        max_completion_tokens=req.max_tokens, stop=req.stop_sequences, stream=req.stream,
        tools=tools, tool_choice=choice, parallel_tool_calls=parallel,
        response_format=JsonSchemaFormat(type="json_schema", json_schema=JsonSchemaSpec(
            name="output", schema=fmt.schema_)) if fmt is not None else None,  # type: ignore[call-arg]
        user=req.metadata.user_id if req.metadata is not None else None,
        add_generation_prompt=not prefill, continue_final_message=prefill,
        reasoning_effort="none" if req.thinking == {"type": "disabled"} else None,
        thinking_token_budget=_thinking(req),
    )
    return chat, pm, errors
