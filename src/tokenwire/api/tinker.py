"""Tinker's routes (`/api/v1/...`), as the official `tinker` SDK calls them against
`ServiceClient(base_url=...)` (serving/tinker/service.py, training.py; docs/api/tinker.md).

Errors are OpenAI's body with its status: the SDK reads any JSON body, names the status in its
exception class, and retries only 408, 409, 429 and 5xx, so a bad request is a 4xx it raises
at once. A finished sample or forward pass is protobuf (`application/x-protobuf`), as is the
training batch `forward_backward` posts; everything else is JSON."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import RateLimitError, UnsupportedParameterError
from ..protocol.tinker import (
    ClientConfig,
    CreateModel,
    CreateSamplingSession,
    CreateSession,
    DynamicConfig,
    FutureRequest,
    GetInfo,
    LoadWeights,
    OptimStep,
    RequestFailed,
    SampleRequest,
    SaveWeights,
    SaveWeightsForSampler,
    SdkVersion,
    SessionCall,
    TryAgain,
)
from ..serving.tinker import Failed, Finished, TinkerService, sampler_id
from ..serving.tinker.wire import read_forward_backward
from ._json import ModelResponse
from .middleware import caller_of
from .validation import parse_body

__all__ = ["LONG_POLL", "tinker_routes"]

LONG_POLL = 25.0
"""Seconds a `retrieve_future` waits for its sample before answering "try again" (the SDK's
own timeout is 45 s, and it asks again at once)."""


def _service(request: Request) -> TinkerService:
    service: TinkerService | None = request.app.state.tinker
    if service is None:
        raise UnsupportedParameterError(
            "Tinker's API needs the `tinker` extra on the server (pip install "
            "'tokenwire[tinker]'): its protobuf schema writes finished samples")
    return service


async def _body(request: Request, model: type[BaseModel]) -> BaseModel:
    raw = await request.body()
    return parse_body(raw if raw.strip() else b"{}", model)


async def client_config(request: Request) -> Response:
    """Answered on a connection closed after it: the SDK asks this on a pool of its own that
    it never closes (0.38), which would otherwise hold the connection until collected."""
    await _body(request, SdkVersion)
    _service(request)
    return ModelResponse(ClientConfig(), headers={"Connection": "close"})


async def dynamic_config(request: Request) -> Response:
    await _body(request, SdkVersion)
    return ModelResponse(DynamicConfig())


async def capabilities(request: Request) -> Response:
    return ModelResponse(_service(request).capabilities())


async def create_session(request: Request) -> Response:
    await _body(request, CreateSession)
    return ModelResponse(_service(request).create_session())


async def session_call(request: Request) -> Response:
    """Heartbeats and a session's end: accepted (a session holds nothing a sample needs)."""
    await _body(request, SessionCall)
    return JSONResponse({})


async def create_sampling_session(request: Request) -> Response:
    body = await _body(request, CreateSamplingSession)
    assert isinstance(body, CreateSamplingSession)
    return ModelResponse(_service(request).create_sampling_session(body))


async def sampler(request: Request) -> Response:
    return ModelResponse(_service(request).sampler(request.path_params["sampler_id"]))


async def asample(request: Request) -> Response:
    req = parse_body(await request.body(), SampleRequest)
    return ModelResponse(await _service(request).asample(req, caller_of(request)))


async def retrieve_future(request: Request) -> Response:
    req = parse_body(await request.body(), FutureRequest)
    outcome = await _service(request).retrieve(req.request_id, LONG_POLL)
    if isinstance(outcome, Finished):
        headers = dict(outcome.headers)
        media = headers.pop("content-type", "application/x-protobuf")
        return Response(outcome.payload, media_type=media, headers=headers)
    if isinstance(outcome, Failed):
        if outcome.category == "retry":  # the SDK samples again (a new asample)
            return JSONResponse(RateLimitError(outcome.error).to_body(), status_code=410)
        return ModelResponse(RequestFailed.model_validate(
            {"error": outcome.error, "category": outcome.category}))
    return ModelResponse(TryAgain(request_id=req.request_id))


async def cancel_future(request: Request) -> Response:
    """Accepted, and nothing is cancelled: the dynamic config tells the SDK not to ask."""
    parse_body(await request.body(), FutureRequest)
    return JSONResponse({})


async def create_model(request: Request) -> Response:
    req = parse_body(await request.body(), CreateModel)
    return ModelResponse(await _service(request).training.create_model(req))


async def get_info(request: Request) -> Response:
    req = parse_body(await request.body(), GetInfo)
    return ModelResponse(await _service(request).training.info(req.model_id))


async def forward_backward(request: Request) -> Response:
    """The batch is the SDK's protobuf (zstd-compressed where the client config asks)."""
    service = _service(request)
    # a batch's body runs to megabytes: unpacked off the event loop
    body = await asyncio.to_thread(read_forward_backward, await request.body(),
                                   request.headers.get("content-encoding"))
    return ModelResponse(await service.training.forward_backward(body))


async def optim_step(request: Request) -> Response:
    req = parse_body(await request.body(), OptimStep)
    return ModelResponse(await _service(request).training.optim_step(req))


async def save_weights(request: Request) -> Response:
    req = parse_body(await request.body(), SaveWeights)
    return ModelResponse(await _service(request).training.save_weights(req))


async def load_weights(request: Request) -> Response:
    req = parse_body(await request.body(), LoadWeights)
    return ModelResponse(await _service(request).training.load_weights(req))


async def save_weights_for_sampler(request: Request) -> Response:
    req = parse_body(await request.body(), SaveWeightsForSampler)
    training = _service(request).training
    return ModelResponse(await training.save_weights_for_sampler(req, sampler_id))


async def telemetry(request: Request) -> Response:
    """The SDK's telemetry: accepted and dropped, never an error."""
    await request.body()
    return JSONResponse({"status": "accepted"})


tinker_routes = [
    Route("/api/v1/client/config", client_config, methods=["POST"]),
    Route("/api/v1/client/dynamic_config", dynamic_config, methods=["POST"]),
    Route("/api/v1/get_server_capabilities", capabilities, methods=["GET"]),
    Route("/api/v1/create_session", create_session, methods=["POST"]),
    Route("/api/v1/session_heartbeat", session_call, methods=["POST"]),
    Route("/api/v1/sessions/{session_id}/finish", session_call, methods=["POST"]),
    Route("/api/v1/create_sampling_session", create_sampling_session, methods=["POST"]),
    Route("/api/v1/samplers/{sampler_id}", sampler, methods=["GET"]),
    Route("/api/v1/asample", asample, methods=["POST"]),
    Route("/api/v1/retrieve_future", retrieve_future, methods=["POST"]),
    Route("/api/v1/cancel_future", cancel_future, methods=["POST"]),
    Route("/api/v1/telemetry", telemetry, methods=["POST"]),
    Route("/api/v1/create_model", create_model, methods=["POST"]),
    Route("/api/v1/get_info", get_info, methods=["POST"]),
    Route("/api/v1/forward_backward", forward_backward, methods=["POST"]),
    Route("/api/v1/optim_step", optim_step, methods=["POST"]),
    Route("/api/v1/save_weights", save_weights, methods=["POST"]),
    Route("/api/v1/load_weights", load_weights, methods=["POST"]),
    Route("/api/v1/save_weights_for_sampler", save_weights_for_sampler, methods=["POST"]),
]
