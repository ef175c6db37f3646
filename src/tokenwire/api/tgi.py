"""Text Generation Inference's routes: `POST /generate`, `POST /generate_stream` and TGI's
compat route `POST /` (the body's `stream` picks; `huggingface_hub`'s `InferenceClient` posts
to the base URL), served by serving/tgi.py (docs/api/tgi.md).

Errors are TGI's body with TGI's status (422 for a bad request). A stream is TGI's SSE:
`data:<json>` and a blank line per event, no `[DONE]`; once the body parsed, a stream answers
200 and a refusal comes in-band, as TGI's does."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..errors import TokenwireError
from ..protocol.tgi import TGICompatResponse, TGIGenerateRequest
from ..serving.tgi import TGIService, error_body, error_status
from ._json import ModelResponse
from .handlers import ApiRoute, ErrorShape
from .middleware import caller_of
from .routes import _ClientGone, _unless_disconnected
from .sse import Framing, SSEResponse
from .validation import parse_body

__all__ = ["TGI_ERRORS", "tgi_routes"]

TGI_ERRORS = ErrorShape(lambda exc: error_body(exc).model_dump(mode="json"),
                        status=error_status)
"""TGI's routes answer their errors in TGI's shape, with TGI's statuses."""

_FRAMING = Framing(data=b"data:", done=None, error=lambda exc: error_body(exc).json_bytes())
"""TGI's SSE (axum's `Event::json_data`): no space after `data:`, nothing after the last."""


async def _body(request: Request) -> TGIGenerateRequest:
    return parse_body(await request.body(), TGIGenerateRequest)


async def _answer(request: Request, req: TGIGenerateRequest, *, stream: bool,
                  compat: bool) -> Response:
    service: TGIService = request.app.state.tgi
    caller = caller_of(request)
    if stream:
        try:
            events = await _unless_disconnected(
                request, service.stream(req, caller, full_text=compat))
        except _ClientGone:
            return Response(status_code=499)
        except TokenwireError as exc:  # the status is 200 once the body parsed (TGI's)
            return Response(_FRAMING.data + error_body(exc).json_bytes() + b"\n\n",
                            media_type="text/event-stream",
                            headers={"Cache-Control": "no-cache"})
        return SSEResponse(events, framing=_FRAMING)
    try:
        whole = await _unless_disconnected(request, service.create(req, caller,
                                                                    full_text=compat))
    except _ClientGone:
        return Response(status_code=499)
    return ModelResponse(TGICompatResponse([whole]) if compat else whole)


async def generate(request: Request) -> Response:
    """TGI's whole answer: `generated_text`, and with `parameters.details` each generated
    token (`id`, `text`, `logprob`, `special`), the finish reason and the seed."""
    return await _answer(request, await _body(request), stream=False, compat=False)


async def generate_stream(request: Request) -> Response:
    """TGI's stream: an event per generated token; the last carries `generated_text` and,
    with `parameters.details`, the details."""
    return await _answer(request, await _body(request), stream=True, compat=False)


async def compat_generate(request: Request) -> Response:
    """TGI's `POST /`: `stream` picks the stream or a list holding the whole answer;
    `return_full_text` is true unless the request says."""
    req = await _body(request)
    return await _answer(request, req, stream=req.stream, compat=True)


tgi_routes = [
    ApiRoute("/", compat_generate, methods=["POST"], errors=TGI_ERRORS),
    ApiRoute("/generate", generate, methods=["POST"], errors=TGI_ERRORS),
    ApiRoute("/generate_stream", generate_stream, methods=["POST"], errors=TGI_ERRORS),
]
