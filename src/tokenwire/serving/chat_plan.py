"""A chat request's plan: what `ChatService.plan` (chat.py) makes of a request, once every
check passed and the prompt is built. Both response kinds (chat_response.py), the render
endpoint (chat_render.py), the Responses and Messages APIs read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..protocol.chat import ChatCompletionRequest
from ..protocol.common import Usage
from .generation import Totals
from .messages import Conversation
from .reasoning import ReasoningFormat
from .sampling_params import VllmParams
from .service import Plan
from .structured import Constraints
from .toolcalls import HERMES, CallParser

__all__ = ["ChatPlan"]


@dataclass(kw_only=True)
class ChatPlan(Plan):
    req: ChatCompletionRequest
    conv: Conversation
    constraints: Constraints
    budget: int
    prompt: list[int]
    """The rendered conversation, after `truncate_prompt_tokens`."""
    extras: VllmParams
    echo: str = ""
    """`echo`: the text the response's content starts with."""
    reasoning: tuple[ReasoningFormat, bool] | None = None
    """Where the model reasons: its format, and whether the prompt leaves it inside its
    reasoning (serving/reasoning.py)."""

    def usage(self, t: Totals) -> Usage:
        """The response's usage (`reasoning_tokens` where the model's reasoning is split)."""
        return Usage.of(len(self.prompt), t.sampled, t.cached.get(0),
                        t.reasoning if self.reasoning is not None else None)

    def envelope(self) -> dict[str, Any]:
        env = super().envelope()
        if self.shows_ids:
            env["template_version"] = self.model.template_version
        return env

    def parser(self) -> CallParser | None:
        if not self.constraints.parse_tools:
            return None
        return (self.model.tools or HERMES).parser()

    def finish_reason(self, reason: str | None, parser: CallParser | None) -> Any:
        """A choice that made calls ends with "tool_calls" (a named tool_choice: "stop", as
        OpenAI's); "length" stays "length"."""
        if reason == "stop" and parser is not None and parser.calls \
                and not self.constraints.named:
            return "tool_calls"
        return reason
