"""GET /openapi.json: an OpenAPI 3.1 document generated from the wire models the routes parse
and render with, so it cannot drift from them.

`ENDPOINTS` is the one table of what each route takes and answers; the document is built by
walking the app's routes, and a route missing from the table (or an entry naming no route) is
an error, so a new route cannot go undocumented. Adding one is one entry here.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .. import __version__
from ..engines.base import CONTROL_OPS
from ..protocol.anthropic import (
    AnthropicErrorBody,
    CountTokensRequest,
    CountTokensResponse,
    Message,
    MessagesRequest,
    MessageStreamEvent,
)
from ..protocol.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest
from ..protocol.common import ErrorResponse, ModelCard, ModelList, Version
from ..protocol.completions import Completion, CompletionChunk, CompletionRequest
from ..protocol.control import ROLLING_UPDATE, RollingUpdateBody
from ..protocol.generate import GenerateRequest, GenerateResponse, GenerateStreamResponse
from ..protocol.health import Health
from ..protocol.inspect import Inspection
from ..protocol.render import RenderResponse
from ..protocol.responses import Response as Response_
from ..protocol.responses import ResponsesRequest, ResponseStreamEvent
from ..protocol.storage import (
    DeletedCompletion,
    DeletedDocument,
    DeletedResponse,
    Document,
    DocumentCreated,
    DocumentSearchRequest,
    DocumentSearchResults,
    NewDocument,
    ResponseItemList,
    StoredCompletionList,
    StoredMessageList,
    UpdateCompletion,
)
from ..protocol.tgi import (
    TGICompatResponse,
    TGIErrorResponse,
    TGIGenerateRequest,
    TGIGenerateResponse,
    TGIStreamResponse,
)
from ..protocol.tinker import (
    ClientConfig,
    CreateModel,
    CreateSamplingSession,
    CreateSamplingSessionAnswer,
    CreateSession,
    CreateSessionAnswer,
    DynamicConfig,
    FutureRequest,
    GetInfo,
    InfoAnswer,
    LoadWeights,
    OptimStep,
    RequestFailed,
    SampleRequest,
    SamplerInfo,
    SaveWeights,
    SaveWeightsForSampler,
    SdkVersion,
    ServerCapabilities,
    SessionCall,
    TryAgain,
    UntypedFuture,
)
from ..protocol.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizerConfig,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
    TokenizerList,
    TranslateRequest,
    TranslateResponse,
)
from ._json import dumps
from .middleware import OPEN_PATHS

__all__ = ["ENDPOINTS", "NOT_DOCUMENTED", "Endpoint", "build_document", "openapi_json"]

REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Endpoint:
    summary: str
    request: type[BaseModel] | None = None
    """The JSON body, parsed with this model."""
    response: type[BaseModel] | None = None
    """The JSON body of a success (200, or each of `response_status`)."""
    stream: type[BaseModel] | None = None
    """With `"stream": true`: a text/event-stream of these, one per event, then `[DONE]`."""
    typed_events: bool = False
    """The stream's events are typed (`event: <type>` before each `data:`, no `[DONE]`): the
    Responses API's."""
    done: bool = True
    """The stream ends with `data: [DONE]` (TGI's ends after its last event)."""
    errors: tuple[int, ...] = ()
    """Statuses answered with an error body, besides 401 (every route but /health, when keys
    are set) and 413 (every body)."""
    error: type[BaseModel] = ErrorResponse
    """The error body's shape: OpenAI's, or Anthropic's on its Messages API, TGI's on its
    routes."""
    response_status: tuple[int, ...] = (200,)
    raw: Mapping[str, Any] = field(default_factory=dict)
    """OpenAPI response objects by status, for bodies no wire model describes."""
    example: Mapping[str, Any] | None = None
    """A request body that works on the default model (/docs' "Try it out" starts from it)."""

    def models(self) -> list[type[BaseModel]]:
        return [m for m in (self.request, self.response, self.stream, self.error)
                if m is not None]


