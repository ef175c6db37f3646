"""Property-based fuzzing of every endpoint: never a 5xx, always OpenAI's error shape.

In process on the scripted engine (thousands of bodies in seconds); tests/e2e/test_fuzz_engine.py
sends a smaller set of valid-but-extreme requests to the real engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import serve_in_process
from tests.fakes import MODEL

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=25,
)
IDS = st.lists(st.integers(min_value=-5, max_value=60000), max_size=12)
CONTENT = st.one_of(
    st.text(max_size=40), st.fixed_dictionaries({"type": st.just("input_tokens"),
                                                 "token_ids": IDS}),
    st.lists(st.one_of(st.fixed_dictionaries({"type": st.just("text"),
                                              "text": st.text(max_size=20)}),
                       st.fixed_dictionaries({"type": st.just("input_tokens"),
                                              "token_ids": IDS}), JSON), max_size=3),
    JSON,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "x"])},
    optional={"content": CONTENT, "token_ids": IDS, "name": st.text(max_size=5)},
)
OPTIONS = st.fixed_dictionaries({}, optional={
    "tokenizer_version": st.sampled_from(["smollm2-49k", "bad", "x@sha256:0000000000000000"])
    | st.text(max_size=10),
    "temperature": st.floats(min_value=-1, max_value=3) | JSON,
    "top_p": st.floats(min_value=-0.5, max_value=1.5), "seed": st.integers() | JSON,
    "n": st.integers(min_value=-1, max_value=20), "max_tokens": st.integers(-2, 5000) | JSON,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=6) | JSON,
    "stream": st.booleans(), "logprobs": st.booleans() | st.integers(-1, 25),
    "top_logprobs": st.integers(-1, 25), "response_format_tokens": st.sampled_from(
        [True, False, "only", "no", 1]), "return_token_ids": st.booleans() | JSON,
    "echo": st.booleans(), "stream_options": JSON | st.just({"include_usage": True}),
    "tokenizer_fallback": st.sampled_from(["error", "translate", "x"]),
    "presence_penalty": st.floats(-3, 3), "frequency_penalty": st.floats(-3, 3),
    "tools": JSON, "suffix": JSON, "best_of": JSON, "add_generation_prompt": JSON,
    "return_token_strs": JSON, "add_special_tokens": JSON,
})
PART = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]),
                           "text": st.text(max_size=20)}),
    st.fixed_dictionaries({"type": st.just("input_tokens"), "token_ids": IDS}), JSON)
ITEM = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "developer", "tool"])},
        optional={"type": st.just("message"), "token_ids": IDS, "id": st.text(max_size=5),
                  "content": st.text(max_size=30) | st.lists(PART, max_size=3) | JSON}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": st.text(max_size=5),
                           "name": st.text(max_size=8), "arguments": st.text(max_size=20)},
                          optional={"token_ids": IDS}),
    st.fixed_dictionaries({"type": st.just("function_call_output"),
                           "call_id": st.text(max_size=5)},
                          optional={"output": st.text(max_size=20) | st.lists(PART, max_size=2)}),
    JSON)
RESPONSES_OPTIONS = st.fixed_dictionaries({}, optional={
    "instructions": st.text(max_size=20) | JSON,
    "include": st.lists(st.sampled_from(["output.token_ids", "input.token_ids",
                                         "message.output_text.logprobs", "x"]), max_size=3),
    "max_output_tokens": st.integers(-2, 5000) | JSON,
    "tools": st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["function", "web_search"]), "name": st.text(max_size=8)},
        optional={"parameters": JSON}), max_size=2) | JSON,
    "tool_choice": st.sampled_from(["auto", "none", "required", "x"]) | JSON,
    "text": st.fixed_dictionaries({"format": st.sampled_from(
        [{"type": "text"}, {"type": "json_object"}, {"type": "x"}]) | JSON}) | JSON,
    "reasoning": JSON, "previous_response_id": JSON, "store": JSON, "metadata": JSON,
})


def responses_bodies(options: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.builds(lambda i, o, r: {"model": MODEL, "input": i, **o, **r},
                     st.text(max_size=30) | st.lists(ITEM, max_size=4), options,
                     RESPONSES_OPTIONS)


PROMPT = st.one_of(st.text(max_size=30), st.lists(st.text(max_size=10), max_size=3), IDS,
                   st.lists(IDS, max_size=3), JSON)


def bodies() -> st.SearchStrategy[tuple[str, Any]]:
    chat = st.builds(lambda m, o, model: {"model": model, "messages": m, **o},
                     st.lists(MESSAGE, max_size=4), OPTIONS, st.sampled_from([MODEL, "nope"]))
    completions = st.builds(lambda p, o: {"model": MODEL, "prompt": p, **o}, PROMPT, OPTIONS)
    tokenize = st.builds(lambda p, m, o: {"model": MODEL, "prompt": p, "messages": m, **o},
                         PROMPT, st.lists(MESSAGE, max_size=2) | st.none(), OPTIONS)
    detok = st.builds(lambda t, o: {"tokens": t, **o}, IDS | JSON, OPTIONS)
    return st.one_of(
        st.tuples(st.just("/v1/chat/completions"), chat | JSON),
        st.tuples(st.just("/v1/responses"), responses_bodies(OPTIONS) | JSON),
        st.tuples(st.just("/v1/completions"), completions | JSON),
        st.tuples(st.sampled_from(["/v1/tokenize", "/tokenize"]), tokenize | JSON),
        st.tuples(st.sampled_from(["/v1/detokenize", "/detokenize"]), detok | JSON),
    )


GOOD_IDS = st.lists(st.integers(min_value=0, max_value=49151), max_size=12)
GOOD_CONTENT = st.one_of(
    st.text(max_size=40),
    st.fixed_dictionaries({"type": st.just("input_tokens"), "token_ids": GOOD_IDS}),
    st.lists(st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)}),
        st.fixed_dictionaries({"type": st.just("input_tokens"), "token_ids": GOOD_IDS})),
        min_size=1, max_size=3),
)
GOOD_OPTIONS = st.fixed_dictionaries({"tokenizer_version": st.just("smollm2-49k")}, optional={
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "seed": st.integers(0, 2**63),
    "n": st.integers(1, 3), "max_tokens": st.integers(1, 40),
    "stop": st.lists(st.text(min_size=1, max_size=3), max_size=4), "stream": st.booleans(),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
    "return_token_ids": st.booleans(),
})


def valid_bodies() -> st.SearchStrategy[tuple[str, Any]]:
    """Well-formed requests with extreme but legal values: they reach the serving code."""
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]),
                                     "content": GOOD_CONTENT})
    chat = st.builds(
        lambda m, o, fmt, lp: {"model": MODEL, "messages": m, **o, **fmt, **lp},
        st.lists(message, min_size=1, max_size=3), GOOD_OPTIONS,
        st.sampled_from([{}, {"response_format_tokens": True},
                         {"response_format_tokens": "only"}]),
        st.sampled_from([{}, {"logprobs": True}, {"logprobs": True, "top_logprobs": 3}]))
    completions = st.builds(
        lambda p, o, e: {"model": MODEL, "prompt": p, **o, **e},
        st.one_of(st.text(min_size=1, max_size=30), GOOD_IDS.filter(bool),
                  st.lists(GOOD_IDS.filter(bool), min_size=1, max_size=3)),
        GOOD_OPTIONS, st.sampled_from([{}, {"echo": True}, {"echo": True, "logprobs": 2},
                                       {"logprobs": 0}]))
    responses = st.builds(
        lambda i, o, inc: {"model": MODEL, "input": i, **o, **inc},
        st.text(min_size=1, max_size=30) | st.lists(message, min_size=1, max_size=3),
        GOOD_OPTIONS.map(lambda o: {("max_output_tokens" if k == "max_tokens" else k): v
                                    for k, v in o.items()
                                    if k not in ("n", "stop", "presence_penalty",
                                                 "frequency_penalty", "return_token_ids")}),
        st.sampled_from([{}, {"include": ["output.token_ids", "input.token_ids"]},
                         {"include": ["message.output_text.logprobs"], "top_logprobs": 3}]))
    return st.one_of(st.tuples(st.just("/v1/chat/completions"), chat),
                     st.tuples(st.just("/v1/responses"), responses),
                     st.tuples(st.just("/v1/completions"), completions))


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def http(make_app, loop: asyncio.AbstractEventLoop) -> Iterator[httpx.AsyncClient]:  # type: ignore[no-untyped-def]
    cm = serve_in_process(make_app())
    client = loop.run_until_complete(cm.__aenter__())
    yield client
    loop.run_until_complete(cm.__aexit__(None, None, None))


def check(r: httpx.Response) -> None:
    event(f"status {r.status_code}")  # --hypothesis-show-statistics shows the mix reached
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert isinstance(err["message"], str) and err["message"]
        assert isinstance(err["type"], str)
        assert err["param"] is None or isinstance(err["param"], str)
        assert err["code"] is None or isinstance(err["code"], str)
    elif r.text.startswith("event: "):  # the Responses API's typed events
        events = [json.loads(f.split("\ndata: ", 1)[1]) for f in r.text.strip().split("\n\n")]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] in ("response.completed", "response.incomplete",
                                      "response.failed")
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        frames = [f[6:] for f in r.text.split("\n\n") if f.startswith("data: ")]
        assert frames[-1] == "[DONE]"
        for f in frames[:-1]:
            ev = json.loads(f)
            if "error" in ev:
                assert set(ev["error"]) == {"message", "type", "param", "code"}
    else:
        r.json()


FUZZ = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def post_and_check(http: httpx.AsyncClient, loop: asyncio.AbstractEventLoop,
                   case: tuple[str, Any]) -> None:
    path, body = case
    r = loop.run_until_complete(http.post(path, json=body))
    if r.status_code >= 400:
        event(f"{path} {r.json()['error']['code']}")
    check(r)


@FUZZ
@given(case=bodies())
def test_json_bodies(http: httpx.AsyncClient, loop: asyncio.AbstractEventLoop,
                     case: tuple[str, Any]) -> None:
    post_and_check(http, loop, case)


@FUZZ
@given(case=valid_bodies())
def test_valid_but_extreme_bodies(http: httpx.AsyncClient, loop: asyncio.AbstractEventLoop,
                                  case: tuple[str, Any]) -> None:
    post_and_check(http, loop, case)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/responses", "/v1/completions",
                             "/v1/tokenize", "/v1/detokenize"]), raw=st.binary(max_size=300))
def test_raw_bytes(http: httpx.AsyncClient, loop: asyncio.AbstractEventLoop, path: str,
                   raw: bytes) -> None:
    check(loop.run_until_complete(http.post(path, content=raw)))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(segment=st.text(max_size=30), method=st.sampled_from(["GET", "POST", "DELETE", "PUT"]),
       route=st.sampled_from(["/v1/models/{}", "/v1/tokenizers/{}",
                              "/v1/tokenizers/{}/tokenizer.json", "/v1/{}", "/{}"]))
def test_paths_and_methods(http: httpx.AsyncClient, loop: asyncio.AbstractEventLoop,
                           segment: str, method: str, route: str) -> None:
    path = route.format(quote(segment, safe="")) if segment else route.format("x")
    check(loop.run_until_complete(http.request(method, path)))
