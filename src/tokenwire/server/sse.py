"""Server-Sent Events framing, done once, here: `data: <json>\n\n` ... `data: [DONE]\n\n`.

An error after the first byte cannot change the status any more; it goes in-band as
`data: {"error": {...}}`, then `[DONE]`.

Frames of events the engine delivered together (an upstream's events that came in one read)
are written together, in one send (`SSEResponse`, told by the choice's `Flow`): the bytes on
the wire are the same, the writes fewer.

The Responses API frames typed events instead (`sse_typed_events`): `event: <type>` then
`data: <json>`, no `[DONE]` (as OpenAI's); its service ends a failed stream with
`response.failed` itself, so only an error escaping it is framed here, as an `error` event.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Send

from ..errors import TokenwireError
from ..serving.generation import Flow
from ._json import dumps

__all__ = ["SSEResponse", "sse_frames", "sse_typed_events"]

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


async def sse_frames(events: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
    try:
        async for ev in events:
            yield b"data: " + ev.model_dump_json().encode() + b"\n\n"
    except TokenwireError as exc:
        yield b"data: " + dumps(exc.to_body()) + b"\n\n"
    except Exception as exc:  # noqa: BLE001 - the stream must end in the OpenAI shape
        log.exception("stream failed")
        err = TokenwireError(f"the stream failed: {type(exc).__name__}", code="internal_error")
        yield b"data: " + dumps(err.to_body()) + b"\n\n"
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    yield DONE


async def sse_typed_events(events: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
    try:
        async for ev in events:
            kind = getattr(ev, "type", "message")
            yield b"event: " + kind.encode() + b"\ndata: " + ev.model_dump_json().encode() + b"\n\n"
    except Exception as exc:  # noqa: BLE001 - the stream must end in the OpenAI shape
        log.exception("stream failed")
        err = exc if isinstance(exc, TokenwireError) else TokenwireError(
            f"the stream failed: {type(exc).__name__}", code="internal_error")
        body = {"type": "error", **err.to_body()["error"]}
        yield b"event: error\ndata: " + dumps(body) + b"\n\n"
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


class SSEResponse(StreamingResponse):
    def __init__(self, frames: AsyncIterator[bytes], flow: Flow):
        super().__init__(frames, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._flow = flow

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        held: list[bytes] = []
        async for frame in self.body_iterator:
            held.append(frame)  # type: ignore[arg-type]
            if self._flow.more:  # the next is at hand: one write for both
                continue
            await send({"type": "http.response.body", "body": b"".join(held),
                        "more_body": True})
            held.clear()
        await send({"type": "http.response.body", "body": b"".join(held), "more_body": False})
