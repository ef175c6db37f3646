"""The control plane's routes: vLLM's RL endpoints at vLLM's paths (serving/control.py), and
tokenwire's rolling update (serving/rolling.py)."""

from __future__ import annotations

from functools import partial

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engines.base import CONTROL_OPS, ControlCall
from ..protocol.control import CONTROL_BODIES, ROLLING_UPDATE, ControlBody, RollingUpdateBody
from ..serving.control import ControlService
from .middleware import caller_of
from .validation import parse_body, translate_validation_error

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


async def _rolling_update(request: Request) -> Response:
    service: ControlService = request.app.state.control
    host = request.client.host if request.client is not None else None
    service.authorize("rolling_update", caller_of(request), host)
    body = parse_body(await request.body(), RollingUpdateBody)
    for i, step in enumerate(body.calls):  # each call's body as the plain call checks it
        try:
            CONTROL_BODIES.get(step.op, ControlBody).model_validate(step.body or {})
        except ValidationError as exc:
            raise translate_validation_error(exc, prefix=("calls", i, "body")) from exc
    return JSONResponse(await service.roll(body, caller_of(request), host))


control_routes = [*(Route(path, partial(_control, op), methods=[method], name=op)
                    for op, (method, path) in CONTROL_OPS.items()),
                  Route(ROLLING_UPDATE[1], _rolling_update, methods=[ROLLING_UPDATE[0]],
                        name="rolling_update")]
