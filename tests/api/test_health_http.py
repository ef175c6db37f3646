"""GET /health: 200 while every model can serve, 503 with the reason when one cannot."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes import MODEL, FakeEngine
from tokenwire.engines.base import EngineHealth, ReplicaHealth

pytestmark = pytest.mark.anyio


async def test_health_follows_the_engine(client: httpx.AsyncClient,
                                         fake_engine: FakeEngine) -> None:
    r = await client.get("/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    replicas = (ReplicaHealth("http://a:8000", "replica 1", True, in_flight=2, served=9),
                ReplicaHealth("http://b:8000", "replica 2", False, reason="health check failed"))
    fake_engine.health_report = EngineHealth(ok=True, replicas=replicas)
    r = await client.get("/health")
    assert r.status_code == 200
    reps = r.json()["models"][MODEL]["replicas"]
    assert [(x["healthy"], x["reason"], x["served"]) for x in reps] == [
        (True, None, 9), (False, "health check failed", 0)]
    fake_engine.health_report = EngineHealth(ok=False, reason="no upstream replica can serve",
                                             replicas=replicas[1:])
    r = await client.get("/health")
    assert r.status_code == 503
    assert r.json()["status"] == "unavailable"
    assert r.json()["models"][MODEL]["reason"] == "no upstream replica can serve"


async def test_health_needs_no_key_but_its_details_do(make_app,  # type: ignore[no-untyped-def]
                                                       fake_engine: FakeEngine) -> None:
    from tests.conftest import serve_in_process

    fake_engine.health_report = EngineHealth(ok=False, reason="replica 1 (http://10.0.0.7:8000)"
                                             ": down", replicas=(ReplicaHealth(
                                                 "http://10.0.0.7:8000", "replica 1", False),))
    async with serve_in_process(make_app(api_keys=["k"])) as c:
        r = await c.get("/health")
        assert (r.status_code, r.json()) == (503, {"status": "unavailable"})  # no addresses
        r = await c.get("/health", headers={"Authorization": "Bearer k"})
        assert r.status_code == 503 and "10.0.0.7" in r.json()["models"][MODEL]["reason"]
        r = await c.get("/health", headers={"Authorization": "Bearer wrong"})
        assert r.json() == {"status": "unavailable"}
        assert (await c.get("/v1/models")).status_code == 401
