"""GET /metrics: real requests through the app, then the exposition parsed as Prometheus does."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine
from tokenwire.api.routes import routes
from tokenwire.metrics import UNMATCHED
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.anyio

REQUESTS = "tokenwire_http_requests_total"


class Scrape:
    """One scrape: `m(name, **labels)` is a sample's value (0 when the series is absent)."""

    def __init__(self, text: str):
        self.samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                        for f in text_string_to_metric_families(text) for s in f.samples}

    def __call__(self, name: str, **labels: str) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def has(self, name: str, **labels: str) -> bool:
        return (name, tuple(sorted(labels.items()))) in self.samples

    def labels(self, name: str) -> list[dict[str, str]]:
        return [dict(labels) for n, labels in self.samples if n == name]


async def scrape(client: httpx.AsyncClient) -> Scrape:
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return Scrape(r.text)


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], **kw}


def sse(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    frames = [f[6:] for f in r.text.split("\n\n") if f.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


WITH_USAGE = {"stream": True, "stream_options": {"include_usage": True}}


async def test_requests_are_counted_by_route_template_and_status(
        client: httpx.AsyncClient) -> None:
    for _ in range(2):
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200
    assert (await client.post("/v1/chat/completions", content=b"{not json")).status_code == 400
    assert (await client.put("/v1/chat/completions")).status_code == 405
    assert (await client.get(f"/v1/models/{MODEL}")).status_code == 200
    assert (await client.get("/v1/models/no-such-model")).status_code == 404
    for path in ("/nope", "/v1/nope/1", "/v1/nope/2?x=1"):
        assert (await client.get(path)).status_code == 404
    m = await scrape(client)
    assert m(REQUESTS, route="/v1/chat/completions", status="200") == 2
    assert m(REQUESTS, route="/v1/chat/completions", status="400") == 1
    assert m(REQUESTS, route="/v1/chat/completions", status="405") == 1
    assert m(REQUESTS, route="/v1/models/{model:path}", status="200") == 1
    assert m(REQUESTS, route="/v1/models/{model:path}", status="404") == 1
    assert m(REQUESTS, route=UNMATCHED, status="404") == 3
    # labels are route templates (or "unmatched"), never the paths clients made up
    templates = {r.path for r in routes} | {UNMATCHED}
    assert {x["route"] for x in m.labels(REQUESTS)} <= templates
    assert sum(m(REQUESTS, **x) for x in m.labels(REQUESTS)) == 9
    # a scrape is counted once it is answered, so the next one shows it
    assert (await scrape(client))(REQUESTS, route="/metrics", status="200") == 1


async def test_token_counters_are_the_sum_of_the_usage_returned(
        client: httpx.AsyncClient, tok: HFTokenizer, fake_engine: FakeEngine) -> None:
    fake_engine.cached_tokens = 3
    ids = tok.encode("Once upon a time")
    usages = [
        (await client.post("/v1/chat/completions", json=chat(n=2))).json()["usage"],
        sse(await client.post("/v1/chat/completions", json=chat(**WITH_USAGE)))[-1]["usage"],
        (await client.post("/v1/completions", json={
            "model": MODEL, "prompt": [ids, ids[:2]], "n": 2, "max_tokens": 5,
            "tokenizer_version": tok.version})).json()["usage"],
        sse(await client.post("/v1/completions", json={
            "model": MODEL, "prompt": "Once upon a time", **WITH_USAGE}))[-1]["usage"],
        (await client.post("/inference/v1/generate", json={
            "token_ids": ids, "sampling_params": {"max_tokens": 4}})).json()["usage"],
        sse(await client.post("/inference/v1/generate", json={
            "token_ids": ids, "sampling_params": {"max_tokens": 64}, **WITH_USAGE}))[-1]["usage"],
    ]
    m = await scrape(client)
    assert m("tokenwire_prompt_tokens_total", model_name=MODEL) == sum(
        u["prompt_tokens"] for u in usages)
    assert m("tokenwire_generation_tokens_total", model_name=MODEL) == sum(
        u["completion_tokens"] for u in usages)
    assert m("tokenwire_prompt_tokens_cached_total", model_name=MODEL) == sum(
        u["prompt_tokens_details"]["cached_tokens"] for u in usages) == 3 * 7


async def test_a_stream_that_does_not_ask_for_usage_is_counted_too(
        client: httpx.AsyncClient, fake_engine: FakeEngine) -> None:
    sse(await client.post("/v1/chat/completions", json=chat(stream=True)))
    m = await scrape(client)
    assert m("tokenwire_prompt_tokens_total", model_name=MODEL) == len(fake_engine.prompts[0])
    assert m("tokenwire_generation_tokens_total", model_name=MODEL) == \
        len(fake_engine.script) + 1  # the end-of-turn token counts, as in usage
    assert not m.has("tokenwire_prompt_tokens_cached_total", model_name=MODEL)


async def test_token_path_and_text_path_requests(client: httpx.AsyncClient,
                                                 tok: HFTokenizer) -> None:
    ids = tok.encode("Hello!")
    v = tok.version
    sent = [
        ("text", "/v1/chat/completions", chat()),
        ("text", "/v1/chat/completions", chat(stream=True)),
        ("tokens", "/v1/chat/completions", chat(tokenizer_version=v, messages=[
            {"role": "user", "content": {"type": "input_tokens", "token_ids": ids}}])),
        ("tokens", "/v1/chat/completions", chat(tokenizer_version=v, messages=[
            {"role": "user", "content": "Hi"}, {"role": "assistant", "token_ids": ids},
            {"role": "user", "content": "Again"}])),
        ("text", "/v1/completions", {"model": MODEL, "prompt": "Hello"}),
        ("tokens", "/v1/completions", {"model": MODEL, "prompt": ids, "tokenizer_version": v}),
        ("tokens", "/inference/v1/generate", {"token_ids": ids, "stream": True,
                                               "sampling_params": {"max_tokens": 4}}),
    ]
    for _, path, body in sent:
        r = await client.post(path, json=body)
        assert r.status_code == 200, (path, r.text)
    # refused before the engine: not served, whichever path it came by
    refused = chat(messages=[{"role": "user", "content": {"type": "input_tokens",
                                                          "token_ids": ids}}])
    assert (await client.post("/v1/chat/completions", json=refused)).status_code == 400
    m = await scrape(client)
    served = "tokenwire_generation_requests_total"
    assert m(served, model_name=MODEL, prompt="text") == 3
    assert m(served, model_name=MODEL, prompt="tokens") == 4


async def test_latency_histograms_time_every_sampled_token(
        client: httpx.AsyncClient) -> None:
    streamed = sse(await client.post("/v1/chat/completions", json=chat(**WITH_USAGE)))
    whole = (await client.post("/v1/chat/completions", json=chat(n=2))).json()
    m = await scrape(client)
    sampled = streamed[-1]["usage"]["completion_tokens"] + whole["usage"]["completion_tokens"]
    ttft = "tokenwire_time_to_first_token_seconds"
    itl = "tokenwire_inter_token_latency_seconds"
    assert m(f"{ttft}_count", model_name=MODEL) == 3  # one per choice
    assert m(f"{itl}_count", model_name=MODEL) == sampled - 3
    assert m(f"{ttft}_sum", model_name=MODEL) > 0
    assert m(f"{itl}_bucket", model_name=MODEL, le="+Inf") == sampled - 3


async def test_queue_gauges_are_read_from_the_engine_at_scrape_time(
        client: httpx.AsyncClient, fake_engine: FakeEngine) -> None:
    m = await scrape(client)
    assert m.has("tokenwire_num_requests_running", model_name=MODEL)
    assert m("tokenwire_num_requests_running", model_name=MODEL) == 0
    fake_engine.active = 2  # as if two sequences were running
    m = await scrape(client)
    assert m("tokenwire_num_requests_running", model_name=MODEL) == 2
    assert m.has("tokenwire_num_requests_waiting", model_name=MODEL)
    assert m("tokenwire_num_requests_waiting", model_name=MODEL) == 0
    # the scripted engine has no decode steps to report: the histogram is there, empty
    assert not m.has("tokenwire_iteration_tokens_total_count", model_name=MODEL)


BAD = [b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"model": 5}', b'{"messages": "x"}',
       json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "max_tokens": 10**30}).encode(),
       json.dumps({"model": MODEL, "prompt": [[1, 2], "x", [-1]]}).encode(),
       json.dumps({"token_ids": [10**12], "sampling_params": {"n": 0}}).encode()]


