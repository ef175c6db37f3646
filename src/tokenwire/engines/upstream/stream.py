"""Reading one upstream response into engine events.

A protocol module's `ChunkDecoder` turns the response's parsed chunks into events;
`UpstreamStream` reads the response (server-sent events, or a whole JSON body) into it, refuses
what the pinned tokenizer cannot have sampled, and turns an in-band error, a broken connection
or a stream that ends unfinished into our errors. Upstreams are always asked to stream (scoring,
which vLLM and SGLang only return whole, aside), so a closed client closes the upstream
response (the upstream aborts the request) and one code path serves both response kinds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Protocol

import aiohttp

from ...errors import ServiceUnavailableError, TokenwireError
from ..base import EngineEvent, EngineInfo, FinishEvent, ReplicaLostError, TokenEvent, TokenRun
from .replica import Replica, Seat
from .transport import MALFORMED, TRANSPORT_ERRORS, json_or_error

__all__ = ["ChunkDecoder", "UpstreamStream"]

log = logging.getLogger(__name__)


class ChunkDecoder:
    """Turns one response's parsed chunks into engine events (the upstream's conventions:
    where the stop id is, cumulative or incremental ids). One per stream."""

    def feed(self, chunk: dict[str, Any]) -> list[EngineEvent]:
        raise NotImplementedError

    def parse(self, body: bytes) -> Any:
        """A whole body, parsed for `feed` (a decoder may read its hot parts its own way)."""
        return json_or_error(body)

    def end(self) -> list[EngineEvent]:
        """The stream ended (`[DONE]` or EOF): a decoder that waits for a trailing usage chunk
        finishes here; none: the stream ended unfinished."""
        return []


class _Owner(Protocol):
    """What a replica's stream needs of its engine (engine.py's `UpstreamEngine`, which
    imports this module)."""

    @property
    def info(self) -> EngineInfo: ...
    def protocol_error(self, status: int, body: Any, where: str) -> TokenwireError: ...


class UpstreamStream:
    """The events of one upstream response; closing it closes the response (the upstream
    cancels the request) and releases the replica."""

    def __init__(self, engine: _Owner, replica: Replica,
                 response: aiohttp.ClientResponse, decoder: ChunkDecoder, seat: Seat):
        self._vocab = engine.info.vocab_size
        self._engine = engine
        self._replica = replica
        self._response = response
        # a whole JSON body instead of events (vLLM before 0.20, or scoring, which vLLM only
        # returns unstreamed): one chunk with everything
        self._whole = response.content_type == "application/json"
        self._decoder = decoder
        self._pending: deque[EngineEvent] = deque()
        self._finished = False
        self._closed = False
        self._buffer = b""
        self._ended = False
        """`[DONE]` or the end of the body came: what is pending is all there is."""
        self._seat = seat  # released when the stream closes

    def __aiter__(self) -> UpstreamStream:
        return self

    @property
    def replica(self) -> Replica:
        return self._replica

    @property
    def ready(self) -> bool:
        """The next event is at hand (it came with the last read)."""
        return bool(self._pending)

    async def __anext__(self) -> EngineEvent:
        if not self._pending:
            if self._finished or self._closed:
                raise StopAsyncIteration
            await self._fill()
        ev = self._pending.popleft()
        if isinstance(ev, FinishEvent):
            self._finished = True
            await self.aclose()
        return ev

    async def prime(self) -> None:
        """Wait for the first event: until then nothing has reached the client, so what this
        raises may still send the request to another replica (engine.py)."""
        await self._fill()

    async def _fill(self) -> None:
        """Read until the decoder has events: raises a typed error on an in-band error, on a
        broken connection, or on a stream that ends unfinished."""
        name = self._replica.name
        content = self._response.content
        try:
            if self._whole:
                self._whole = False
                body = self._decoder.parse(await self._response.read())
                if not isinstance(body, dict) or "error" in body:
                    raise self._engine.protocol_error(200, body, name)
                self._take(self._decoder.feed(body))
                self._take(self._decoder.end())
                if not self._pending or not isinstance(self._pending[-1], FinishEvent):
                    raise ServiceUnavailableError(f"upstream {name} sent an unfinished response")
                return
            while not self._pending:
                if self._ended:  # cut off: as good as lost (migration.py)
                    self._replica.down("it ended a stream before the output was finished")
                    await self.aclose()
                    raise ReplicaLostError(
                        f"upstream {name} ended the stream before the output was finished")
                self._read(await self._lines(content))
        except TRANSPORT_ERRORS as exc:
            # the replica is gone: migration.py goes on on another one, if it can
            self._replica.down(f"the connection broke mid-stream: {exc!r}")
            await self.aclose()
            raise ReplicaLostError(
                f"upstream {name} went away in the middle of the response") from exc
        except MALFORMED as exc:
            log.warning("upstream %s sent a chunk of another shape: %r", self._replica.url, exc)
            await self.aclose()
            raise ServiceUnavailableError(f"upstream {name} sent a malformed response") from exc
        except BaseException:
            await self.aclose()
            raise

    async def _lines(self, content: aiohttp.StreamReader) -> list[bytes]:
        """Every complete line that has arrived (waiting for one); [] at the end. Events that
        arrive together are decoded together, with no wait between them."""
        while True:
            cut = self._buffer.rfind(b"\n")
            if cut >= 0:
                lines = self._buffer[:cut].split(b"\n")  # (a CRLF's \r is JSON whitespace)
                self._buffer = self._buffer[cut + 1:]
                return lines
            data = await content.readany()
            if not data:
                rest, self._buffer = self._buffer, b""
                return [rest] if rest.strip() else []
            self._buffer += data

    def _read(self, lines: list[bytes]) -> None:
        """Decode server-sent event lines; [] or `[DONE]`: the stream ended."""
        name = self._replica.name
        done = not lines
        for line in lines:
            if line.startswith(b"data: [DONE]"):
                done = True
                break
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event names
            chunk = json_or_error(line[5:])
            if not isinstance(chunk, dict):
                raise ServiceUnavailableError(f"upstream {name} sent a malformed chunk")
            if "error" in chunk:
                raise self._engine.protocol_error(200, chunk, name)
            self._take(self._decoder.feed(chunk))
            if self._pending and isinstance(self._pending[-1], FinishEvent):
                return  # what follows (usage, [DONE]) is read when the stream closes
        if done:
            self._ended = True
            self._take(self._decoder.end())

    def _take(self, events: list[EngineEvent]) -> None:
        """Queue decoded events; a sampled id outside the pinned vocabulary is the upstream
        serving another model (or a padded vocabulary): never passed on."""
        for ev in events:
            if isinstance(ev, TokenRun):
                if ev.ids and not (0 <= min(ev.ids) and max(ev.ids) < self._vocab):
                    bad = next(t for t in ev.ids if not 0 <= t < self._vocab)
                    raise ValueError(f"sampled id {bad} is outside the vocabulary")
                self._pending.append(ev)
                continue
            tok = ev if isinstance(ev, TokenEvent) else \
                ev.stop_token if isinstance(ev, FinishEvent) else None
            if tok is not None and not 0 <= tok.token_id < self._vocab:
                raise ValueError(f"sampled id {tok.token_id} is outside the vocabulary")
            self._pending.append(ev)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._seat.release()
        if self._finished:  # what follows the finish (usage, [DONE]) is read, and the
            try:            # connection kept for the next request
                await asyncio.wait_for(self._response.read(), 1.0)
                self._response.release()
                return
            except (*TRANSPORT_ERRORS, asyncio.CancelledError):
                pass
        self._response.close()  # mid-stream: closing it is how the upstream learns
