"""Tinker's routes over HTTP, in process (the scripted engine): the SDK's `tml-` key in its
`X-API-Key` header is an API key like any other, the futures' protobuf is the SDK's own
message, and a server without the `tinker` extra refuses the routes by name. The SDK itself
runs against a real server in tests/e2e/test_tinker.py."""

from __future__ import annotations

import pytest
from tinker.proto import tinker_public_pb2 as pb

from tests.conftest import serve_in_process

pytestmark = pytest.mark.anyio

MODEL = "fake-smollm2"  # the scripted engine's name (tests/conftest.py)


async def test_a_tml_key_is_an_api_key(make_app) -> None:  # type: ignore[no-untyped-def]
    app = make_app(api_keys=["tml-team-a"])
    async with serve_in_process(app) as c:
        assert (await c.get("/api/v1/get_server_capabilities")).status_code == 401
        wrong = await c.get("/api/v1/get_server_capabilities",
                            headers={"X-API-Key": "tml-team-b"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        ok = await c.get("/api/v1/get_server_capabilities", headers={"X-API-Key": "tml-team-a"})
        assert ok.status_code == 200
        assert ok.json()["supported_models"][0]["model_name"] == MODEL


async def test_a_future_is_the_sdks_protobuf(make_app, fake_engine) -> None:  # type: ignore[no-untyped-def]
    async with serve_in_process(make_app()) as c:
        sid = (await c.post("/api/v1/create_sampling_session", json={
            "session_id": "s", "base_model": MODEL})).json()["sampling_session_id"]
        fut = (await c.post("/api/v1/asample", json={
            "num_samples": 2, "sampling_session_id": sid,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]},
                                  {"type": "encoded_text", "tokens": [3]}]},
            "sampling_params": {"max_tokens": 3, "temperature": 0.0}})).json()
        assert len(fut["sample_sequence_ids"]) == 2 and fut["model_id"] == MODEL
        r = await c.post("/api/v1/retrieve_future", json={"request_id": fut["request_id"]})
        assert r.headers["content-type"] == "application/x-protobuf"
        out = pb.SampleResponse()
        out.ParseFromString(r.content)
        script = fake_engine.script
        for seq in out.sequences:
            assert list(memoryview(seq.tokens).cast("i")) == script[:3]
            assert seq.stop_reason == pb.STOP_REASON_LENGTH
        assert fake_engine.prompts[-1] == [1, 2, 3]  # the chunks joined, in order
        # a repeated ask (the SDK's, after a broken connection) gets the same answer
        again = await c.post("/api/v1/retrieve_future", json={"request_id": fut["request_id"]})
        assert again.content == r.content


async def test_bad_samples_are_refused_by_name(make_app) -> None:  # type: ignore[no-untyped-def]
    async with serve_in_process(make_app(max_n=4)) as c:
        def sample(**fields: object) -> dict[str, object]:
            return {"num_samples": 1, "base_model": MODEL, "sampling_params": {"max_tokens": 2},
                    "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
                    **fields}

        for body, param in [
            (sample(num_samples=5), "num_samples"),
            (sample(record_stability_info=True), "record_stability_info"),
            (sample(target_prompt_logprobs={"data": [1], "dtype": "int64", "shape": [1, 1]}),
             "target_prompt_logprobs"),
            (sample(prompt_logprobs_last_n=1), "prompt_logprobs_last_n"),
            (sample(model_path="tinker://run/sampler_weights/1"), "model_path"),
            (sample(base_model="nope"), "base_model"),
            (sample(sampling_params={"max_tokens": 2, "stop": [-1]}), "sampling_params.stop[0]"),
            (sample(unknown=1), "unknown"),
        ]:
            r = await c.post("/api/v1/asample", json=body)
            assert 400 <= r.status_code < 500 and r.headers["content-length"] != "0", body
            assert r.json()["error"]["param"] == param, (body, r.json())


async def test_without_the_extra_the_routes_say_so(make_app) -> None:  # type: ignore[no-untyped-def]
    app = make_app()
    async with serve_in_process(app) as c:
        app.state.tinker = None  # as on a server without `tokenwire[tinker]`
        r = await c.post("/api/v1/client/config", json={"sdk_version": "0.38.0"})
        assert r.status_code == 400 and "tokenwire[tinker]" in r.json()["error"]["message"]
