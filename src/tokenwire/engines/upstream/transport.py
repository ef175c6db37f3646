"""The HTTP client to the replicas: one aiohttp session for all of them, the helper requests a
protocol module makes with it (a JSON call, a tokenize endpoint), and what its failures raise.

The transport is aiohttp: one event per sampled token makes per-read cost the gateway's cost,
and aiohttp's C parser reads an event in about half the CPU httpx's pure-Python stack takes
(measured on loopback in bench/gateway.py's setting; docs/engines.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import orjson

from ...config import Settings
from ...errors import ServiceUnavailableError
from .replica import Replica

__all__ = ["MALFORMED", "TRANSPORT_ERRORS", "Transport", "UpstreamStatusError", "json_or_error"]

TRANSPORT_ERRORS = (aiohttp.ClientError, aiohttp.http_exceptions.HttpProcessingError,
                    asyncio.TimeoutError, ConnectionError)
"""What a request to an upstream raises when the upstream is not there to answer (or sends
what HTTP cannot parse)."""
MALFORMED = (KeyError, TypeError, AttributeError, ValueError, IndexError)
"""What a decoder raises on a chunk that is not the upstream's documented shape."""
_ABSENT = frozenset({404, 405, 501})
"""Statuses that mean "no such endpoint here" (rather than "failed this time")."""


class UpstreamStatusError(Exception):
    """A helper request (not a generation) got a status other than 200."""

    def __init__(self, status: int, url: str):
        super().__init__(f"{url} answered {status}")
        self.status = status


def json_or_error(data: bytes | str) -> Any:
    """A body or an event's data, parsed; what is not JSON becomes an error body that carries
    its text (an upstream's proxy may answer in HTML)."""
    try:
        return orjson.loads(data)  # a whole answer's body is MBs: ~5x json's speed
    except orjson.JSONDecodeError:
        pass
    try:  # what orjson refuses and json takes: NaN, Infinity
        return json.loads(data)
    except ValueError:
        text = data if isinstance(data, str) else data.decode("utf-8", "replace")
        return {"error": {"message": text[:500]}}


class Transport:
    """The session, opened when the engine starts and closed with it."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    @property
    def is_open(self) -> bool:
        return self._session is not None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise ServiceUnavailableError("the engine has not been started")
        return self._session

    def open(self, s: Settings) -> None:
        headers = {"Authorization": f"Bearer {s.upstream_api_key}"} if s.upstream_api_key else {}
        self._session = aiohttp.ClientSession(
            headers=headers, raise_for_status=False,
            read_bufsize=1 << 22,  # SGLang's cumulative chunks repeat the whole output: long lines
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=s.upstream_connect_timeout,
                                          sock_read=s.upstream_read_timeout),
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, method: str, url: str, **kw: Any) -> aiohttp.ClientResponse:
        """A request; sent once more on a fresh connection when the pooled one it went out on
        turns out closed before any answer (a server's keep-alive timeout racing our reuse:
        llama-server drops idle connections after 5 s), which is not the replica failing. The
        race shows as a disconnect before the answer, or as a write that fails ("Can not write
        request body": seen in CI, where it marked the only replica down); a connection that
        cannot be made at all is the replica's failure, not retried."""
        try:
            return await self.session.request(method, url, **kw)
        except aiohttp.ClientConnectorError:
            raise
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            return await self.session.request(method, url, **kw)

    async def call(self, replica: Replica, method: str, path: str, body: Any = None,
                   ) -> tuple[int, Any]:
        """One request with a JSON answer: (status, the parsed body, or None)."""
        async with await self.send(method, replica.url + path, json=body) as r:
            data = await r.read()
        try:
            return r.status, json.loads(data) if data else None
        except ValueError:
            return r.status, None

    async def get_json(self, replica: Replica, path: str) -> Any:
        status, data = await self.call(replica, "GET", path)
        if status != 200:
            raise UpstreamStatusError(status, replica.url + path)
        return data

    async def tokenize_each(self, replica: Replica, texts: Sequence[str], path: str,
                            body: Callable[[str], dict[str, Any]]) -> list[list[int]] | None:
        """`texts` through the replica's tokenize endpoint, one request each (a few at a
        time); None when it has none (404, 405, 501)."""
        slots = asyncio.Semaphore(32)

        async def one(text: str) -> list[int] | None:
            async with slots:
                status, answer = await self.call(replica, "POST", path, body(text))
            if status in _ABSENT:
                return None
            if status != 200:  # failed this time: the verification is tried again later
                raise UpstreamStatusError(status, replica.url + path)
            return list(answer["tokens"])

        got = await asyncio.gather(*(one(t) for t in texts))
        if any(g is None for g in got):
            return None
        return [g for g in got if g is not None]
