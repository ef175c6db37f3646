"""Thin routers: parse the body, call a service, render the result (JSON or SSE)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from ..metrics import CONTENT_TYPE, Metrics
from ..protocol._base import pack_ids
from ..protocol.anthropic import CountTokensRequest, MessagesRequest
from ..protocol.chat import ChatCompletionRequest
from ..protocol.common import IdsEncoding, ModelCard, ModelList, Version
from ..protocol.completions import CompletionRequest
from ..protocol.generate import GenerateRequest
from ..protocol.health import Health, ModelHealth
from ..protocol.responses import ResponsesRequest
from ..protocol.tokenize import (
    DetokenizeRequest,
    TokenizeRequest,
    TokenizerList,
    TranslateRequest,
)
from ..serving.anthropic import MessagesService, error_body
from ..serving.chat import ChatService
from ..serving.completions import CompletionService
from ..serving.generate import GenerateService
from ..serving.generation import StreamedResponse
from ..serving.models import ModelRegistry, ServedModel
from ..serving.responses import ResponsesService
from ..serving.tokenize import TokenizeService
from ._json import ModelResponse
from .handlers import ApiRoute, ErrorShape
from .middleware import caller_of
from .sse import SSEResponse
from .validation import parse_body

__all__ = ["routes"]

T = TypeVar("T")

ANTHROPIC_ERRORS = ErrorShape(lambda exc: error_body(exc).model_dump(mode="json"),
                              under="/v1/messages/")
"""The Messages API answers its errors in Anthropic's shape."""


class _ClientGone(Exception):
    pass


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run `work`, cancelling it if the client hangs up first (frees the engine at once)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # however the wait ended (the work, the client, this request cancelled), neither task
        # outlives it: both are cancelled and awaited (their outcome retrieved), so the work's
        # cleanup (closing what the engine admitted) has run before the response goes out
        for t in (task, watcher):
            t.cancel()  # a no-op on the one that is done
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task not in done:  # the client went first
        raise _ClientGone
    return task.result()


def _card(m: ServedModel, root: str | None = None) -> ModelCard:
    """vLLM's card; an adapter's names its base model as `parent` and its path as `root`."""
    return ModelCard(id=m.id, created=m.created, root=root or m.engine.info.model,
                     parent=m.parent, tokenizer_version=m.tokenizer_version,
                     max_model_len=m.max_model_len, template_version=m.template_version)


async def list_models(request: Request) -> Response:
    models: ModelRegistry = request.app.state.models
    return ModelResponse(ModelList(data=[*(_card(m) for m in models.all()),
                                         *(_card(m, path) for m, path in models.adapters())]))


async def get_model(request: Request) -> Response:
    models: ModelRegistry = request.app.state.models
    m = models.get(request.path_params["model"], param="model")
    root = dict((a.id, path) for a, path in models.adapters()).get(m.id) if m.adapter else None
    return ModelResponse(_card(m, root))


async def _respond(request: Request, req: IdsEncoding, stream: bool,
                   make_stream: Callable[[], Awaitable[StreamedResponse[Any]]],
                   make_whole: Callable[[], Awaitable[BaseModel]], *, typed: bool = False,
                   ) -> Response:
    """SSE for a stream (errors before the first chunk are still plain HTTP errors), else JSON;
    `typed`: the stream's events are framed with their `event:` type (Responses, Messages)."""
    packed = req.encoding_format == "base64"
    if stream:
        try:  # admission may wait (an upstream's prefill): a client gone meanwhile frees it
            events = await _unless_disconnected(request, make_stream())
        except _ClientGone:
            return Response(status_code=499)
        return SSEResponse(events, typed=typed, packed=packed)
    try:
        result = await _unless_disconnected(request, make_whole())
    except _ClientGone:
        return Response(status_code=499)
    return _answer(req, result)


def _answer(req: IdsEncoding, result: BaseModel) -> ModelResponse:
    """`result`, its ids as base64 where the request asked (`encoding_format`)."""
    return ModelResponse(pack_ids(result) if req.encoding_format == "base64" else result)


async def chat_completions(request: Request) -> Response:
    req = parse_body(await request.body(), ChatCompletionRequest)
    service: ChatService = request.app.state.chat
    caller = caller_of(request)
    return await _respond(request, req, req.stream, lambda: service.stream(req, caller),
                          lambda: service.create(req, caller))


async def responses(request: Request) -> Response:
    """OpenAI's Responses API, run on the chat service (typed SSE events when streaming)."""
    req = parse_body(await request.body(), ResponsesRequest)
    service: ResponsesService = request.app.state.responses
    caller = caller_of(request)
    return await _respond(request, req, bool(req.stream), lambda: service.stream(req, caller),
                          lambda: service.create(req, caller), typed=True)


async def messages(request: Request) -> Response:
    """Anthropic's Messages API, run on the chat service (its typed SSE events when streaming)."""
    req = parse_body(await request.body(), MessagesRequest)
    service: MessagesService = request.app.state.messages
    caller = caller_of(request)
    return await _respond(request, req, req.stream, lambda: service.stream(req, caller),
                          lambda: service.create(req, caller), typed=True)


async def count_tokens(request: Request) -> Response:
    req = parse_body(await request.body(), CountTokensRequest)
    service: MessagesService = request.app.state.messages
    return ModelResponse(await asyncio.to_thread(service.count_tokens, req, caller_of(request)))


