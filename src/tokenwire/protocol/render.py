"""Wire models of POST /v1/chat/completions/render (vLLM's path and shape, plus spans)."""

from __future__ import annotations

from typing import Any

from ._base import ResponseModel
from .common import Ids, ResponseWarning

__all__ = ["MessageSpan", "RenderResponse"]


class MessageSpan(ResponseModel):
    message_index: int
    role: str
    start: int
    """Index into `token_ids` of the message's first id (its content; template structure such
    as role markers belongs to no message)."""
    end: int
    """One past its last id."""


class RenderResponse(ResponseModel):
    """vLLM's render answer (a body for /inference/v1/generate: `token_ids`, `sampling_params`)
    plus where each message went and which ids were sampled."""

    omit_if_none = frozenset({"warnings"})
    request_id: str
    token_ids: Ids
    """Exactly the prompt a chat request with this body runs with."""
    sampling_params: dict[str, Any]
    model: str
    stream: bool = False
    tokenizer_version: str
    template_version: str | None
    spans: list[MessageSpan]
    sampled_mask: list[int]
    """Per prompt id: 1 when it came from an assistant message's `token_ids` (what the model
    sampled, the loss mask of RL training), 0 for template, user and tool text."""
    warnings: list[ResponseWarning] | None = None
