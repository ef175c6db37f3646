"""Several models in one server: each on its own real llama.cpp engine with its own settings,
listed in /v1/models, routed by `model`, their tokenizers under /v1/tokenizers. The second
model is SmolLM2 again under another name (the one model installed everywhere), with a
different context, so a request reaching the wrong engine shows."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import TEST_UPSTREAM, _free_port, serve_in_process
from tokenwire.api.app import create_app
from tokenwire.config import Settings

pytestmark = [pytest.mark.engine, pytest.mark.anyio,
              # embedded engines of their own: nothing here goes through the gateway
              pytest.mark.skipif(bool(TEST_UPSTREAM), reason="embedded engines only: run once")]

SMALL, LARGE = "small", "large"
SPECS = [f"smollm2-135m,name={SMALL},max_model_len=512,n_parallel=1,n_batch=64",
         f"smollm2-135m,name={LARGE},max_model_len=1024,n_parallel=2"]


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(models=SPECS, tokenizer_store=tmp_path / "store")  # type: ignore[arg-type]
    async with serve_in_process(create_app(settings)) as c:
        yield c


async def test_both_models_are_listed_with_their_own_settings(
        client: httpx.AsyncClient) -> None:
    cards = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert list(cards) == [SMALL, LARGE]
    assert cards[SMALL]["max_model_len"] == 512 and cards[LARGE]["max_model_len"] == 1024
    version = cards[SMALL]["tokenizer_version"]
    assert cards[LARGE]["tokenizer_version"] == version
    [entry] = (await client.get("/v1/tokenizers")).json()["data"]
    assert entry["id"] == version and sorted(entry["models"]) == [LARGE, SMALL]
    # an unknown model: 404, naming both
    r = await client.post("/v1/chat/completions", json={
        "model": "nope", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert SMALL in err["message"] and LARGE in err["message"]


@pytest.mark.slow
async def test_requests_route_by_model(client: httpx.AsyncClient) -> None:
    for name in (SMALL, LARGE):
        r = await client.post("/v1/chat/completions", json={
            "model": name, "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 8, "temperature": 0, "return_token_ids": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == name and body["choices"][0]["token_ids"]
    # a prompt that fits only the larger context: each engine's own limit decides
    prompt = list(range(1000, 1520))
    version = (await client.get("/v1/models")).json()["data"][0]["tokenizer_version"]
    req = {"prompt": prompt, "max_tokens": 1, "tokenizer_version": version}
    small = await client.post("/v1/completions", json={"model": SMALL, **req})
    assert small.status_code == 400, small.text
    assert small.json()["error"]["code"] == "context_length_exceeded"
    large = await client.post("/v1/completions", json={"model": LARGE, **req})
    assert large.status_code == 200, large.text


@pytest.mark.slow
def test_tokenwire_serve_with_two_models(tmp_path: Path) -> None:
    """The CLI: two --model flags, one process, both answer by name."""
    port = _free_port()
    log = (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenwire", "serve", "--port", str(port), *(
            a for spec in SPECS for a in ("--model", spec))],
        env={"TOKENWIRE_TOKENIZER_STORE": str(tmp_path / "store"), "PATH": "/usr/bin:/bin",
             "PYTHONPATH": ":".join(sys.path)},
        stdout=subprocess.DEVNULL, stderr=log, text=True)
    try:
        base = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 120
        while True:
            try:
                models = httpx.get(f"{base}/models").json()["data"]
                break
            except httpx.TransportError:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        assert [m["id"] for m in models] == [SMALL, LARGE]
        for name in (SMALL, LARGE):
            r = httpx.post(f"{base}/chat/completions", timeout=60, json={
                "model": name, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200 and r.json()["model"] == name, r.text
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


@pytest.mark.slow
async def test_two_families_in_one_server(tmp_path: Path) -> None:
    """SmolLM2 and Gemma 3 by their short names: two engines, two tokenizer versions (one per
    family), each request answered in its own model's ids."""
    settings = Settings(models=["smollm2-135m,max_model_len=1024,n_parallel=1",  # type: ignore[arg-type]
                                "gemma3-270m,max_model_len=1024,n_parallel=1"],
                        tokenizer_store=tmp_path / "store")
    async with serve_in_process(create_app(settings)) as c:
        cards = {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}
        assert len(cards) == 2
        versions = {m["tokenizer_version"].split("@")[0] for m in cards.values()}
        assert len(versions) == 2  # two families
        listed = {e["id"] for e in (await c.get("/v1/tokenizers")).json()["data"]}
        assert {m["tokenizer_version"] for m in cards.values()} <= listed
        for name, card in cards.items():
            r = await c.post("/v1/chat/completions", json={
                "model": name, "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 6, "temperature": 0, "return_token_ids": True})
            data = r.json()
            assert r.status_code == 200, data
            assert data["tokenizer_version"] == card["tokenizer_version"]
            t = await c.post("/v1/detokenize", json={
                "model": name, "tokenizer_version": card["tokenizer_version"],
                "tokens": data["choices"][0]["token_ids"]})
            assert t.status_code == 200, t.text
            assert t.json()["prompt"] == data["choices"][0]["message"]["content"]

