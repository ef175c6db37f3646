"""ASGI middleware in front of every route: request metrics, API keys, the body-size limit.

They sit outside the router's exception handlers, so they render their errors themselves,
with the same function (`render_error`).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.requests import Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import AuthenticationError, RequestTooLargeError
from ..metrics import UNMATCHED, Metrics
from ..serving.service import Caller
from .handlers import render_error, shape_of

__all__ = ["API_KEY_STATE", "ApiKeyAuth", "BodyLimit", "RequestMetrics", "caller_of"]

OPEN_PATHS = frozenset({"/health", "/ping", "/openapi.json", "/docs", "/inspect"})
"""Served without a key: the probes (vLLM's /ping is SageMaker's), the API's description and the
token inspector's page (a browser cannot send one when it opens a page; the inspector asks for
the key and sends it with each API call)."""
OPEN_PREFIXES = ("/docs/assets/", "/inspect/assets/")
API_KEY_STATE = "api_key"
"""`request.state.api_key`: the key a request was authenticated with."""


def caller_of(request: Request) -> Caller:
    """Who sent a request, as `ApiKeyAuth` established it (what services scope by)."""
    return Caller(api_key=getattr(request.state, API_KEY_STATE, None))


class RequestMetrics:
    """Counts every answer by route template and status. Templates, not paths, so the series
    stay few whatever clients send: `/v1/models/{model:path}` is one route, and any path no
    route matches is `unmatched`."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: Sequence[BaseRoute]):
        self.app = app
        self._metrics = metrics
        self._routes = routes

    def _route(self, scope: Scope) -> str:
        # the router leaves the route it chose in the scope; a request refused before routing
        # (no key, too large) is matched here (a wrong method still names its route: 405)
        route = scope.get("route") or next(
            (r for r in self._routes if r.matches(scope)[0] is not Match.NONE), None)
        return getattr(route, "path", None) or UNMATCHED

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def noted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self._metrics.in_flight += 1
        try:
            await self.app(scope, receive, noted)
        except Exception:  # any kind: noted and re-raised, never swallowed
            status = status or 500  # Starlette's outermost handler answers it with a 500
            raise
        finally:
            self._metrics.in_flight -= 1
            self._metrics.answered += 1
            if status is not None:  # None: cancelled before any answer (nothing to count)
                self._metrics.request(self._route(scope), status)


class ApiKeyAuth:
    """`Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on every route but the
    open ones, when keys are configured."""

    def __init__(self, app: ASGIApp, keys: list[str]):
        self.app = app
        self._keys = [k.encode() for k in keys]

    def _match(self, header: bytes) -> bytes | None:
        """The configured key the header carries, if any."""
        scheme, _, given = header.partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        found = None
        for key in self._keys:  # no early exit: every key costs the same compare
            if hmac.compare_digest(given.strip(), key):
                found = key
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._keys:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        header = headers.get(b"authorization", b"")
        if not header and b"x-api-key" in headers:  # Anthropic's clients' way
            header = b"Bearer " + headers[b"x-api-key"]
        key = self._match(header)
        path = scope["path"]
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            # open, but a valid key still says who is asking
            if key is not None:
                scope.setdefault("state", {})[API_KEY_STATE] = key.decode()
            await self.app(scope, receive, send)
            return
        if key is None:
            msg = ("Missing API key: send Authorization: Bearer <key>" if not header
                   else "Incorrect API key provided")
            await render_error(AuthenticationError(msg), shape_of(scope))(scope, receive, send)
            return
        scope.setdefault("state", {})[API_KEY_STATE] = key.decode()  # who is asking, for serving
        await self.app(scope, receive, send)


class BodyLimit:
    """Bodies over `max_bytes` get 413, by Content-Length or while they stream in."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> RequestTooLargeError:
        return RequestTooLargeError(f"the request body is larger than {self.max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await render_error(self._too_large(), shape_of(scope))(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self._too_large()  # the route's handler renders it
            return message

        await self.app(scope, counted, send)
