"""The single place where exceptions become HTTP responses, always in OpenAI's error shape."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import EngineError, InvalidRequestError, NotFoundError, TokenwireError

__all__ = ["exception_handlers"]

log = logging.getLogger(__name__)


def _render(exc: TokenwireError) -> Response:
    return JSONResponse(exc.to_body(), status_code=exc.status_code, headers=exc.headers or None)


async def _tokenwire(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TokenwireError)
    return _render(exc)


async def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err: TokenwireError = NotFoundError(f"no route {request.method} {request.url.path}")
    elif exc.status_code == 405:
        err = InvalidRequestError(f"method {request.method} is not allowed on "
                                  f"{request.url.path}", code="method_not_allowed")
        err.status_code = 405  # type: ignore[misc]
    else:
        err = InvalidRequestError(str(exc.detail))
        err.status_code = exc.status_code  # type: ignore[misc]
    return _render(err)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _render(EngineError(f"internal error: {type(exc).__name__}", code="internal_error"))


exception_handlers = {
    TokenwireError: _tokenwire,
    HTTPException: _http,
    Exception: _unexpected,
}