# what any route that admits work on a model may answer: a bad body, an unknown model, no
# replica within a weight bound, a full queue, an engine (or every upstream replica) down
_GENERATION = (400, 404, 409, 429, 503)
_TOKENIZE = (400, 404)

_MODEL = "SmolLM2-135M-Instruct"
"""The examples' model: the one `tokenwire serve` loads by default."""
_PATH_EXAMPLES = {"model": _MODEL, "version": "smollm2-49k"}

_CHAT = {"model": _MODEL, "messages": [{"role": "user", "content": "Say hello."}],
         "max_tokens": 16, "response_format_tokens": True}

_TOKENIZE_EXAMPLE = {"model": _MODEL, "prompt": "Hello, world"}
_DETOKENIZE_EXAMPLE = {"model": _MODEL, "tokens": [19556, 28, 905]}

_TOKENIZER_HEADERS = {
    "ETag": "The artifact's sha256, quoted: send it as If-None-Match to get a 304.",
    "Cache-Control": "Immutable under a full version id; no-cache under an alias (it may move).",
    "X-Tokenwire-Sha256": "The sha256 of the bytes.",
    "X-Tokenwire-Tokenizer-Version": "The full version id the bytes are.",
}

#: (method, Starlette path) -> what it takes and answers
_OK: Mapping[str, Any] = {"200": {"description": "Accepted",
                                 "content": {"application/json": {"schema": {"type": "object"}}}}}
_TINKER: dict[tuple[str, str], Endpoint] = {
    ("POST", "/api/v1/client/config"): Endpoint(
        "Tinker's SDK: its client config (no JWT, futures polled one by one)", SdkVersion,
        ClientConfig, errors=(400,)),
    ("POST", "/api/v1/client/dynamic_config"): Endpoint(
        "Tinker's SDK: its dynamic config (no cancelling)", SdkVersion, DynamicConfig,
        errors=(400,)),
    ("GET", "/api/v1/get_server_capabilities"): Endpoint(
        "Tinker's SDK: the served models, as base models", response=ServerCapabilities,
        errors=(400,)),
    ("POST", "/api/v1/create_session"): Endpoint(
        "Tinker's SDK: a session (an id)", CreateSession, CreateSessionAnswer, errors=(400,)),
    ("POST", "/api/v1/session_heartbeat"): Endpoint(
        "Tinker's SDK: a session's heartbeat, accepted", SessionCall, raw=_OK, errors=(400,)),
    ("POST", "/api/v1/sessions/{session_id}/finish"): Endpoint(
        "Tinker's SDK: a session's end, accepted", SessionCall, raw=_OK, errors=(400,)),
    ("POST", "/api/v1/create_sampling_session"): Endpoint(
        "Tinker's SDK: a sampling session on a served model", CreateSamplingSession,
        CreateSamplingSessionAnswer, errors=(400, 404)),
    ("GET", "/api/v1/samplers/{sampler_id}"): Endpoint(
        "Tinker's SDK: a sampling session's model", response=SamplerInfo, errors=(400, 404)),
    ("POST", "/api/v1/asample"): Endpoint(
        "Tinker's SDK: a sample, checked and started; answers its future's id", SampleRequest,
        UntypedFuture, errors=(400, 404, 429, 503)),
    ("POST", "/api/v1/retrieve_future"): Endpoint(
        "Tinker's SDK: a future, waited for up to 25 s", FutureRequest, errors=(400,), raw={
            "200": {"description": "The finished sample or forward pass "
                                   "(tinker_public.SampleResponse, ForwardBackwardOutput: "
                                   "protobuf), a training call's JSON answer, or JSON: "
                                   "try_again, or a failure",
                    "content": {"application/x-protobuf": {"schema": {
                                    "type": "string", "contentEncoding": "binary"}},
                                "application/json": {"schema": {"anyOf": [
                                    TryAgain.model_json_schema(),
                                    RequestFailed.model_json_schema()]}}}},
            "410": {"description": "The engine's queue was full: the SDK samples again",
                    "content": {"application/json": {"schema": {
                        "$ref": REF.format(model="ErrorResponse")}}}}}),
    ("POST", "/api/v1/cancel_future"): Endpoint(
        "Tinker's SDK: accepted, nothing cancelled", FutureRequest, raw=_OK, errors=(400,)),
    ("POST", "/api/v1/telemetry"): Endpoint("Tinker's SDK: its telemetry, accepted", raw=_OK),
    ("POST", "/api/v1/create_model"): Endpoint(
        "Tinker's SDK: a LoRA on the trainable model (the rl extra); answers its future's id",
        CreateModel, UntypedFuture, errors=(400, 404, 503)),
    ("POST", "/api/v1/get_info"): Endpoint(
        "Tinker's SDK: a training model's base model, rank and tokenizer directory", GetInfo,
        InfoAnswer, errors=(400, 404, 503)),
    ("POST", "/api/v1/forward_backward"): Endpoint(
        "Tinker's SDK: a training batch (tinker_public.ForwardBackwardRequest, protobuf, "
        "zstd or not) through a loss, gradients summed unless forward_only; answers its "
        "future's id", response=UntypedFuture, errors=(400, 404, 503)),
    ("POST", "/api/v1/optim_step"): Endpoint(
        "Tinker's SDK: an AdamW step on the summed gradients; answers its future's id",
        OptimStep, UntypedFuture, errors=(400, 404, 503)),
    ("POST", "/api/v1/save_weights"): Endpoint(
        "Tinker's SDK: a checkpoint (adapter and optimizer) at a tinker:// path; answers its "
        "future's id", SaveWeights, UntypedFuture, errors=(400, 404, 503)),
    ("POST", "/api/v1/load_weights"): Endpoint(
        "Tinker's SDK: a checkpoint into a model, or into a new one; answers its future's id",
        LoadWeights, UntypedFuture, errors=(400, 404, 503)),
    ("POST", "/api/v1/save_weights_for_sampler"): Endpoint(
        "Tinker's SDK: the adapter served by the embedded engine, its weight version the "
        "checkpoint's path; answers its future's id", SaveWeightsForSampler, UntypedFuture,
        errors=(400, 404, 503)),
}
"""Tinker's routes (api/tinker.py, docs/api/tinker.md)."""

