"""What the generating services share: their wiring, the token-space check of a request, and
the plan of a checked request (what its responses all carry)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..config import Settings
from ..protocol.common import ResponseWarning
from ..tokenizers.registry import TokenizerRegistry
from .guard import Guard
from .models import ModelRegistry, ServedModel
from .tokens import TokenSpace, resolve_token_space

__all__ = ["GenerationService", "Plan"]


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


class GenerationService:
    """Base of the chat and completions services."""

    def __init__(self, models: ModelRegistry, tokenizers: TokenizerRegistry, settings: Settings,
                 guard: Guard):
        self._models = models
        self._tokenizers = tokenizers
        self._settings = settings
        self._guard = guard

    def _space(self, model: ServedModel, version: str | None, fallback: str,
               carries_ids: bool) -> TokenSpace:
        return resolve_token_space(
            target=model.tokenizer_entry, target_name=f"model {model.id!r}",
            registry=self._tokenizers, version=version, fallback=fallback,
            carries_ids=carries_ids, require_version=self._settings.require_tokenizer_version)
