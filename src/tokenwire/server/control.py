"""The control plane's routes: vLLM's RL endpoints at vLLM's paths (serving/control.py)."""

from __future__ import annotations

import json
from functools import partial

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engines.base import CONTROL_OPS, ControlCall
from ..errors import InvalidRequestError
from ..serving.control import ControlService
from .middleware import caller_of

__all__ = ["control_routes"]


async def _control(op: str, request: Request) -> Response:
    raw = await request.body()
    body = None
    if raw.strip():
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise InvalidRequestError(f"the body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise InvalidRequestError("the body must be a JSON object")
    call = ControlCall(op, tuple(request.query_params.multi_items()), body)
    service: ControlService = request.app.state.control
    host = request.client.host if request.client is not None else None
    return JSONResponse(await service.call(call, caller_of(request), host))


control_routes = [Route(path, partial(_control, op), methods=[method], name=op)
                  for op, (method, path) in CONTROL_OPS.items()]
