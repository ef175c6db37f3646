"""What an engine factory is given (`EngineSpec`): the settings, the pinned tokenizer and the ids
that end generation. Beside the engine interface (base.py), below the registry that picks a
factory by name, so an engine module never imports the registry."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Settings
from ..tokenizers.source import TokenizerSource

__all__ = ["EngineSpec"]


@dataclass(frozen=True)
class EngineSpec:
    """What an engine factory is given."""

    settings: Settings
    source: TokenizerSource
    """The pinned tokenizer (which the engine checks its own against at start) and what the
    model's files say: chat template, BOS/EOS."""
    eog_ids: frozenset[int]
    """The ids that end generation, as the model's files define them."""
