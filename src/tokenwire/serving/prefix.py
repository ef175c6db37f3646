"""A conversation continued from a stored turn's exact ids (`previous_response_id`).

The new prompt is the previous prompt, what the model sampled after it, the ids the template
closes that turn with, then the new turn as the template renders it: by construction, never by
encoding the history again, so an engine's prefix cache finds the whole previous turn. The
history is rendered once more only to learn where the previous turn ends and how the template
closes it; that needs a template that renders a conversation prefix-stably (a longer
conversation starts with the ids of a shorter one, as ChatML's and Gemma's do). One that does
not is refused by name.
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
    """`conv` (every message, rendered) with its first `head.ids` (the prefix's messages
    rendered alone, no generation prompt) replaced by the prefix's own ids and the template's
    closing of the previous turn."""
    if conv.ids[:len(head.ids)] != head.ids:
        raise InvalidRequestError(
            "the model's chat template does not render this conversation as an extension of "
            "the previous response's, so it cannot continue from its ids: send the history as "
            "input instead", param="previous_response_id", code="invalid_value")
    ends = [end for i, _, end in head.spans if i == prefix.messages - 1]
    if not ends:
        raise InvalidRequestError(
            "the model's chat template does not print the previous response's turn, so it "
            "cannot continue from its ids", param="previous_response_id", code="invalid_value")
    closing = head.ids[max(ends):]
    kept = [*prefix.prompt, *prefix.sampled, *closing]
    shift = len(kept) - len(head.ids)
    return Conversation(
        ids=kept + conv.ids[len(head.ids):],
        spans=[(i, a + shift, b + shift) for i, a, b in conv.spans if i >= prefix.messages],
        sampled=[0] * len(prefix.prompt) + [1] * len(prefix.sampled) + [0] * len(closing)
        + conv.sampled[len(head.ids):])
