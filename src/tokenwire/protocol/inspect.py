"""Wire models of the token inspector's reads (GET /v1/inspect/...): a stored record as the
page at GET /inspect draws it, every id with its piece."""

from __future__ import annotations

from typing import Literal

from ._base import ResponseModel
from .common import WeightVersionSpan
from .render import MessageSpan
from .tokenize import TokenPiece

__all__ = ["InspectedPrompt", "InspectedSample", "Inspection"]


class InspectedPrompt(ResponseModel):
    omit_if_none = frozenset({"spans"})
    token_ids: list[int]
    """The prompt as the model read it."""
    pieces: list[TokenPiece]
    """One per id."""
    spans: list[MessageSpan] | None = None
    """Where each message's ids are (as the render's); null where the record cannot say."""
    sampled_mask: list[int]
    """Per id, 1 where the model sampled it in an earlier turn (ids sent back as they came)."""


class InspectedSample(ResponseModel):
    omit_if_none = frozenset({"logprobs", "weight_versions", "finish_reason"})
    index: int
    token_ids: list[int]
    """What the model sampled (its stop id excluded, as the response's `token_ids`)."""
    pieces: list[TokenPiece]
    logprobs: list[float] | None = None
    """Per id, its logprob, where the response carried logprobs for exactly these ids."""
    weight_versions: list[WeightVersionSpan] | None = None
    finish_reason: str | None = None


class Inspection(ResponseModel):
    omit_if_none = frozenset({"template_version", "note"})
    object: Literal["inspection"] = "inspection"
    kind: Literal["chat.completion", "response"]
    id: str
    model: str
    tokenizer_version: str
    template_version: str | None = None
    prompt: InspectedPrompt
    samples: list[InspectedSample]
    note: str | None = None
    """What the view cannot show, and why (e.g. spans of a prompt continued by id)."""
