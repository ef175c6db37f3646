"""A conversation continued from a stored turn's exact ids (`previous_response_id`).

The new prompt is the previous prompt, what the model sampled after it, the ids the template
closes that turn with, then the new turn as the template renders it: by construction, never by
encoding the history again, so an engine's prefix cache finds the whole previous turn. The
history is rendered once more only to learn how the template closes the previous turn (the
history alone, ending with it) and where the new turn begins (the whole conversation, after
that closing). What the template writes before the previous turn's end does not matter, so a
template that renders a turn one way when it is last and another when more follows (Qwen3's
empty reasoning block) continues as well; one that closes the turn differently when more
follows is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidRequestError
from .messages import Conversation

__all__ = ["PromptPrefix", "continued"]


@dataclass(frozen=True)
class PromptPrefix:
    prompt: list[int]
    """The previous prompt, exactly as the model read it (the model's ids)."""
    sampled: list[int]
    """What the model sampled after it (its stop id excluded: the template closes the turn)."""
    messages: int
    """How many leading messages of the request it stands for: the history the previous
    prompt was rendered from, and last the assistant message of what it sampled."""


def continued(prefix: PromptPrefix, conv: Conversation, head: Conversation) -> Conversation:
    """`conv` (every message, rendered) up to the end of the previous turn's closing replaced by
    the prefix's own ids and that closing (as `head`, the prefix's messages rendered alone, no
    generation prompt, ends)."""
    ends = [end for i, _, end in head.spans if i == prefix.messages - 1]
    there = [end for i, _, end in conv.spans if i == prefix.messages - 1]
    if not ends or not there:
        raise InvalidRequestError(
            "the model's chat template does not print the previous response's turn, so it "
            "cannot continue from its ids", param="previous_response_id", code="invalid_value")
    closing = head.ids[max(ends):]
    at = max(there)
    if conv.ids[at:at + len(closing)] != closing:
        raise InvalidRequestError(
            "the model's chat template closes the previous response's turn differently once "
            "more follows it, so it cannot continue from its ids: send the history as input "
            "instead", param="previous_response_id", code="invalid_value")
    rest = at + len(closing)
    kept = [*prefix.prompt, *prefix.sampled, *closing]
    shift = len(kept) - rest
    return Conversation(
        ids=kept + conv.ids[rest:],
        spans=[(i, a + shift, b + shift) for i, a, b in conv.spans if i >= prefix.messages],
        sampled=[0] * len(prefix.prompt) + [1] * len(prefix.sampled) + [0] * len(closing)
        + conv.sampled[rest:])
