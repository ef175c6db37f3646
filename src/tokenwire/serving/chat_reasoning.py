"""A chat request's reasoning switches: `reasoning_effort` as the template's variables,
`keep_reasoning: false` (history without its reasoning), the reasoning blocks a template writes
of its own, and a grammar (or `thinking_token_budget`) that holds after the reasoning. The
reasoning split out of sampled ids is reasoning.py's."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..engines.base import Grammar, Thought
from ..errors import InvalidRequestError, UnsupportedParameterError
from ..protocol.chat import ChatCompletionRequest
from ..protocol.common import ResponseWarning
from ..tokenizers.base import Tokenizer
from .messages import Conversation
from .models import ServedModel
from .reasoning import ReasoningFormat
from .structured import Constraints
from .template import ChatTemplate
from .tokens import TokenSpace

__all__ = ["after_reasoning", "drop_reasoning", "reasoning_blocks_added", "thinking_switch"]


def thinking_switch(req: ChatCompletionRequest, model: ServedModel,
                    template: ChatTemplate) -> dict[str, Any] | None:
    """The template variables with `reasoning_effort` as vLLM passes it: to a template that
    reads it (gpt-oss's "Reasoning: high"), and as `enable_thinking` (false for "none", else
    true) to one with that switch, unless `chat_template_kwargs` set it. "none" also means
    `reasoning_effort: "none"`, Messages' `thinking: disabled`, Responses' `reasoning.effort:
    "none"`. A level the template cannot take (no `reasoning_effort` variable: Qwen3's has only
    the switch) is refused by name, never dropped."""
    kwargs, effort = dict(req.chat_template_kwargs or {}), req.reasoning_effort
    if effort is None:
        return req.chat_template_kwargs
    levels = re.search(r"\breasoning_effort\b", template.source) is not None
    switch = "enable_thinking" in template.source
    if levels:
        kwargs.setdefault("reasoning_effort", effort)
    elif effort != "none":
        raise UnsupportedParameterError(
            f"model {model.id!r}'s chat template takes no reasoning level (it reads no "
            "`reasoning_effort`)" + (": only 'none' turns its thinking off" if switch else ""),
            param="reasoning_effort")
    elif model.reasoning is None:
        return req.chat_template_kwargs  # nothing to turn off
    elif not switch:
        raise UnsupportedParameterError(
            f"model {model.id!r} reasons, and its chat template has no switch to turn that off "
            "(`enable_thinking`)", param="reasoning_effort")
    if switch:
        if effort == "none" and kwargs.get("enable_thinking", False) is not False:
            raise InvalidRequestError(
                "reasoning_effort 'none' turns thinking off, which chat_template_kwargs."
                "enable_thinking turns on", param="reasoning_effort", code="invalid_value")
        kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs


def drop_reasoning(req: ChatCompletionRequest, fmt: ReasoningFormat,
                   space: TokenSpace) -> ChatCompletionRequest:
    """`keep_reasoning: false`: each assistant turn without its reasoning (ids: cut out as
    ids, `ReasoningFormat.strip`; text: its `reasoning` not given to the template)."""
    if space.translate:
        raise UnsupportedParameterError(
            "keep_reasoning false cuts the reasoning out of the sent ids by the model's own "
            "marker ids, which ids of another tokenizer version do not have",
            param="keep_reasoning")
    tok = space.model.tokenizer
    messages = [m.model_copy(update={
        "reasoning": None,
        "token_ids": fmt.strip(tok, m.token_ids) if m.token_ids is not None else None})
        if m.role == "assistant" else m for m in req.messages]
    return req.model_copy(update={"messages": messages})


def reasoning_blocks_added(req: ChatCompletionRequest, conv: Conversation,
                           fmt: ReasoningFormat, tok: Tokenizer, openings: dict[int, list[int]],
                           kept: int) -> list[ResponseWarning]:
    """Assistant turns sent as sampled ids before which the template wrote a reasoning block of
    its own (Qwen 3.5's, for a turn after the last user message: `<think>\\n\\n</think>\\n\\n`):
    the ids are kept as sent, the model did not see that block, and the client is told which
    turn (the render endpoint's spans show where); not the first `kept` messages, which a
    continued response's own ids replace."""
    out = []
    for i, start, _ in conv.spans:
        m = req.messages[i]
        if m.role != "assistant" or not m.token_ids or i < kept:
            continue
        before = conv.ids[max(0, start - len(openings.get(i, ())) - 4):
                          start - len(openings.get(i, ()))]
        if fmt.end_id in before if fmt.end_id is not None else fmt.end in tok.decode(before):
            out.append(ResponseWarning(
                code="reasoning_block_added", param=f"messages[{i}]", message_index=i,
                message=f"the chat template wrote a reasoning block of its own before "
                        f"messages[{i}]'s sampled ids, which the model did not see there: "
                        "the prompt is not the last prompt and the sampled ids (send the turn "
                        "with keep_reasoning false, or as text)"))
    return out


def after_reasoning(req: ChatCompletionRequest, constraints: Constraints, model: ServedModel,
                    prompt: list[int], inside: bool) -> Constraints:
    """A grammar holds after the model's reasoning (on an engine that can say so), unless the
    prompt closed the reasoning already (Qwen3's `enable_thinking: false`); a reasoning budget
    (`thinking_token_budget`, vLLM's) is such a grammar too, which only bounds the thought."""
    fmt, grammar, budget = model.reasoning, constraints.grammar, req.thinking_token_budget
    if budget is not None and (fmt is None or not model.engine.info.grammar_after_reasoning):
        raise UnsupportedParameterError(
            f"model {model.id!r} does not reason" if fmt is None else
            f"model {model.id!r} is served by an engine that cannot bound its reasoning (the "
            "embedded engine can; vLLM with its own --reasoning-parser reads the field itself)",
            param="thinking_token_budget")
    if fmt is None or (grammar is None and budget is None) \
            or not model.engine.info.grammar_after_reasoning \
            or not (inside or not fmt.closed(model.tokenizer, prompt)):
        return constraints
    thought = Thought(fmt.start, fmt.end, inside, budget)
    return replace(constraints, grammar=replace(grammar or Grammar(param="thinking_token_budget"),
                                                reasoning=thought))
