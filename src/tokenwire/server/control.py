"""The control plane's routes: vLLM's RL endpoints at vLLM's paths (serving/control.py)."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engines.base import CONTROL_OPS, ControlCall
from ..protocol.control import CONTROL_BODIES, ControlBody
from ..serving.control import ControlService
from .middleware import caller_of
from .validation import parse_body

__all__ = ["control_routes"]


async def _control(op: str, request: Request) -> Response:
    # the API's own parser and typed models, as every route's: a body the wire cannot carry
    # (a lone surrogate) or a field we do not know is a 400 naming it, never state
    service: ControlService = request.app.state.control
    host = request.client.host if request.client is not None else None
    service.authorize(op, caller_of(request), host)
    raw = await request.body()
    model = CONTROL_BODIES.get(op, ControlBody)
    parsed = parse_body(raw if raw.strip() else b"{}", model)
    body = parsed.model_dump(exclude_unset=True) if raw.strip() else None
    call = ControlCall(op, tuple(request.query_params.multi_items()), body)
    return JSONResponse(await service.call(call, caller_of(request), host))


control_routes = [Route(path, partial(_control, op), methods=[method], name=op)
                  for op, (method, path) in CONTROL_OPS.items()]
