"""The single place where exceptions become HTTP responses: in OpenAI's error shape, but on
Anthropic's Messages API (`/v1/messages...`) in Anthropic's."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import (
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    TokenwireError,
)
from ..serving.anthropic import error_body

__all__ = ["exception_handlers", "render_error"]

log = logging.getLogger(__name__)


def _anthropic(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def render_error(exc: TokenwireError, path: str = "") -> Response:
    """The error's answer to a request for `path`."""
    body = error_body(exc).model_dump(mode="json") if _anthropic(path) else exc.to_body()
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers or None)


async def _tokenwire(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TokenwireError)
    return render_error(exc, request.url.path)


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
    return render_error(err, request.url.path)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return render_error(TokenwireError(f"internal error: {type(exc).__name__}",
                                       code="internal_error"), request.url.path)


exception_handlers = {
    TokenwireError: _tokenwire,
    HTTPException: _http,
    Exception: _unexpected,
}