async def render_chat(request: Request) -> Response:
    """vLLM's render: the prompt a chat request would run with, nothing generated."""
    req = parse_body(await request.body(), ChatCompletionRequest)
    service: ChatService = request.app.state.chat
    return _answer(req, await service.render(req, caller_of(request)))


async def completions(request: Request) -> Response:
    req = parse_body(await request.body(), CompletionRequest)
    service: CompletionService = request.app.state.completions
    caller = caller_of(request)
    return await _respond(request, req, req.stream, lambda: service.stream(req, caller),
                          lambda: service.create(req, caller))


async def generate(request: Request) -> Response:
    """vLLM's tokens-in/tokens-out endpoint (same request and response shapes)."""
    req = parse_body(await request.body(), GenerateRequest)
    service: GenerateService = request.app.state.generate
    caller = caller_of(request)
    return await _respond(request, req, bool(req.stream), lambda: service.stream(req, caller),
                          lambda: service.create(req, caller))


async def tokenize(request: Request) -> Response:
    req = parse_body(await request.body(), TokenizeRequest)
    service: TokenizeService = request.app.state.tokenize
    return _answer(req, service.tokenize(req, caller_of(request)))


async def detokenize(request: Request) -> Response:
    req = parse_body(await request.body(), DetokenizeRequest)
    service: TokenizeService = request.app.state.tokenize
    return ModelResponse(service.detokenize(req))


async def translate(request: Request) -> Response:
    req = parse_body(await request.body(), TranslateRequest)
    service: TokenizeService = request.app.state.tokenize
    return _answer(req, await asyncio.to_thread(service.translate, req))


async def list_tokenizers(request: Request) -> Response:
    service: TokenizeService = request.app.state.tokenize
    return ModelResponse(TokenizerList(data=service.list()))


async def get_tokenizer(request: Request) -> Response:
    service: TokenizeService = request.app.state.tokenize
    return ModelResponse(service.get(request.path_params["version"]))


async def tokenizer_artifact(request: Request) -> Response:
    """The portable tokenizer.json. Under its full version id the bytes never change, so it
    is cacheable forever; under an alias it must be revalidated (the alias may move)."""
    service: TokenizeService = request.app.state.tokenize
    art = service.artifact(request.path_params["version"])
    etag = f'"{art.sha256}"'
    headers = {
        "ETag": etag,
        "Cache-Control": "no-cache" if art.by_alias else "public, max-age=31536000, immutable",
        "X-Tokenwire-Sha256": art.sha256,
        "X-Tokenwire-Tokenizer-Version": art.version,
    }
    wanted = [t.strip() for t in request.headers.get("if-none-match", "").split(",")]
    if etag in wanted or "*" in wanted:
        return Response(status_code=304, headers=headers)
    return Response(art.data, media_type="application/json", headers=headers)


async def health(request: Request) -> Response:
    """200 while every model can serve; 503 when one cannot (no replica up). It needs no key;
    the details (replicas' addresses, the reasons) go only to a caller with a valid key, when
    keys are set."""
    models: ModelRegistry = request.app.state.models
    report = {m.id: m.engine.health() for m in models.all()}
    ok = bool(report) and all(h.ok for h in report.values())
    trusted = not request.app.state.settings.api_keys or caller_of(request).api_key is not None
    detail = {name: ModelHealth.model_validate(dataclasses.asdict(h))
              for name, h in report.items()
              if trusted and (h.replicas or h.engine_process or not h.ok)}
    body = Health(status="ok" if ok else "unavailable", models=detail or None)
    return ModelResponse(body, status_code=200 if ok else 503)


async def ping(request: Request) -> Response:
    """vLLM's (SageMaker's) health probe: the same answer as /health."""
    return await health(request)


async def version(request: Request) -> Response:
    return ModelResponse(Version(version=__version__))


async def tokenizer_info(request: Request) -> Response:
    """vLLM's `/tokenizer_info` (its only model's; here `?model=` picks one of several)."""
    models: ModelRegistry = request.app.state.models
    name = request.query_params.get("model")
    model = models.get(name, param="model") if name else models.only()
    service: TokenizeService = request.app.state.tokenize
    return ModelResponse(service.config(model))


async def metrics(request: Request) -> Response:
    """Prometheus' text format; the engines' queues are read now."""
    m: Metrics = request.app.state.metrics
    return Response(m.render(), media_type=CONTENT_TYPE)


routes = [
    Route("/health", health, methods=["GET"]),
    Route("/ping", ping, methods=["GET", "POST"]),
    Route("/version", version, methods=["GET"]),
    Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", get_model, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/chat/completions/render", render_chat, methods=["POST"]),
    Route("/v1/responses", responses, methods=["POST"]),
    ApiRoute("/v1/messages", messages, methods=["POST"], errors=ANTHROPIC_ERRORS),
    ApiRoute("/v1/messages/count_tokens", count_tokens, methods=["POST"],
             errors=ANTHROPIC_ERRORS),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/inference/v1/generate", generate, methods=["POST"]),
    Route("/v1/tokenize", tokenize, methods=["POST"]),
    Route("/v1/detokenize", detokenize, methods=["POST"]),
    # vLLM serves these two at the root
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/v1/tokenizers", list_tokenizers, methods=["GET"]),
    Route("/v1/tokenizers/translate", translate, methods=["POST"]),
    Route("/v1/tokenizers/{version:path}/tokenizer.json", tokenizer_artifact, methods=["GET"]),
    Route("/v1/tokenizers/{version:path}", get_tokenizer, methods=["GET"]),
]
