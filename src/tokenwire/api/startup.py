"""What `tokenwire serve` does before the app serves, in the one process or in each worker:
logging configured, and the models loaded first so that a refusal to start is one clear line on
stderr (not a traceback from inside the server's lifespan)."""

from __future__ import annotations

import logging
import sys

from ..config import Settings
from ..errors import SetupError
from ..serving.loader import load_models
from ..serving.models import ModelRegistry
from ..tokenizers.registry import TokenizerRegistry

__all__ = ["configure_logging", "preload"]


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream request


async def preload(settings: Settings) -> tuple[ModelRegistry, TokenizerRegistry] | None:
    """The configured models, loaded; None after one clear line on stderr when they cannot
    be."""
    tokenizers = TokenizerRegistry(settings.tokenizer_store)
    tokenizers.load_store()
    models = ModelRegistry()
    try:
        for model in await load_models(settings, tokenizers):
            models.add(model)
    except (SetupError, OSError) as exc:
        print(f"tokenwire serve: not starting: {exc}", file=sys.stderr)
        return None
    return models, tokenizers
