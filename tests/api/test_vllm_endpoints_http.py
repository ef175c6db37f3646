"""vLLM's small endpoints (`/ping`, `/version`, `/tokenizer_info`) and its model card fields,
against the shapes recorded from vLLM's source (tests/engines/shapes/vllm/)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine
from tokenwire import __version__
from tokenwire.engines.base import EngineHealth
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.anyio

SHAPES = Path(__file__).parents[1] / "engines" / "shapes" / "vllm"


def shape(name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((SHAPES / f"{name}.json").read_text())  # type: ignore[no-any-return]


async def test_ping_answers_as_health_does_and_needs_no_key(make_app,  # type: ignore[no-untyped-def]
                                                            fake_engine: FakeEngine) -> None:
    async with serve_in_process(make_app(api_keys=["k"])) as c:
        for method in ("GET", "POST"):  # vLLM's (SageMaker's) probe takes both
            assert (await c.request(method, "/ping")).status_code == 200
        fake_engine.health_report = EngineHealth(ok=False, reason="down")
        assert (await c.get("/ping")).status_code == 503
        assert (await c.get("/version")).status_code == 401  # not a probe


async def test_version_has_vllms_shape(client: httpx.AsyncClient) -> None:
    data = (await client.get("/version")).json()
    assert set(data) == set(shape("version_response")) and data["version"] == __version__


async def test_model_cards_carry_root_and_parent(client: httpx.AsyncClient,
                                                 fake_engine: FakeEngine) -> None:
    [card] = (await client.get("/v1/models")).json()["data"]
    vllm_card = shape("v1_models_response")["data"][0]
    assert set(vllm_card) - set(card) == {"permission"}  # see docs/api.md
    assert (card["root"], card["parent"]) == (fake_engine.info.model, None)


async def test_tokenizer_info_points_at_the_versioned_artifact(
        client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    info = (await client.get("/tokenizer_info")).json()
    assert info["tokenizer_class"] == "PreTrainedTokenizerFast"  # vLLM's one required key
    assert info["tokenizer_version"] == tok.version and info["model_max_length"] == 2048
    assert info["added_tokens_decoder"]["1"] == {  # Hugging Face's keys, from the artifact
        "content": "<|im_start|>", "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False, "special": True}
    assert info["eos_token"] == "<|im_end|>" and "<|im_start|>" in info["chat_template"]
    art = await client.get(info["artifact_url"])
    assert hashlib.sha256(art.content).hexdigest() == info["sha256"] == tok.sha256
    assert (await client.get("/tokenizer_info", params={"model": MODEL})).json() == info
    r = await client.get("/tokenizer_info", params={"model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
