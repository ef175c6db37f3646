"""Valid-but-extreme requests on the real engine: no 5xx, and the engine keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from tests.api.test_fuzz import check, valid_bodies
from tests.conftest import LiveServer

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def http(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=120) as c:
        yield c


def _on_the_real_model(case: tuple[str, Any]) -> tuple[str, Any]:
    path, body = case
    return path, {**body, "model": MODEL, "max_tokens": min(body.get("max_tokens", 8), 8)}


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=valid_bodies().map(_on_the_real_model))
def test_extreme_sampling_on_the_real_engine(http: httpx.Client, case: tuple[str, Any]) -> None:
    path, body = case
    check(http.post(path, json=body))


def test_still_serving_afterwards(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 4,
                                                "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