async def test_bad_input_is_counted_as_4xx_never_500(client: httpx.AsyncClient) -> None:
    paths = ["/v1/chat/completions", "/v1/completions", "/inference/v1/generate"]
    for path in paths:
        for raw in BAD:
            r = await client.post(path, content=raw,
                                  headers={"content-type": "application/json"})
            assert 400 <= r.status_code < 500, (path, raw, r.status_code)
    for path, method in (("/metrics", "POST"), ("/metrics?x=%ff", "GET"),
                         ("/metrics/../metrics", "GET"), ("/%00", "GET")):
        r = await client.request(method, path, headers={"accept": "\x7f;;q=x"})
        assert r.status_code < 500, (method, path, r.status_code)
    m = await scrape(client)
    statuses = {x["status"] for x in m.labels(REQUESTS)}
    assert statuses and all(s.startswith("4") or s == "200" for s in statuses), statuses
    assert sum(m(REQUESTS, route=p, status=s) for p in paths
               for s in statuses) == len(paths) * len(BAD)
    assert m(REQUESTS, route="/metrics", status="405") == 1


async def test_metrics_need_a_key_like_every_route_but_health(make_app) -> None:  # type: ignore[no-untyped-def]
    async with serve_in_process(make_app(api_keys=["sk-test"])) as c:
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.post("/v1/chat/completions", json=chat())).status_code == 401
        c.headers["authorization"] = "Bearer sk-test"
        m = await scrape(c)
    # refused before routing, still counted under the route they asked for
    assert m(REQUESTS, route="/metrics", status="401") == 1
    assert m(REQUESTS, route="/v1/chat/completions", status="401") == 1