# a bad request is TGI's 422, the engine's failure its 424; 429 overloaded (api/tgi.py)
_TGI_ERRORS = (422, 424, 429)
_TGI_EXAMPLE = {"inputs": "The capital of France is",
                "parameters": {"max_new_tokens": 8, "details": True}}
_TGI: dict[tuple[str, str], Endpoint] = {
    ("POST", "/"): Endpoint(
        "TGI's compat route: `stream` picks TGI's stream, else a list holding the whole "
        "answer; return_full_text defaults to true", TGIGenerateRequest, TGICompatResponse,
        stream=TGIStreamResponse, done=False, errors=_TGI_ERRORS, error=TGIErrorResponse,
        example=_TGI_EXAMPLE),
    ("POST", "/generate"): Endpoint(
        "TGI's generation (details mode: each sampled id, its text, logprob and special)",
        TGIGenerateRequest, TGIGenerateResponse, errors=_TGI_ERRORS, error=TGIErrorResponse,
        example=_TGI_EXAMPLE),
    ("POST", "/generate_stream"): Endpoint(
        "TGI's stream: an event per sampled id (`data:` with no space, no [DONE]); refusals "
        "in-band", TGIGenerateRequest, stream=TGIStreamResponse, done=False,
        errors=_TGI_ERRORS, error=TGIErrorResponse, example=_TGI_EXAMPLE),
}
"""Text Generation Inference's routes (api/tgi.py, docs/api/tgi.md)."""

