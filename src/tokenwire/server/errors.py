"""The single place where exceptions become HTTP responses, always in OpenAI's error shape."""

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

__all__ = ["exception_handlers", "render_error"]

log = logging.getLogger(__name__)


def render_error(exc: TokenwireError) -> Response:
    return JSONResponse(exc.to_body(), status_code=exc.status_code, headers=exc.headers or None)


async def _tokenwire(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TokenwireError)
    return render_error(exc)


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
    return render_error(err)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return render_error(TokenwireError(f"internal error: {type(exc).__name__}",
                                       code="internal_error"))


exception_handlers = {
    TokenwireError: _tokenwire,
    HTTPException: _http,
    Exception: _unexpected,
}
