"""Tinker's API through the official `tinker` SDK (0.38), against every pass's live server: the
sampled ids, logprobs and stop reasons exactly what `/inference/v1/generate` returns for the
same prompt ids and parameters, prompt logprobs, the async path, and bad input as the SDK's
own exceptions, naming the field."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import tinker
from tinker import types

from tests.conftest import TEST_UPSTREAM, LiveServer

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"
KEY = "tml-tokenwire-tests"  # the SDK sends only keys beginning tml-; this server has none


@pytest.fixture(scope="module")
def service(live_server: LiveServer) -> Iterator[tinker.ServiceClient]:
    sc = tinker.ServiceClient(base_url=live_server.url, api_key=KEY)
    yield sc
    sc.close("success").result()
    gc.collect()  # a connection the SDK left open would be reported here (api/tinker.py)




@pytest.fixture(scope="module")
def sampler(service: tinker.ServiceClient) -> Any:
    return service.create_sampling_client(base_model=MODEL).result()


@pytest.fixture(scope="module")
def prompt(live_server: LiveServer) -> list[int]:
    r = httpx.post(f"{live_server.url}/v1/tokenize", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Count from one to five."}],
        "add_generation_prompt": True})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]  # type: ignore[no-any-return]


def generate(live_server: LiveServer, ids: list[int], **sampling: Any) -> dict[str, Any]:
    r = httpx.post(f"{live_server.url}/inference/v1/generate", timeout=120, json={
        "model": MODEL, "token_ids": ids, "sampling_params": sampling})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_the_sdk_samples_the_ids_generate_samples(live_server: LiveServer,
                                                  service: tinker.ServiceClient, sampler: Any,
                                                  prompt: list[int]) -> None:
    rest = tinker.RestClient(base_url=live_server.url, api_key=KEY)
    try:
        caps = rest.get_server_capabilities().result()
    finally:
        rest.holder.close()
    assert MODEL in [m.model_name for m in caps.supported_models]
    params = types.SamplingParams(max_tokens=12, temperature=0.0)
    got = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                         sampling_params=params, topk_sample_logprobs=2).result()
    want = generate(live_server, prompt, max_tokens=12, temperature=0.0, logprobs=2)
    (seq,), (choice,) = got.sequences, want["choices"]
    assert seq.tokens == choice["token_ids"]  # the stop id last, where one ended it
    assert seq.stop_reason == ("length" if choice["finish_reason"] == "length" else "stop")
    lps = [e["logprob"] for e in choice["logprobs"]["content"]]
    assert seq.logprobs == pytest.approx(lps, rel=1e-6, abs=1e-6)  # float32 on the wire
    tops = [[(t["token_id"], t["logprob"]) for t in e["top_logprobs"]][:2]
            for e in choice["logprobs"]["content"]]
    assert [[t for t, _ in row] for row in seq.topk_logprobs] == [[t for t, _ in r] for r in tops]
    assert seq.sequence_id  # the SDK stamps each with the id asample gave it


def test_samples_stop_where_asked(sampler: Any, prompt: list[int]) -> None:
    """A length limit is "length"; a stop id (Tinker's `stop` as ids) ends the sample with it;
    `num_samples` draws that many."""
    first = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                           sampling_params=types.SamplingParams(max_tokens=4, temperature=0.0),
                           ).result().sequences[0]
    assert first.stop_reason == "length" and len(first.tokens) == 4
    stop = first.tokens[2]
    cut = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                         sampling_params=types.SamplingParams(max_tokens=8, temperature=0.0,
                                                              stop=[stop]),
                         ).result().sequences[0]
    assert cut.stop_reason == "stop" and cut.tokens == first.tokens[:first.tokens.index(stop) + 1]
    many = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=3,
                          sampling_params=types.SamplingParams(max_tokens=6, seed=11),
                          ).result().sequences
    assert len(many) == 3 and all(len(s.tokens) == len(s.logprobs) > 0 for s in many)
    assert len({s.sequence_id for s in many}) == 3


@pytest.mark.prompt_logprobs
def test_prompt_logprobs_are_the_engines(live_server: LiveServer, sampler: Any,
                                         prompt: list[int]) -> None:
    """`compute_logprobs`, top-k prompt logprobs and `prompt_logprobs_last_n` (the positions
    before the last n: None, as the SDK checks), against generate's `prompt_logprobs`."""
    want = generate(live_server, prompt, max_tokens=1, temperature=0.0, prompt_logprobs=2)
    rows = want["prompt_logprobs"]
    mine = [rows[i][str(t)]["logprob"] for i, t in enumerate(prompt) if i > 0]
    got = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    assert got[0] is None and got[1:] == pytest.approx(mine, rel=1e-6, abs=1e-6)
    last = sampler.compute_logprobs(types.ModelInput.from_ints(prompt),
                                    prompt_logprobs_last_n=3).result()
    assert last[:-3] == [None] * (len(prompt) - 3)
    assert last[-3:] == pytest.approx(mine[-3:], rel=1e-6, abs=1e-6)
    topk = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                          sampling_params=types.SamplingParams(max_tokens=1, temperature=0.0),
                          topk_prompt_logprobs=2).result().topk_prompt_logprobs
    assert topk[0] is None
    for pos, row in enumerate(topk[1:], start=1):
        best = sorted(((int(t), v["logprob"]) for t, v in rows[pos].items()),
                      key=lambda e: -e[1])[:2]
        assert [t for t, _ in row] == [t for t, _ in best]