async def test_each_app_has_its_own_registry(make_app) -> None:  # type: ignore[no-untyped-def]
    first, second = make_app(), make_app()
    async with serve_in_process(first) as a, serve_in_process(second) as b:
        assert (await a.post("/v1/chat/completions", json=chat())).status_code == 200
        ma, mb = await scrape(a), await scrape(b)
    assert ma(REQUESTS, route="/v1/chat/completions", status="200") == 1
    assert mb(REQUESTS, route="/v1/chat/completions", status="200") == 0
    assert mb("tokenwire_prompt_tokens_total", model_name=MODEL) == 0


@pytest.mark.engine
async def test_a_stream_on_the_real_engine_is_timed_and_its_steps_observed(
        engine, make_app) -> None:  # type: ignore[no-untyped-def]
    app = make_app(engine)
    try:  # no lifespan: the engine is shared by the session
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            before = await scrape(c)
            usage = sse(await c.post("/v1/chat/completions", json=chat(
                messages=[{"role": "user", "content": "Count from one to ten."}],
                max_tokens=12, temperature=0, **WITH_USAGE)))[-1]["usage"]
            after = await scrape(c)
    finally:
        engine.on_step = None  # the next app to share the engine sets its own

    def delta(name: str) -> float:
        return after(name, model_name=MODEL) - before(name, model_name=MODEL)

    sampled = usage["completion_tokens"]
    assert sampled >= 2
    assert delta("tokenwire_time_to_first_token_seconds_count") == 1
    assert delta("tokenwire_inter_token_latency_seconds_count") == sampled - 1
    # a prefill (one step or more), then one decode step per token after the first
    steps = delta("tokenwire_iteration_tokens_total_count")
    assert steps >= sampled
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    assert delta("tokenwire_iteration_tokens_total_sum") >= \
        usage["prompt_tokens"] - cached + sampled - 1
    assert after.has("tokenwire_num_requests_running", model_name=MODEL)
    assert after("tokenwire_num_requests_waiting", model_name=MODEL) == 0
    assert delta("tokenwire_generation_tokens_total") == sampled


async def test_the_loop_lag_is_observed_and_the_heap_trimmed_once_idle(
        client: httpx.AsyncClient) -> None:
    """api/loop.py: a timer every 100 ms, its lateness in the histogram; the heap given
    back after requests were answered and none is in flight, not while one is; what start
    made is frozen out of the collector's way (_heap.py)."""
    import asyncio
    import gc

    from tokenwire.api import loop
    from tokenwire.metrics import Metrics

    assert gc.get_freeze_count() > 0
    await asyncio.sleep(0.35)  # the app's own probe ran a few times
    s = await scrape(client)
    assert s("tokenwire_event_loop_lag_seconds_count") >= 2
    assert s("tokenwire_event_loop_lag_seconds_bucket", le="+Inf") == \
        s("tokenwire_event_loop_lag_seconds_count")

    trims: list[int] = []
    m = Metrics()
    task = asyncio.create_task(loop.upkeep(m, tick=0.02, idle=0.15,
                                           trim=lambda: trims.append(m.answered)))
    try:
        await asyncio.sleep(0.3)
        assert trims == []  # nothing answered yet: nothing to give back
        m.in_flight, m.answered = 1, 3
        await asyncio.sleep(0.3)
        assert trims == []  # busy
        m.in_flight = 0
        await asyncio.sleep(0.4)
        assert trims == [3]  # once, idle after answering
        await asyncio.sleep(0.3)
        assert trims == [3]  # not again until more are answered
    finally:
        task.cancel()
