"""The control plane over HTTP, in process: who may call it, and an engine without one.
Against real vLLM replicas (fan-out, partial failure, a replica that joins later):
tests/e2e/test_vllm.py."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import serve_in_process
from tokenwire.engines.base import CONTROL_OPS

pytestmark = pytest.mark.anyio


async def test_only_admin_keys_reach_the_control_plane(make_app) -> None:  # type: ignore[no-untyped-def]
    async with serve_in_process(make_app(api_keys=["user"], admin_keys=["admin"])) as c:
        for op, (method, path) in CONTROL_OPS.items():
            r = await c.request(method, path, headers={"Authorization": "Bearer user"})
            assert r.status_code == 403, op
            assert r.json()["error"]["code"] == "admin_key_required"
            r = await c.request(method, path)
            assert r.status_code == 401, op
        # an admin key is an API key too; the scripted engine has no control plane
        r = await c.post("/pause", headers={"Authorization": "Bearer admin"})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "pause"
        r = await c.get("/v1/models", headers={"Authorization": "Bearer admin"})
        assert r.status_code == 200


async def test_a_keyless_server_answers_loopback_clients_only(make_app) -> None:  # type: ignore[no-untyped-def]
    app = make_app()
    async with serve_in_process(app) as c:  # httpx's in-process client is 127.0.0.1
        assert (await c.post("/resume")).status_code == 400  # allowed; the scripted engine has none
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            r = await c.post("/resume")
            assert (r.status_code, r.json()["error"]["code"]) == (403, "admin_key_required")


async def test_a_control_body_must_be_an_object(make_app) -> None:  # type: ignore[no-untyped-def]
    async with serve_in_process(make_app()) as c:
        r = await c.post("/update_weight_version", content=b"[1]")
        assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
        r = await c.post("/update_weight_version", content=b"{")
        assert r.status_code == 400