def test_the_async_path(sampler: Any, prompt: list[int]) -> None:
    async def both() -> list[Any]:
        futures = [sampler.sample(
            prompt=types.ModelInput.from_ints(prompt), num_samples=1,
            sampling_params=types.SamplingParams(max_tokens=5, temperature=0.0))
            for _ in range(2)]
        return list(await asyncio.gather(*futures))

    a, b = asyncio.run(both())
    assert a.sequences[0].tokens == b.sequences[0].tokens  # greedy: the same ids twice


def test_bad_input_is_the_sdks_own_error_naming_the_field(service: tinker.ServiceClient,
                                                          sampler: Any,
                                                          prompt: list[int]) -> None:
    with pytest.raises(tinker.NotFoundError, match="base_model"):
        service.create_sampling_client(base_model="no-such-model").result()
    with pytest.raises(tinker.BadRequestError, match=r"prompt\.chunks\[0\]\.tokens\[1\]"):
        sampler.sample(prompt=types.ModelInput.from_ints([prompt[0], 10**7]), num_samples=1,
                       sampling_params=types.SamplingParams(max_tokens=2)).result()
    with pytest.raises(tinker.BadRequestError, match="prompt_alt_tokens_k"):
        sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                       sampling_params=types.SamplingParams(max_tokens=2),
                       prompt_alt_tokens_k=2).result()
    # a prompt beyond the context: the future fails, naming why (never left pending)
    with pytest.raises(tinker.RequestFailedError, match="token"):
        sampler.sample(prompt=types.ModelInput.from_ints(prompt * 2000), num_samples=1,
                       sampling_params=types.SamplingParams(max_tokens=2)).result()


def test_the_wire_around_the_sdk(live_server: LiveServer, prompt: list[int]) -> None:
    """What the SDK does not show: each future's tokenizer and weight versions as headers, a
    future id that is not ours, telemetry accepted."""
    with httpx.Client(base_url=f"{live_server.url}/api/v1", timeout=60,
                      headers={"X-API-Key": KEY}) as http:
        sid = http.post("/create_sampling_session", json={
            "session_id": "s", "base_model": MODEL}).json()["sampling_session_id"]
        fut = http.post("/asample", json={
            "num_samples": 1, "sampling_session_id": sid,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
            "sampling_params": {"max_tokens": 3, "temperature": 0.0}}).json()
        r = http.post("/retrieve_future", json={"request_id": fut["request_id"]})
        assert r.headers["content-type"] == "application/x-protobuf"
        assert r.headers["x-tokenwire-tokenizer-version"].startswith("smollm2-49k@")
        if TEST_UPSTREAM in ("", "tokenwire"):  # engines that stamp weight versions
            assert r.headers["x-tokenwire-weight-versions"].startswith('[[{"version":')
        lost = http.post("/retrieve_future", json={"request_id": "tw-not-ours"})
        assert lost.json() == {"error": "no future 'tw-not-ours' on this server",
                               "category": "user"}
        assert http.post("/telemetry", json={"events": []}).json() == {"status": "accepted"}
        bad = http.post("/asample", json={
            "num_samples": 1, "sampling_session_id": sid,
            "prompt": {"chunks": [{"type": "image", "data": "", "format": "png"}]},
            "sampling_params": {}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt.chunks[0].type"