ENDPOINTS: dict[tuple[str, str], Endpoint] = {
    ("GET", "/health"): Endpoint(
        "Whether every model can serve (200) or one cannot (503); needs no key",
        response=Health, response_status=(200, 503)),
    ("GET", "/ping"): Endpoint(
        "vLLM's (SageMaker's) probe: /health's answer; needs no key", response=Health,
        response_status=(200, 503)),
    ("POST", "/ping"): Endpoint(
        "vLLM's (SageMaker's) probe: /health's answer; needs no key", response=Health,
        response_status=(200, 503)),
    ("GET", "/version"): Endpoint("vLLM's: the server's version", response=Version),
    ("GET", "/tokenizer_info"): Endpoint(
        "vLLM's: a model's tokenizer_config.json, and its versioned artifact",
        response=TokenizerConfig, errors=(400, 404)),
    ("POST", "/v1/responses"): Endpoint(
        "OpenAI's Responses API (plus token ids in and out)", ResponsesRequest, Response_,
        stream=ResponseStreamEvent, typed_events=True, errors=_GENERATION,
        example={"model": _MODEL, "input": "Say only: yes", "max_output_tokens": 8,
                 "include": ["output.token_ids"]}),
    ("POST", "/v1/messages"): Endpoint(
        "Anthropic's Messages API (plus token ids in and out); errors in Anthropic's shape",
        MessagesRequest, Message, stream=MessageStreamEvent, typed_events=True,
        errors=_GENERATION, error=AnthropicErrorBody,
        example={"model": _MODEL, "max_tokens": 8, "response_format_tokens": True,
                 "messages": [{"role": "user", "content": "Say only: yes"}]}),
    ("POST", "/v1/messages/count_tokens"): Endpoint(
        "Anthropic's token count: the prompt /v1/messages would run", CountTokensRequest,
        CountTokensResponse, errors=_TOKENIZE, error=AnthropicErrorBody,
        example={"model": _MODEL, "messages": [{"role": "user", "content": "Say only: yes"}]}),
    ("GET", "/metrics"): Endpoint("Prometheus metrics", raw={"200": {
        "description": "Prometheus' text exposition format",
        "content": {"text/plain": {"schema": {"type": "string"}}}}}),
    ("GET", "/v1/models"): Endpoint("The models served", response=ModelList),
    ("GET", "/v1/models/{model:path}"): Endpoint("One model", response=ModelCard, errors=(404,)),
    ("POST", "/v1/chat/completions"): Endpoint(
        "A chat completion (OpenAI's, plus token ids in and out)", ChatCompletionRequest,
        ChatCompletion, stream=ChatCompletionChunk, errors=_GENERATION, example=_CHAT),
    ("POST", "/v1/chat/completions/render"): Endpoint(
        "The prompt a chat request would run with", ChatCompletionRequest, RenderResponse,
        errors=_TOKENIZE, example=_CHAT),
    ("POST", "/v1/completions"): Endpoint(
        "A legacy completion (text or token id prompts)", CompletionRequest, Completion,
        stream=CompletionChunk, errors=_GENERATION,
        example={"model": _MODEL, "prompt": "The capital of France is", "max_tokens": 8,
                 "return_token_ids": True}),
    ("POST", "/inference/v1/generate"): Endpoint(
        "vLLM's tokens in, tokens out", GenerateRequest, GenerateResponse,
        stream=GenerateStreamResponse, errors=_GENERATION,
        example={"token_ids": [504, 3575, 282, 4649, 314], "sampling_params": {
            "max_tokens": 8, "temperature": 0}}),
    ("POST", "/v1/tokenize"): Endpoint(
        "Text or chat messages to ids", TokenizeRequest, TokenizeResponse, errors=_TOKENIZE,
        example=_TOKENIZE_EXAMPLE),
    ("POST", "/v1/detokenize"): Endpoint(
        "Ids to text", DetokenizeRequest, DetokenizeResponse, errors=_TOKENIZE,
        example=_DETOKENIZE_EXAMPLE),
    ("POST", "/tokenize"): Endpoint(
        "/v1/tokenize, at vLLM's path", TokenizeRequest, TokenizeResponse, errors=_TOKENIZE,
        example=_TOKENIZE_EXAMPLE),
    ("POST", "/detokenize"): Endpoint(
        "/v1/detokenize, at vLLM's path", DetokenizeRequest, DetokenizeResponse,
        errors=_TOKENIZE, example=_DETOKENIZE_EXAMPLE),
    ("GET", "/v1/chat/completions"): Endpoint(
        "Stored chat completions (store: true), oldest first: query after, limit (1-100), "
        "order (asc|desc), model, metadata[KEY]=VALUE, format (text|tokens|both)",
        response=StoredCompletionList, errors=(400,)),
    ("GET", "/v1/chat/completions/{completion_id}"): Endpoint(
        "A stored chat completion; query format (text|tokens|both)", response=ChatCompletion,
        errors=(400, 404)),
    ("GET", "/v1/inspect/completions/{completion_id}"): Endpoint(
        "A stored chat completion as the token inspector draws it: prompt and sampled ids, "
        "each with its piece, the messages' spans, the sampled mask, logprobs, weights",
        response=Inspection, errors=(400, 404)),
    ("GET", "/v1/inspect/responses/{response_id}"): Endpoint(
        "A stored response as the token inspector draws it", response=Inspection,
        errors=(400, 404)),
    ("POST", "/v1/chat/completions/{completion_id}"): Endpoint(
        "Replace a stored chat completion's metadata", UpdateCompletion, ChatCompletion,
        errors=(400, 404), example={"metadata": {"label": "kept"}}),
    ("DELETE", "/v1/chat/completions/{completion_id}"): Endpoint(
        "Delete a stored chat completion", response=DeletedCompletion, errors=(400, 404)),
    ("GET", "/v1/responses/{response_id}"): Endpoint(
        "A stored response, as it went out; query include[] (input.token_ids adds the prompt)",
        response=Response_, errors=(400, 404)),
    ("DELETE", "/v1/responses/{response_id}"): Endpoint(
        "Delete a stored response", response=DeletedResponse, errors=(400, 404)),
    ("GET", "/v1/responses/{response_id}/input_items"): Endpoint(
        "A stored response's own input items: query after, limit, order (default desc)",
        response=ResponseItemList, errors=(400, 404)),
    ("GET", "/v1/chat/completions/{completion_id}/messages"): Endpoint(
        "A stored chat completion's messages: query after, limit, order, format",
        response=StoredMessageList, errors=(400, 404)),
    ("POST", "/v1/documents"): Endpoint(
        "Store a document as ids (sent as text, encoded once, or as ids)", NewDocument,
        DocumentCreated, errors=(400,), example={"text": "The capital of France is Paris."}),
    ("POST", "/v1/documents/search"): Endpoint(
        "Documents ranked by BM25 over token ids (a text query is encoded once)",
        DocumentSearchRequest, DocumentSearchResults, errors=(400,),
        example={"query": "capital of France", "limit": 3}),
    ("GET", "/v1/documents/{document_id}"): Endpoint(
        "A stored document; query format (tokens, the default, text or both)",
        response=Document, errors=(400, 404)),
    ("DELETE", "/v1/documents/{document_id}"): Endpoint(
        "Delete a stored document", response=DeletedDocument, errors=(400, 404)),
    ("GET", "/v1/tokenizers"): Endpoint("The tokenizer versions known", response=TokenizerList),
    ("POST", "/v1/tokenizers/translate"): Endpoint(
        "Ids of one tokenizer version to the ids of the same bytes in another",
        TranslateRequest, TranslateResponse, errors=_TOKENIZE,
        example={"from": "smollm2-49k", "to": "smollm2-49k", "token_ids": [19556, 28, 905]}),
    ("GET", "/v1/tokenizers/{version:path}/tokenizer.json"): Endpoint(
        "A version's portable tokenizer.json", errors=(404,), raw={
            "200": {"description": "The tokenizer.json (Hugging Face tokenizers' format)",
                    "headers": {k: {"description": v, "schema": {"type": "string"}}
                                for k, v in _TOKENIZER_HEADERS.items()},
                    "content": {"application/json": {"schema": {"type": "object"}}}},
            "304": {"description": "If-None-Match named its ETag: the bytes are unchanged"}}),
    ("GET", "/v1/tokenizers/{version:path}"): Endpoint(
        "One tokenizer version (by full id or alias)", response=TokenizerInfo, errors=(404,)),
    **{(method, path): Endpoint(
        f"vLLM's control plane ({op}), on every replica at once; admin keys only", errors=(
            400, 403, 502), raw={"200": {
                "description": "vLLM's answer (the replicas agree on it), and `replicas`: each "
                               "replica's status and body",
                "content": {"application/json": {"schema": {"type": "object"}}}}})
       for op, (method, path) in CONTROL_OPS.items()},
    ROLLING_UPDATE: Endpoint(
        "New weights for the fleet a few replicas at a time (each held out of routing, paused, "
        "updated by `calls`, labelled, read back, resumed); replicas already on "
        "`weight_version` are skipped, so the same call resumes a roll that stopped; admin "
        "keys only", RollingUpdateBody, errors=(400, 403, 409, 502), raw={"200": {
            "description": "`weight_version`, `seconds`, and `replicas`: each replica's model, "
                           "name, version and state (current, updated)",
            "content": {"application/json": {"schema": {"type": "object"}}}}},
        example={"weight_version": "step-8", "max_unavailable": 1, "calls": [
            {"op": "collective_rpc", "body": {"method": "reload_weights",
                                              "kwargs": {"weights_path": "/ckpt/step-8"}}}]}),
    **_TINKER,
    **_TGI,
}

