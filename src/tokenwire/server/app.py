"""The ASGI application: wiring of registries, services, routes and error handlers."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette

from ..config import Settings
from ..serving.chat import ChatService
from ..serving.completions import CompletionService
from ..serving.loader import load_gguf_model
from ..serving.models import ModelRegistry
from ..serving.tokenize import TokenizeService
from ..tokenizers.registry import TokenizerRegistry
from .errors import exception_handlers
from .routes import routes

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, *, models: ModelRegistry | None = None,
               tokenizers: TokenizerRegistry | None = None) -> Starlette:
    """The app; with `models` given (tests), it serves those instead of loading a GGUF."""
    settings = settings or Settings()
    tokenizers = tokenizers or TokenizerRegistry(settings.tokenizer_store)
    preloaded = models is not None
    models = models or ModelRegistry()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        n = tokenizers.load_store()
        log.info("%d tokenizer versions in %s", n, settings.tokenizer_store)
        if not preloaded:
            models.add(await load_gguf_model(settings.model_path(), settings, tokenizers))
        for m in models.all():
            await m.engine.start()
        try:
            yield
        finally:
            for m in models.all():
                await m.engine.aclose()

    app = Starlette(routes=routes, exception_handlers=exception_handlers, lifespan=lifespan)
    app.state.settings = settings
    app.state.models = models
    app.state.tokenizers = tokenizers
    app.state.chat = ChatService(models, tokenizers, settings)
    app.state.completions = CompletionService(models, tokenizers, settings)
    app.state.tokenize = TokenizeService(models, tokenizers, settings)
    return app
