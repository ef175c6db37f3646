"""The single place where exceptions become HTTP responses, each in the shape of the API
family whose route was asked: a route says its family's (`ApiRoute.errors`, Anthropic's on
the Messages routes, TGI's on its routes, with TGI's statuses), every other answer is
OpenAI's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route
from starlette.types import Scope

from ..errors import (
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    TokenwireError,
    internal_error,
)

__all__ = ["OPENAI_ERRORS", "ApiRoute", "ErrorShape", "exception_handlers", "render_error",
           "shape_of"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ErrorShape:
    """How one API family writes an error."""

    body: Callable[[TokenwireError], Any]
    under: str | None = None
    """A path under this that no route matches (a mistyped path of the family's) is answered
    in this shape too."""
    status: Callable[[TokenwireError], int] | None = None
    """The family's status for an error (TGI's 422 for a bad request); None: the error's."""


OPENAI_ERRORS = ErrorShape(lambda exc: exc.to_body())


class ApiRoute(Route):
    """A route of an API family whose errors are not OpenAI's."""

    def __init__(self, path: str, endpoint: Callable[..., Any], *, methods: list[str],
                 errors: ErrorShape):
        super().__init__(path, endpoint, methods=methods)
        self.errors = errors


def shape_of(scope: Scope) -> ErrorShape:
    """The error shape of the route a request is for (also before routing: a refused key, a
    body too large, a wrong method)."""
    routes = scope["app"].routes if "app" in scope else []
    route = scope.get("route") or next(
        (r for r in routes if r.matches(scope)[0] is not Match.NONE), None)
    if isinstance(route, ApiRoute):
        return route.errors
    if route is None:
        for r in routes:
            if isinstance(r, ApiRoute) and r.errors.under is not None \
                    and scope["path"].startswith(r.errors.under):
                return r.errors
    return OPENAI_ERRORS


def render_error(exc: TokenwireError, shape: ErrorShape = OPENAI_ERRORS) -> Response:
    status = shape.status(exc) if shape.status is not None else exc.status_code
    return JSONResponse(shape.body(exc), status_code=status, headers=exc.headers or None)


async def _tokenwire(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TokenwireError)
    return render_error(exc, shape_of(request.scope))


async def _http(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (routing): 404 and 405."""
    assert isinstance(exc, HTTPException)
    where = f"{request.method} {request.url.path}"
    err: TokenwireError
    if exc.status_code == 405:
        err = MethodNotAllowedError(f"method not allowed: {where}")
    elif exc.status_code == 404:
        err = NotFoundError(f"no route {where}")
    else:
        err = InvalidRequestError(str(exc.detail))
    return render_error(err, shape_of(request.scope))


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return render_error(internal_error("internal error", exc), shape_of(request.scope))


exception_handlers = {
    TokenwireError: _tokenwire,
    HTTPException: _http,
    Exception: _unexpected,
}