#: paths served but not in the document, and why
NOT_DOCUMENTED: dict[str, str] = {
    "/openapi.json": "the document itself",
    "/docs": "the page that renders the document",
    "/docs/assets/{name}": "the page's scripts and styles",
    "/inspect": "the token inspector's page (docs/inspector.md)",
    "/inspect/assets/{name}": "the inspector's script and styles",
}

_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def _event(chunk: dict[str, Any], error: dict[str, Any], done: bool = True) -> dict[str, Any]:
    """One server-sent event (OpenAPI 3.1 describes a stream by its events): a chunk, an error
    after the first chunk (the status is sent by then), or the closing `[DONE]`."""
    event = {"type": "string", "contentMediaType": "application/json",
             "contentSchema": {"anyOf": [chunk, error]}}
    if not done:  # TGI's
        return {"type": "object", "required": ["data"], "properties": {"data": {
            **event, "description": "`data:<event>` per token (no space after `data:`), "
                                    "nothing after the last; a refusal or failure comes "
                                    "in-band as `data:<TGIErrorResponse>`, and ends it."}}}
    return {"type": "object", "required": ["data"], "properties": {"data": {
        "anyOf": [event, {"const": "[DONE]"}],
        "description": "`data: <chunk>` per event, then `data: [DONE]`; an error after the first "
                       "event comes in-band as `data: <ErrorResponse>`, then `[DONE]`.",
    }}}


