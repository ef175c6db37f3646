"""The ASGI application: wiring of registries, services, routes and error handlers."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware

from .._heap import freeze_heap, thaw_heap, trim_heap
from ..config import LOOPBACK_HOSTS, Settings
from ..errors import SetupError
from ..metrics import Metrics
from ..policy import load_policy
from ..serving.anthropic import MessagesService
from ..serving.chat import ChatService
from ..serving.completions import CompletionService
from ..serving.control import ControlService
from ..serving.documents import DocumentService
from ..serving.generate import GenerateService
from ..serving.guard import Guard
from ..serving.inspect import InspectService
from ..serving.loader import load_models
from ..serving.models import ModelRegistry
from ..serving.responses import ResponsesService, StoredResponses
from ..serving.stored_completions import StoredCompletions
from ..serving.tgi import TGIService
from ..serving.tinker import TinkerService
from ..serving.tokenize import TokenizeService
from ..storage import Store, open_store
from ..storage.retention import expire_forever
from ..tokenizers.registry import TokenizerRegistry
from .control import control_routes
from .docs import docs_routes
from .handlers import exception_handlers
from .inspector import inspector_routes
from .loop import upkeep
from .middleware import ApiKeyAuth, BodyLimit, RequestMetrics
from .records import record_routes
from .routes import routes
from .tgi import tgi_routes
from .tinker import tinker_routes

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, *, models: ModelRegistry | None = None,
               tokenizers: TokenizerRegistry | None = None) -> Starlette:
    """The app; with `models` given (preloaded by the CLI, or tests), it serves those instead
    of loading the configured models at start."""
    settings = settings or Settings()
    tokenizers = tokenizers or TokenizerRegistry(settings.tokenizer_store)
    preloaded = models is not None
    models = models or ModelRegistry()
    metrics = Metrics()  # this app's own registry: apps in one process never share series
    for m in models.all():
        metrics.attach(m.id, m.engine)
    # the store opens on its first use (the file, or the pool and the migrations): the
    # services get it at construction, and the end of lifespan closes it
    store = _open_store(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if not settings.api_keys and settings.host not in LOOPBACK_HOSTS:
            log.warning("listening on %s without API keys: anyone who can reach it may use it "
                        "(set TOKENWIRE_API_KEYS)", settings.host)
        log.info("raw prompts with control ids (completions ids, /inference/v1/generate): %s",
                 "allowed" if settings.raw_prompts_allowed(None) else
                 f"only for {len(settings.raw_prompt_keys)} key(s)"
                 if settings.raw_prompts == "auto" and settings.raw_prompt_keys else
                 "refused")
        n = tokenizers.load_store()
        log.info("%d tokenizer versions in %s", n, settings.tokenizer_store)
        if not preloaded:
            for loaded in await load_models(settings, tokenizers):
                models.add(loaded)
                metrics.attach(loaded.id, loaded.engine)
        for m in models.all():
            await m.engine.start()
        trim_heap()
        freeze_heap()
        watch = asyncio.create_task(upkeep(metrics))
        refresh = asyncio.create_task(_refresh(metrics)) if metrics.shared else None
        days = settings.storage_retention_days
        expire = asyncio.create_task(expire_forever(store, days)) \
            if store is not None and days is not None else None
        try:
            yield
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            if expire is not None:  # done before the store closes under it
                expire.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await expire
            if refresh is not None:
                refresh.cancel()
                metrics.close()
            for m in models.all():
                await m.engine.aclose()
            if app.state.tinker is not None:
                await app.state.tinker.aclose()
            if store is not None:
                await store.aclose()
            thaw_heap()

    served = [*routes, *record_routes, *docs_routes, *inspector_routes, *control_routes,
              *tinker_routes, *tgi_routes]
    app = Starlette(
        routes=served, exception_handlers=exception_handlers, lifespan=lifespan,
        # outermost first: every answer is counted, refusals included; a request without a
        # valid key is refused before its body is read
        middleware=[Middleware(RequestMetrics, metrics=metrics, routes=served),
                    # an admin key is an API key too (admin_keys make a server keyed)
                    Middleware(ApiKeyAuth, keys=[*settings.api_keys, *settings.admin_keys]),
                    Middleware(BodyLimit, max_bytes=settings.max_body_bytes)],
    )
    app.state.settings = settings
    app.state.models = models
    app.state.tokenizers = tokenizers
    app.state.metrics = metrics
    guard = Guard(settings, load_policy(settings.content_policy))
    app.state.stored = StoredCompletions(store, tokenizers) if store is not None else None
    app.state.documents = DocumentService(store, models, tokenizers) \
        if store is not None else None
    app.state.chat = ChatService(models, tokenizers, settings, guard, metrics,
                                 stored=app.state.stored, documents=app.state.documents)
    app.state.completions = CompletionService(models, tokenizers, settings, guard, metrics)
    app.state.generate = GenerateService(models, tokenizers, settings, guard, metrics,
                                         stored=app.state.stored)
    app.state.responses = ResponsesService(
        models, tokenizers, settings, guard, metrics, chat=app.state.chat,
        stored=StoredResponses(store) if store is not None else None)
    app.state.tokenize = TokenizeService(models, tokenizers, settings, guard)
    app.state.messages = MessagesService(models, tokenizers, settings, guard, metrics,
                                         chat=app.state.chat, tokenize=app.state.tokenize)
    app.state.control = ControlService(models, settings)
    app.state.inspect = InspectService(tokenizers, app.state.chat)
    app.state.tgi = TGIService(models, app.state.generate, settings)
    app.state.tinker = TinkerService(models, app.state.generate, settings) \
        if _has_tinker() else None
    return app


def _has_tinker() -> bool:
    """Tinker's API is served where its schema is installed (the `tinker` extra)."""
    return importlib.util.find_spec("tinker") is not None


async def _refresh(metrics: Metrics) -> None:
    """A worker of `--workers` writes its engine readings for the others' scrapes."""
    while True:
        metrics.refresh()
        await asyncio.sleep(1.0)


def _open_store(settings: Settings) -> Store | None:
    url = settings.storage_url()
    if url is None:
        log.info("storage: none (store and documents are refused)")
        if settings.storage_retention_days is not None:
            log.warning("storage_retention_days is set but storage is none: nothing is kept")
        return None
    try:
        store = open_store(url)
    except ValueError as exc:
        raise SetupError(f"storage: {exc}") from exc
    days = settings.storage_retention_days
    log.info("storage: %s; completions and responses kept %s",
             url.split("@")[-1],  # never the password of a URL
             "until deleted" if days is None else f"{days:g} days")
    return store
