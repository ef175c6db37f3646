"""Asynchronous RL on a fleet: a rolling weight update through the gateway while requests keep
coming, one that stops part-way and is resumed, and requests bounded by weight version, in
front of two real tokenwire replicas (the embedded engine, LoRA adapters from disk)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.test_gateway import MODEL, gateway, wait_for
from tests.upstreams import Upstream
from tokenwire.client import Client
from tokenwire.rl.lora import write_lora_gguf

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ADMIN = {"Authorization": "Bearer admin"}
USER = {"Authorization": "Bearer user"}


def adapter(path: Path, seed: int) -> Path:
    """A random rank-4 adapter on SmolLM2's attention projections (enough to change greedy
    output)."""
    rng = np.random.default_rng(seed)
    dims = {"self_attn.q_proj": (576, 576), "self_attn.o_proj": (576, 576)}
    pairs = {f"model.layers.{i}.{m}": (rng.normal(0, 0.03, (4, n_in)),
                                       rng.normal(0, 0.03, (n_out, 4)))
             for i in range(30) for m, (n_in, n_out) in dims.items()}
    return write_lora_gguf(path, pairs, alpha=8, n_head=9, n_head_kv=3)


@pytest.fixture
def fleet(two: list[Upstream], tmp_path: Path) -> Iterator[httpx.Client]:
    with gateway(tmp_path, engine="vllm", upstream=[u.url for u in two], health_interval=0.3,
                 api_keys=["user"], admin_keys=["admin"], raw_prompts="allow",
                 weight_version_wait=6) as http:
        wait_for(lambda: all(r["healthy"] for r in replicas(http)), 60)
        yield http
        # leave the replicas as the next test expects them: serving, the bare model
        http.post("/resume", headers=ADMIN)
        http.post("/update_weights", headers=ADMIN, json={"update_info": {"lora": []}})


def replicas(http: httpx.Client) -> list[dict[str, Any]]:
    return http.get("/health", headers=USER).json()["models"][MODEL]["replicas"]  # type: ignore


def ask(http: httpx.Client, text: str, **kw: Any) -> httpx.Response:
    return http.post("/v1/chat/completions", headers=USER, json={
        "model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0,
        "max_tokens": 8, **kw})


class Load:
    """Requests one after another from two threads until stopped: each one's status and the
    versions its sample names."""

    def __init__(self, http: httpx.Client):
        self.results: list[tuple[int, list[str]]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(http, k)) for k in range(2)]

    def _run(self, http: httpx.Client, k: int) -> None:
        i = 0
        while not self._stop.is_set():
            r = ask(http, f"Count to {i} in words, thread {k}.")
            i += 1
            versions = [s["version"] for s in r.json()["choices"][0]["weight_versions"]] \
                if r.status_code == 200 else [r.text]
            self.results.append((r.status_code, versions))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)


def test_a_rolling_update_under_load(fleet: httpx.Client, two: list[Upstream],
                                     tmp_path: Path) -> None:
    """One call updates the fleet a replica at a time: no request fails, every sample names
    the weights that made it (the old version or the new, never a mixture), and the fleet ends
    on the new version."""
    http = fleet
    old = http.get("/weight_info", headers=ADMIN).json()["weight_version"]
    lora = adapter(tmp_path / "a.gguf", 0)
    with Load(http) as load:
        time.sleep(1.0)
        r = http.post("/rolling_update", headers=ADMIN, json={
            "weight_version": "step-1", "max_unavailable": 1,
            "calls": [{"op": "update_weights", "body": {"update_info": {"lora_path": str(lora)}}}]})
        time.sleep(1.0)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [(x["replica"], x["state"], x["weight_version"]) for x in body["replicas"]] == [
        ("replica 1", "updated", "step-1"), ("replica 2", "updated", "step-1")]
    assert load.results and all(s == 200 for s, _ in load.results), load.results
    seen = {v for _, vs in load.results for v in vs}
    assert seen <= {old, "step-1"} and "step-1" in seen, seen
    assert all(len(vs) == 1 for _, vs in load.results)  # one set of weights per sample
    assert http.get("/weight_info", headers=ADMIN).json()["weight_version"] == "step-1"
    assert [x["weight_version"] for x in replicas(http)] == ["step-1", "step-1"]
    assert [httpx.get(u.url + "/weight_info").json()["weight_version"] for u in two] == \
        ["step-1"] * 2
    # another gateway box in front of the same fleet, which saw none of the control calls:
    # it routes by what the replicas report themselves
    with gateway(tmp_path, engine="vllm", upstream=[u.url for u in two], health_interval=0.3,
                 api_keys=["user"], admin_keys=["admin"], weight_version_wait=6) as other:
        wait_for(lambda: [x["weight_version"] for x in replicas(other)] == ["step-1"] * 2, 60)
        got = ask(other, "Say only yes.", min_weight_version="step-1", max_staleness=0)
        assert got.status_code == 200, got.text
        assert got.json()["choices"][0]["weight_versions"][0]["version"] == "step-1"
    # the same call again (through the Python client): nothing left to do
    with Client(str(http.base_url).rstrip("/") + "/v1", api_key="admin") as client:
        again = client.control("rolling_update", {"weight_version": "step-1"})
    assert [x["state"] for x in again["replicas"]] == ["current", "current"]


def test_a_refused_update_stops_the_roll_and_changes_nothing(fleet: httpx.Client,
                                                             tmp_path: Path) -> None:
    """Replica 1 refuses the update (no such adapter: a 400): the roll stops there, replica 1
    serves its old weights again, replica 2 is not reached."""
    http = fleet
    old = http.get("/weight_info", headers=ADMIN).json()["weight_version"]
    r = http.post("/rolling_update", headers=ADMIN, json={
        "weight_version": "never", "calls": [{"op": "update_weights", "body": {
            "update_info": {"lora_path": str(tmp_path / "missing.gguf")}}}]})
    assert (r.status_code, r.json()["error"]["code"]) == (502, "replica_failed")
    assert "refused: the batch serves its old weights again" in r.json()["error"]["message"]
    assert [(x["state"], x["weight_version"]) for x in r.json()["replicas"]] == [
        ("failed", old), ("pending", old)]
    assert [(x["weight_version"], x["paused"]) for x in replicas(http)] == [(old, False)] * 2
    assert ask(http, "Say only yes.").status_code == 200


def test_a_roll_that_stops_says_who_holds_what_and_resumes(fleet: httpx.Client,
                                                           two: list[Upstream],
                                                           tmp_path: Path) -> None:
    """Replica 2 is lost in the middle of its update: the roll stops there, replica 2 is held
    out of routing (what it holds is in doubt) and stays so when it comes back; /health and
    /weight_info say who holds what; bounded requests go where the bound holds or wait and get
    a 409 naming the versions; the same call again finishes the roll."""
    http = fleet
    old = http.get("/weight_info", headers=ADMIN).json()["weight_version"]
    lora = adapter(tmp_path / "b.gguf", 1)
    roll = {"weight_version": "step-2", "calls": [
        {"op": "update_weights", "body": {"update_info": {"lora_path": str(lora)}}}]}
    # a long request on replica 2: its pause (wait) drains it, which leaves time to lose
    # replica 2 once replica 1 is done
    def long_request() -> None:
        with contextlib.suppress(httpx.HTTPError):  # its replica is killed under it
            httpx.post(two[1].url + "/v1/completions", timeout=300, json={
                "model": MODEL, "prompt": "Once upon a time", "max_tokens": 300,
                "ignore_eos": True, "temperature": 0})

    slow = threading.Thread(target=long_request)
    slow.start()
    time.sleep(0.5)
    answer: list[httpx.Response] = []
    rolling = threading.Thread(target=lambda: answer.append(http.post(
        "/rolling_update", headers=ADMIN, json=roll)))
    rolling.start()
    wait_for(lambda: replicas(http)[0]["weight_version"] == "step-2", 60)
    # mid-roll: replica 1 serves the new weights, replica 2 the old (draining)
    info = http.get("/weight_info", headers=ADMIN).json()
    assert info["weight_version"] is None  # no one version is the fleet's
    assert [x["body"]["weight_version"] for x in info["replicas"]] == ["step-2", old]
    two[1].kill()
    rolling.join(timeout=120)
    slow.join(timeout=120)
    r = answer[0]
    assert (r.status_code, r.json()["error"]["code"]) == (502, "replica_failed")
    assert [(x["replica"], x["state"]) for x in r.json()["replicas"]] == [
        ("replica 1", "updated"), ("replica 2", "failed")]
    two[1].start()  # back with the weights it was started with: held until the roll is done
    wait_for(lambda: replicas(http)[1]["healthy"], 60)
    assert [(x["weight_version"], x["paused"]) for x in replicas(http)] == \
        [("step-2", False), (old, True)]
    # every request goes to replica 1 meanwhile; bounds are met there or nowhere
    for kw in ({}, {"max_staleness": 0}, {"min_weight_version": "step-2"},
               {"min_weight_version": old}):
        got = ask(http, "Say only yes.", **kw)
        assert got.status_code == 200, (kw, got.text)
        assert got.json()["choices"][0]["weight_versions"][0]["version"] == "step-2"
    started = time.monotonic()
    r = ask(http, "Say only yes.", min_weight_version="step-3")
    assert (r.status_code, r.json()["error"]["code"]) == (409, "weight_version_unavailable")
    assert time.monotonic() - started >= 5  # it waited (weight_version_wait)
    err = r.json()["error"]
    assert err["param"] == "min_weight_version"
    assert "'step-2'" in err["message"] and repr(old) in err["message"], err
    # the same call again: replica 1 is left alone, replica 2 (held) updated
    r = http.post("/rolling_update", headers=ADMIN, json=roll)
    assert r.status_code == 200, r.text
    assert [x["state"] for x in r.json()["replicas"]] == ["current", "updated"]
    assert [(x["weight_version"], x["paused"]) for x in replicas(http)] == \
        [("step-2", False), ("step-2", False)]
    # a request waiting for a version is served once a roll brings it
    waited: list[httpx.Response] = []
    t = threading.Thread(target=lambda: waited.append(
        ask(http, "Say only no.", min_weight_version="step-3", max_staleness=0)))
    t.start()
    time.sleep(1.0)
    r = http.post("/rolling_update", headers=ADMIN, json={"weight_version": "step-3",
                                                          "max_unavailable": 2})
    assert r.status_code == 200, r.text
    t.join(timeout=60)
    assert waited[0].status_code == 200, waited[0].text
    assert waited[0].json()["choices"][0]["weight_versions"][0]["version"] == "step-3"


def test_rolling_updates_refuse_what_they_cannot_do(fleet: httpx.Client) -> None:
    """A paused fleet is not resumed behind the trainer's back; a bad step is named; a user key
    reaches nothing."""
    http = fleet
    r = http.post("/rolling_update", headers=USER, json={"weight_version": "x"})
    assert (r.status_code, r.json()["error"]["code"]) == (403, "admin_key_required")
    r = http.post("/rolling_update", headers=ADMIN, json={
        "weight_version": "x", "calls": [{"op": "pause"}]})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "calls[0].op")
    r = http.post("/rolling_update", headers=ADMIN, json={
        "weight_version": "x", "calls": [{"op": "collective_rpc", "body": {"kwargs": {}}}]})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "calls[0].body.method")
    r = http.post("/rolling_update", headers=ADMIN, json={
        "weight_version": "x", "pause_mode": "keep"})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "pause_mode")
    assert http.post("/pause", headers=ADMIN).status_code == 200
    r = http.post("/rolling_update", headers=ADMIN, json={"weight_version": "x"})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "fleet_paused")
    assert http.post("/resume", headers=ADMIN).status_code == 200
    r = ask(http, "Say only yes.", max_staleness=-1)
    assert (r.status_code, r.json()["error"]["param"]) == (400, "max_staleness")