def _typed_event(event: dict[str, Any]) -> dict[str, Any]:
    """One typed server-sent event: `event: <type>`, then its JSON (an error after the first
    event is `response.failed`, one of the types)."""
    return {"type": "object", "required": ["event", "data"], "properties": {
        "event": {"type": "string", "description": "The event's `type`."},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": event},
    }}


def _operation(route: Route, ep: Endpoint, refs: Mapping[type[Any], Any]) -> dict[str, Any]:
    def json_body(model: type[BaseModel]) -> dict[str, Any]:
        return {"schema": refs[model]}

    responses: dict[str, Any] = {}
    for status in ep.response_status:
        content: dict[str, Any] = {}
        if ep.response is not None:
            content["application/json"] = json_body(ep.response)
        if ep.stream is not None:
            content["text/event-stream"] = {"schema": _typed_event(refs[ep.stream])
                                            if ep.typed_events
                                            else _event(refs[ep.stream], refs[ep.error],
                                                        ep.done)}
        if content:
            responses[str(status)] = {"description": HTTPStatus(status).phrase, "content": content}
    responses.update(ep.raw)
    errors = set(ep.errors)
    if route.path not in OPEN_PATHS:
        errors.add(401)
    if ep.request is not None:
        errors.add(413)
    for status in sorted(errors):
        responses[str(status)] = {"description": HTTPStatus(status).phrase,
                                  "content": {"application/json": json_body(ep.error)}}
    op: dict[str, Any] = {"summary": ep.summary}
    if doc := inspect.getdoc(route.endpoint):
        op["description"] = doc
    if params := _PARAM.findall(route.path):
        op["parameters"] = [{"name": p, "in": "path", "required": True,
                             "schema": {"type": "string"},
                             **({"example": _PATH_EXAMPLES[p]} if p in _PATH_EXAMPLES else {})}
                            for p in params]
    if ep.request is not None:
        body = json_body(ep.request)
        if ep.example is not None:
            body["examples"] = {"whole": {"value": ep.example}}
            if ep.stream is not None:
                body["examples"]["stream"] = {"value": {**ep.example, "stream": True}}
        op["requestBody"] = {"required": True, "content": {"application/json": body}}
    op["responses"] = responses
    return op


