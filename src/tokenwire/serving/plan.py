"""A checked generation request on its way to the engine, and what its responses all carry."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..protocol.common import ResponseWarning
from .models import ServedModel
from .tokens import TokenSpace

__all__ = ["Plan"]


@dataclass(kw_only=True)
class Plan:
    model: ServedModel
    space: TokenSpace
    shows_ids: bool
    """The request asked for ids back (either dialect)."""
    id: str
    warnings: list[ResponseWarning] | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def out_ids(self, ids: list[int], text: str) -> list[int]:
        """Output ids in the client's version (re-encoded from text when translating)."""
        return self.space.client.tokenizer.encode(text) if self.space.translate else ids

    def envelope(self) -> dict[str, Any]:
        """The fields every response (or chunk) of this request carries."""
        env: dict[str, Any] = {"id": self.id, "created": self.created, "model": self.model.id}
        if self.shows_ids:
            env["tokenizer_version"] = self.space.client.version
            env["token_ids_source"] = self.space.source
        return env
