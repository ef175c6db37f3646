"""GET /inspect: the token inspector, a page that shows one conversation as tokens
(docs/inspector.md). Its script and styles ship in the package (static/inspector/) and are
served from here: the page loads nothing from elsewhere and needs no build step. What it draws
comes from the API: the render, detokenize's pieces, and the two reads below of stored
records."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from ..errors import NotFoundError
from ..serving.inspect import InspectService
from ._json import ModelResponse
from .middleware import caller_of
from .records import path_param, query_params, stored_completions, stored_responses

__all__ = ["inspector_routes"]

_STATIC = Path(__file__).parent / "static" / "inspector"
_ASSETS = {
    "inspect.js": "text/javascript; charset=utf-8",
    "inspect.css": "text/css; charset=utf-8",
}


async def page(request: Request) -> Response:
    return FileResponse(_STATIC / "inspect.html", media_type="text/html; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in _ASSETS:
        raise NotFoundError(f"no inspector asset {name!r}")
    # revalidated each time (ETag): a new release's page never runs an old script
    return FileResponse(_STATIC / name, media_type=_ASSETS[name],
                        headers={"Cache-Control": "no-cache"})


async def inspect_completion(request: Request) -> Response:
    query_params(request, ())  # none is known: one sent is a 400 naming it
    service: InspectService = request.app.state.inspect
    return ModelResponse(await service.completion(
        path_param(request, "completion_id"), caller_of(request), stored_completions(request)))


async def inspect_response(request: Request) -> Response:
    query_params(request, ())
    service: InspectService = request.app.state.inspect
    return ModelResponse(await service.response(
        path_param(request, "response_id"), caller_of(request), stored_responses(request)))


inspector_routes = [
    Route("/inspect", page, methods=["GET"]),
    Route("/inspect/assets/{name}", asset, methods=["GET"]),
    Route("/v1/inspect/completions/{completion_id}", inspect_completion, methods=["GET"]),
    Route("/v1/inspect/responses/{response_id}", inspect_response, methods=["GET"]),
]