def build_document(routes: Sequence[BaseRoute]) -> dict[str, Any]:
    """The OpenAPI document of `routes`; LookupError names a route `ENDPOINTS` lacks, or an
    entry no route has."""
    found: list[tuple[Route, str, Endpoint]] = []
    for route in routes:
        path = getattr(route, "path", None)
        if path in NOT_DOCUMENTED:
            continue
        if not isinstance(route, Route) or not route.methods:
            raise LookupError(f"route {path or route!r} is neither in ENDPOINTS nor in "
                              "NOT_DOCUMENTED (api/openapi.py)")
        for method in sorted(route.methods - {"HEAD"}):
            ep = ENDPOINTS.get((method, route.path))
            if ep is None:
                raise LookupError(f"{method} {route.path} is neither in ENDPOINTS nor in "
                                  "NOT_DOCUMENTED (api/openapi.py)")
            found.append((route, method, ep))
    if stale := ENDPOINTS.keys() - {(m, r.path) for r, m, _ in found}:
        raise LookupError(f"ENDPOINTS names routes the app does not have: {sorted(stale)}")

    models = {m for _, _, ep in found for m in ep.models()} | {ErrorResponse}
    # validation mode for responses too: their serializer only drops fields listed in
    # `omit_if_none` (which pydantic would describe as "any"); ResponseModel's schema requires
    # every other field
    keyed, defs = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)], ref_template=REF)
    refs = {m: schema for (m, _), schema in keyed.items()}

    paths: dict[str, dict[str, Any]] = {}
    for route, method, ep in found:
        paths.setdefault(_PARAM.sub(r"{\1}", route.path), {})[method.lower()] = (
            _operation(route, ep, refs))
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "tokenwire",
            "version": __version__,
            "description": (
                "A token-native, OpenAI-compatible LLM API: OpenAI's and vLLM's shapes, plus "
                "token ids in and out, pinned to versioned tokenizers. Each field's description "
                "says what tokenwire adds; docs/api.md is the full reference."),
        },
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "Needed when the server has API keys (TOKENWIRE_API_KEYS)"}},
        },
        # optional: a server without keys takes requests without one
        "security": [{}, {"bearer": []}],
    }


async def openapi_json(request: Request) -> Response:
    state = request.app.state
    if getattr(state, "openapi", None) is None:  # built once per app, on first request
        state.openapi = dumps(build_document(request.app.routes))
    return Response(state.openapi, media_type="application/json")
