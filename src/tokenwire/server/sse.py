"""Server-Sent Events framing, done once, here: `data: <json>\n\n` ... `data: [DONE]\n\n`.

An error after the first byte cannot change the status any more; it goes in-band as
`data: {"error": {...}}`, then `[DONE]`.

The Responses API frames typed events instead (`sse_typed_events`): `event: <type>` then
`data: <json>`, no `[DONE]` (as OpenAI's); its service ends a failed stream with
`response.failed` itself, so only an error escaping it is framed here, as an `error` event.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from pydantic import BaseModel

from ..errors import TokenwireError
from ._json import dumps

__all__ = ["sse_frames", "sse_typed_events"]

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
