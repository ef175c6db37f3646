"""`TokenizerSource`, what a model's files say about its tokenizer: below both loaders (source.py
for Hugging Face files, gguf.py for GGUF), which build it, and re-exported by source.py."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .hf import HFTokenizer

__all__ = ["TokenizerSource", "legacy_family"]


@dataclass(frozen=True)
class TokenizerSource:
    """What the model's files say about its tokenizer, beside the tokenizer itself."""

    tokenizer: HFTokenizer
    chat_template: str | None
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    context_length: int | None
    name: str | None
    eog_ids: frozenset[int] | None = None
    """Ids that end generation, where the files say (generation_config.json); None for a GGUF,
    whose set is llama.cpp's to compute (the loader asks it)."""
    legacy_version: str | None = None
    """The id releases before the fingerprint gave this tokenizer: its family from the GGUF's
    `general.basename` or the folder's name, its hash the artifact's sha256. It still resolves,
    and is what data stored then names."""


def legacy_family(base: str, vocab_size: int) -> str:
    """A family as releases before the fingerprint named it from a name: `SmolLM2` + 49152 ->
    `smollm2-49k` (only `legacy_version` uses it now)."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-") or "tokenizer"
    return f"{slug}-{round(vocab_size / 1000)}k"
