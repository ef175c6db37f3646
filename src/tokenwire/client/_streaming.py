"""Streams of chunks from Server-Sent Events; each closes its response when done or left."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Generic, TypeVar

import httpx
from pydantic import BaseModel

from ..errors import APIConnectionError
from ._common import DONE, decode_sse_line

__all__ = ["AsyncStream", "Stream"]

M = TypeVar("M", bound=BaseModel)


class Stream(Generic[M]):
    """Iterate for chunks; stops at `[DONE]`, raises an in-band error as its exception."""

    def __init__(self, response: httpx.Response, chunk_type: type[M]):
        self.response = response
        self._type = chunk_type

    def __iter__(self) -> Iterator[M]:
        try:
            for line in self.response.iter_lines():
                ev = decode_sse_line(line, self._type)
                if ev is DONE:
                    return
                if ev is not None:
                    yield ev  # type: ignore[misc]
        except httpx.HTTPError as exc:
            raise APIConnectionError(f"the stream broke: {exc}") from exc
        finally:
            self.response.close()

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> Stream[M]:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class AsyncStream(Generic[M]):
    def __init__(self, response: httpx.Response, chunk_type: type[M]):
        self.response = response
        self._type = chunk_type

    async def __aiter__(self) -> AsyncIterator[M]:
        try:
            async for line in self.response.aiter_lines():
                ev = decode_sse_line(line, self._type)
                if ev is DONE:
                    return
                if ev is not None:
                    yield ev  # type: ignore[misc]
        except httpx.HTTPError as exc:
            raise APIConnectionError(f"the stream broke: {exc}") from exc
        finally:
            await self.response.aclose()

    async def aclose(self) -> None:
        await self.response.aclose()

    async def __aenter__(self) -> AsyncStream[M]:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
