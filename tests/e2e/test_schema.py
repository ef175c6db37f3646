"""Schemathesis against the live server (real uvicorn, the real engine and model): requests
generated from GET /openapi.json, valid and invalid, get no 5xx, and every answer is one the
document describes (status, content type, body; each event of a stream too: schemathesis
reads `contentSchema`)."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import LiveServer
from tokenwire.api.app import create_app
from tokenwire.api.openapi import build_document
from tokenwire.engines.base import CONTROL_OPS
from tokenwire.protocol.control import ROLLING_UPDATE

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
MAX_TOKENS = 3
"""Every generated request samples at most this many tokens per choice (a CPU run stays short)."""
EXAMPLES = int(os.environ.get("TOKENWIRE_SCHEMA_EXAMPLES", "25"))
"""Generated requests per operation, valid and invalid together (and the documented example)."""


DOCUMENT = json.loads(json.dumps(build_document(create_app().routes)))
"""What the app serves at /openapi.json (checked below): generation needs it at collection,
before the live server is up."""


@pytest.fixture(scope="module")
def version(live_server: LiveServer) -> str:
    r = httpx.get(f"{live_server.url}/v1/models")
    return str(r.json()["data"][0]["tokenizer_version"])


api = schemathesis.openapi.from_dict(DOCUMENT, config=schemathesis.Config.from_dict({
    "seed": 1,  # the same requests every run: a failure is reproducible
    "request-timeout": 120,  # a busy CI machine: a slow answer is not what this tests
    # the coverage phase's boundary cases number in the hundreds on the chat body alone
    "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
})).exclude(path=[*(path for _, path in CONTROL_OPS.values()), ROLLING_UPDATE[1]])
"""The control plane is left out: its calls pause and relabel the engine every later test uses
(tests/api/test_control_http.py, tests/e2e/test_rolling.py and tests/e2e/test_vllm.py test
it)."""


def test_the_live_server_serves_this_document(live_server: LiveServer) -> None:
    r = httpx.get(f"{live_server.url}/openapi.json")
    assert r.status_code == 200
    assert r.json() == DOCUMENT


GENERATING = {"/v1/chat/completions", "/v1/completions", "/v1/responses"}
"""Where a body without `max_tokens` may sample to the end of the context."""
TGI = {"/", "/generate", "/generate_stream"}
"""TGI's routes: `parameters.max_new_tokens` is their limit, `best_of` their `n`."""


def _cap(body: dict[str, Any], *, fill: bool) -> None:
    """At most MAX_TOKENS per choice and 2 choices; `fill`: a limit where none is given."""
    responses = "input" in body
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            body[key] = min(value, MAX_TOKENS)
        elif fill and (key == ("max_output_tokens" if responses else "max_tokens")
                       or key in body):
            body[key] = MAX_TOKENS
    if isinstance(body.get("n"), int) and not isinstance(body["n"], bool):
        body["n"] = min(body["n"], 2)


def _integers(value: Any) -> Any:
    """JSON Schema's integers include 3.0; tokenwire's, like JSON's, do not (docs/api.md)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, list):
        return [_integers(v) for v in value]
    if isinstance(value, dict):
        return {k: _integers(v) for k, v in value.items()}
    return value


def _bound(case: Any, version: str) -> None:
    """Cap what a request may generate; point a valid one at the real model and version (or
    nearly every request is a 404)."""
    valid = case.meta.generation.mode.is_positive
    if valid:
        case.body = _integers(case.body)
    body = case.body
    _cap(body, fill=valid and case.path in GENERATING)
    if isinstance(params := body.get("sampling_params"), dict):
        _cap(params, fill=valid)
    if case.path in TGI:
        if valid and body.get("parameters") is None:
            body["parameters"] = {}
        if isinstance(params := body.get("parameters"), dict):
            limit = params.get("max_new_tokens")
            if isinstance(limit, int) and not isinstance(limit, bool):
                params["max_new_tokens"] = min(limit, MAX_TOKENS)
            elif valid:
                params["max_new_tokens"] = MAX_TOKENS
            if isinstance(params.get("best_of"), int) and not isinstance(params["best_of"], bool):
                params["best_of"] = min(params["best_of"], 2)
    if valid and isinstance(body.get("model"), str):
        body["model"] = MODEL
    if valid and isinstance(body.get("tokenizer_version"), str):
        body["tokenizer_version"] = version


@api.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: Any, live_server: LiveServer, version: str) -> None:
    if isinstance(case.body, dict):
        _bound(case, version)
    case.call_and_validate(base_url=live_server.url, checks=[
        not_a_server_error, status_code_conformance, content_type_conformance,
        response_schema_conformance])
