"""Server-Sent Events, written once, here: a response's `StreamedResponse` of events (serving/
generation.py) framed as `data: <json>\n\n` ... `data: [DONE]\n\n`, or, for the typed
families (Responses, Messages), `event: <type>\ndata: <json>\n\n` with no `[DONE]` (as
OpenAI's and Anthropic's); TGI's (`Framing`) as `data:<json>\n\n`, no space, no `[DONE]`.

Frames of events that came together (an upstream's events in one read, the events one
update makes) are written together, in one send, as the stream's `more` says: the bytes on
the wire are the same, the writes fewer.

An error after the first byte cannot change the status any more. The typed families end a
failed stream in their own shape themselves (`Family.fail`); what escapes to here goes
in-band as OpenAI's `data: {"error": {...}}` then `[DONE]`, or as an `error` event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Send

from ..errors import TokenwireError, internal_error
from ..protocol._base import pack_ids
from ..serving.generation import StreamedResponse
from ._json import dumps

__all__ = ["OPENAI_FRAMING", "Framing", "SSEResponse"]

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Framing:
    """How an untyped stream's events are written: OpenAI's (`data: `, then `[DONE]`, an
    in-band error as OpenAI's body), or another family's (TGI's: `data:`, nothing after the
    last event, its own error body)."""

    data: bytes = b"data: "
    done: bytes | None = DONE
    error: Callable[[TokenwireError], bytes] | None = None
    """An in-band error's JSON; None: OpenAI's body."""


OPENAI_FRAMING = Framing()


class SSEResponse(StreamingResponse):
    def __init__(self, events: StreamedResponse[Any], *, typed: bool = False, packed: bool = False,
                 framing: Framing = OPENAI_FRAMING):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._events = events
        self._typed = typed
        self._packed = packed  # the request's `encoding_format: "base64"`
        self._framing = framing

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        events, typed, packed, framing = self._events, self._typed, self._packed, self._framing
        it = events.__aiter__()
        held: list[bytes] = []
        try:
            while True:
                try:
                    ev = await it.__anext__()
                    if packed:
                        ev = pack_ids(ev)
                except StopAsyncIteration:
                    break
                except Exception as exc:  # noqa: BLE001 - the stream ends in its API's shape
                    held.append(_error_frame(exc, typed, framing))
                    break
                if typed:
                    held.append(b"event: " + ev.type.encode() + b"\ndata: "
                                + ev.json_bytes() + b"\n\n")
                else:
                    held.append(framing.data + ev.json_bytes() + b"\n\n")
                if events.more:  # the next is at hand: one write for both
                    continue
                await send({"type": "http.response.body", "body": b"".join(held),
                            "more_body": True})
                held.clear()
        finally:
            await events.aclose()
        if not typed and framing.done is not None:
            held.append(framing.done)
        await send({"type": "http.response.body", "body": b"".join(held), "more_body": False})


def _error_frame(exc: Exception, typed: bool, framing: Framing) -> bytes:
    if not isinstance(exc, TokenwireError):
        log.error("stream failed", exc_info=exc)
    err = exc if isinstance(exc, TokenwireError) else internal_error("the stream failed", exc)
    if typed:  # OpenAI's `error` event: its own type, the error's code, message and param
        return b"event: error\ndata: " + dumps({**err.to_body()["error"], "type": "error"}) \
            + b"\n\n"
    if framing.error is not None:
        return framing.data + framing.error(err) + b"\n\n"
    return framing.data + dumps(err.to_body()) + b"\n\n"
