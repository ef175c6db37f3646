"""The token inspector (GET /inspect) in a real browser against the real model: its token boxes
are checked against the API's own answers (the render, a stored completion and response), the
drift view against two renders, keys against a keyed server, and bad input against the error
the API gives."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser.conftest import screenshot
from tests.conftest import LiveServer, free_port, start_server
from tests.upstreams import Upstream

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"
BOXES = """return [...document.querySelectorAll(arguments[0] + ' .tok')].map(
    e => [Number(e.dataset.tokenId), e.dataset.span, e.dataset.sampled,
          e.dataset.logprob === undefined ? null : Number(e.dataset.logprob)])"""


def wait_view(browser: Any, view: str) -> None:
    def done(d: Any) -> bool:
        error = d.find_element(By.ID, "error")
        assert not error.is_displayed(), error.text  # fail at once, saying what the page says
        return bool(d.find_element(By.ID, "view").get_attribute("data-view") == view)
    WebDriverWait(browser, 60).until(done)


def boxes(browser: Any, scope: str = "#view") -> list[list[Any]]:
    return browser.execute_script(BOXES, scope)  # type: ignore[no-any-return]


def paste(browser: Any, body: object | str, button: str) -> None:
    text = body if isinstance(body, str) else json.dumps(body)
    browser.execute_script("document.getElementById('view').removeAttribute('data-view');"
                           "document.getElementById('body').value = arguments[0]", text)
    browser.find_element(By.ID, button).click()


def visible(piece: dict[str, Any]) -> str:
    """A box's text as docs/inspector.md describes it."""
    if piece["text"] is None:
        return "".join(f"<0x{b:02X}>" for b in piece["bytes"])
    marks = {" ": "\u00b7", "\n": "\u21b5", "\t": "\u2192", "\r": "\u240d"}
    return piece["text"] if piece["control"] else "".join(marks.get(c, c) for c in piece["text"])


def first_difference(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def drawn_pair(browser: Any, pair: str, left: dict[str, Any],
               right: dict[str, Any]) -> tuple[list[list[Any]], list[list[Any]], int]:
    """A side-by-side pair as the page drew it, against the two renders it shows: its summary
    names their first difference, and each column holds its render's ids. Returns the columns'
    boxes and that difference."""
    first = first_difference(left["token_ids"], right["token_ids"])
    scope = f"[data-pair='{pair}']"
    summary = browser.find_element(By.CSS_SELECTOR, f"{scope} .summary")
    assert summary.get_attribute("data-first-diff") == str(first)
    left_boxes = boxes(browser, f"{scope} [data-side='ids']")
    right_boxes = boxes(browser, f"{scope} [data-side='text']")
    assert [b[0] for b in left_boxes] == left["token_ids"]
    assert [b[0] for b in right_boxes] == right["token_ids"]
    return left_boxes, right_boxes, first


def expected_spans(render: dict[str, Any]) -> list[str]:
    roles = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
    kinds = ["template"] * len(render["token_ids"])
    for s in render["spans"]:
        kinds[s["start"]:s["end"]] = [roles[s["role"]]] * (s["end"] - s["start"])
    return kinds


@pytest.fixture(scope="module")
def conversation(live_server: LiveServer) -> dict[str, Any]:
    """A real conversation: the model's own answer sent back as the ids it sampled, then a tool
    turn."""
    first = [{"role": "system", "content": "You are terse."},
             {"role": "user", "content": "Name a colour."}]
    r = httpx.post(f"{live_server.url}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": first, "max_tokens": 12, "seed": 1,
        "response_format_tokens": True}).json()
    said = r["choices"][0]["message"]
    return {"model": MODEL, "tokenizer_version": r["tokenizer_version"], "messages": [
        *first, {"role": "assistant", "content": said["content"], "token_ids": said["token_ids"]},
        {"role": "user", "content": "And a number?\tJust one."}]}


def test_the_render_view_shows_the_renders_tokens(browser: Any, live_server: LiveServer,
                                                  conversation: dict[str, Any],
                                                  tmp_path: Path) -> None:
    browser.get(f"{live_server.url}/inspect")
    assert not browser.find_element(By.ID, "key-form").is_displayed()  # no keys: no prompt
    paste(browser, conversation, "render")
    wait_view(browser, "render")
    want = httpx.post(f"{live_server.url}/v1/chat/completions/render", json=conversation).json()
    got = boxes(browser)
    assert [b[0] for b in got] == want["token_ids"]
    assert [b[1] for b in got] == expected_spans(want)
    assert [int(b[2]) for b in got] == want["sampled_mask"]
    assert sum(want["sampled_mask"]) >= len(conversation["messages"][2]["token_ids"]) > 0
    assert {"system", "user", "assistant", "template"} <= {b[1] for b in got}
    # each box shows its id's own bytes, whitespace made visible, control tokens by their text
    pieces = httpx.post(f"{live_server.url}/v1/detokenize", json={
        "tokenizer_version": want["tokenizer_version"], "tokens": want["token_ids"],
        "return_pieces": True}).json()["pieces"]
    shown = browser.execute_script(
        "return [...document.querySelectorAll('#view .tok')].map(e => e.textContent)")
    raw = b"".join(p["text"].encode() if p["text"] is not None else bytes(p["bytes"])
                   for p in pieces)
    assert raw.decode(errors="replace") == httpx.post(
        f"{live_server.url}/v1/detokenize", json={"tokenizer_version": want["tokenizer_version"],
                                                  "tokens": want["token_ids"]}).json()["prompt"]
    assert shown == [visible(p) for p in pieces]
    assert "<|im_start|>" in shown and "\u2192" in "".join(shown)
    title = browser.find_element(By.CSS_SELECTOR, "#view .tok[data-sampled='1']") \
        .get_attribute("title")
    assert title.startswith("id ") and "assistant" in title  # the id on hover
    assert screenshot(browser, "render", tmp_path).stat().st_size > 10_000


def test_the_drift_view_marks_the_first_differing_token(browser: Any, live_server: LiveServer,
                                                        tmp_path: Path) -> None:
    # "Hi there" sent as "H" + "i" + " there": not the canonical encoding of its text
    body = {"model": MODEL, "tokenizer_version": "smollm2-49k", "messages": [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there", "token_ids": [56, 89, 665]},
        {"role": "user", "content": "Bye"}]}
    browser.get(f"{live_server.url}/inspect")
    paste(browser, body, "drift")
    wait_view(browser, "drift")
    ids = httpx.post(f"{live_server.url}/v1/chat/completions/render",
                     json={**body, "check_drift": True}).json()
    text_body = {**body, "messages": [body["messages"][0],
                                      {"role": "assistant", "content": "Hi there"},
                                      body["messages"][2]]}
    text = httpx.post(f"{live_server.url}/v1/chat/completions/render", json=text_body).json()
    _, right, first = drawn_pair(browser, "drift", ids, text)
    assert first == ids["spans"][1]["start"]  # where the assistant's ids begin
    pair = "[data-pair='drift']"
    assert [int(b[2]) for b in right] == text["sampled_mask"] and 1 not in text["sampled_mask"]
    marked = browser.find_elements(By.CSS_SELECTOR, f"{pair} .tok[data-first-diff='1']")
    assert [m.get_attribute("data-token-id") for m in marked] == [
        str(ids["token_ids"][first]), str(text["token_ids"][first])]
    warning = browser.find_element(By.CSS_SELECTOR, "#view .warning").text
    assert "token_drift" in warning and "messages[1].token_ids" in warning
    assert "sent id 56, canonical id " in warning
    assert screenshot(browser, "drift", tmp_path).stat().st_size > 10_000


def test_a_stored_completion_by_id(browser: Any, live_server: LiveServer,
                                   tmp_path: Path) -> None:
    r = httpx.post(f"{live_server.url}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "store": True, "logprobs": True, "return_token_ids": True,
        "response_format_tokens": True, "max_tokens": 16, "seed": 3, "temperature": 0.8,
        "messages": [{"role": "user", "content": "Write one short sentence about rain."}]})
    done = r.json()
    browser.get(f"{live_server.url}/inspect?completion={done['id']}")
    wait_view(browser, "stored")
    prompt = boxes(browser, "#view .tokens:not([data-choice])")
    assert [b[0] for b in prompt] == done["prompt_token_ids"]
    assert "user" in {b[1] for b in prompt} and {b[2] for b in prompt} == {"0"}
    sampled = boxes(browser, "#view .tokens[data-choice='0']")
    choice = done["choices"][0]
    assert [b[0] for b in sampled] == choice["message"]["token_ids"] == choice["token_ids"]
    assert {b[2] for b in sampled} == {"1"}
    assert [b[3] for b in sampled] == pytest.approx(
        [e["logprob"] for e in choice["logprobs"]["content"]])
    # the weights that sampled each id, as the choice's spans say (the embedded engine's)
    weights = browser.execute_script(
        "return [...document.querySelectorAll('#view .tokens[data-choice] .tok')]"
        ".map(e => e.dataset.weightVersion)")
    spans = choice["weight_versions"]
    assert spans and weights == [next(w["version"] for w in spans if w["start"] <= i < w["end"])
                                 for i in range(len(weights))]
    assert screenshot(browser, "stored-completion", tmp_path).stat().st_size > 10_000


def test_a_stored_response_by_id(browser: Any, live_server: LiveServer, tmp_path: Path) -> None:
    r = httpx.post(f"{live_server.url}/v1/responses", timeout=120, json={
        "model": MODEL, "instructions": "Be brief.", "input": "What is a cat?",
        "max_output_tokens": 12, "include": ["message.output_text.logprobs"]}).json()
    kept = httpx.get(f"{live_server.url}/v1/responses/{r['id']}",
                     params={"include[]": "input.token_ids"}).json()
    browser.get(f"{live_server.url}/inspect?response={r['id']}")
    wait_view(browser, "stored")
    prompt = boxes(browser, "#view .tokens:not([data-choice])")
    assert [b[0] for b in prompt] == kept["input_token_ids"]
    assert {"system", "user"} <= {b[1] for b in prompt}  # rendered again: the same ids
    sampled = boxes(browser, "#view .tokens[data-choice='0']")
    text = [p for item in r["output"] if item["type"] == "message" for p in item["content"]]
    assert len(sampled) == len(text[0]["logprobs"]) and None not in [b[3] for b in sampled]
    assert screenshot(browser, "stored-response", tmp_path).stat().st_size > 10_000


def test_bad_input_shows_the_apis_error(browser: Any, live_server: LiveServer,
                                        tmp_path: Path) -> None:
    browser.get(f"{live_server.url}/inspect")
    error = browser.find_element(By.ID, "error")
    paste(browser, '{"messages": [', "render")
    WebDriverWait(browser, 30).until(lambda d: error.is_displayed())
    assert "not JSON" in error.text and "HTTP" not in error.text  # nothing was sent
    paste(browser, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "temprature": 0.5}, "render")
    WebDriverWait(browser, 30).until(lambda d: "temprature" in error.text)
    assert "HTTP 400" in error.text
    paste(browser, {"model": MODEL, "tokenizer_version": "smollm2-49k", "messages": [
        {"role": "assistant", "content": "x", "token_ids": [999_999]}]}, "drift")
    WebDriverWait(browser, 30).until(lambda d: "messages[0].token_ids" in error.text)
    browser.get(f"{live_server.url}/inspect?completion=chatcmpl-nope")
    error = browser.find_element(By.ID, "error")
    WebDriverWait(browser, 30).until(lambda d: "HTTP 404" in error.text)
    assert "completion_not_found" in error.text
    assert browser.find_element(By.ID, "body").is_enabled()  # the page is still there
    assert screenshot(browser, "error", tmp_path).stat().st_size > 5_000


def test_with_keys_it_asks_for_one_and_keeps_it_in_the_tab(browser: Any, make_app: Any) -> None:
    """A keyed server (the scripted engine: the page and its render need no model run)."""
    app = make_app(api_keys=["sk-browser"])
    port = free_port()
    server, thread = start_server(app, port)
    try:
        url = f"http://127.0.0.1:{port}"
        browser.get(f"{url}/inspect")  # the page itself needs no key
        form = browser.find_element(By.ID, "key-form")
        WebDriverWait(browser, 30).until(lambda d: form.is_displayed())
        browser.find_element(By.ID, "api-key").send_keys("sk-wrong")
        browser.find_element(By.ID, "key-save").click()
        WebDriverWait(browser, 30).until(lambda d: "refused" in d.find_element(
            By.ID, "key-why").text)
        browser.find_element(By.ID, "api-key").send_keys("sk-browser")
        browser.find_element(By.ID, "key-save").click()
        WebDriverWait(browser, 30).until(lambda d: d.execute_script(
            "return document.getElementById('model').value") != "")
        assert not form.is_displayed()
        paste(browser, {"messages": [{"role": "user", "content": "hi"}]}, "render")
        wait_view(browser, "render")
        want = httpx.post(f"{url}/v1/chat/completions/render", headers={
            "Authorization": "Bearer sk-browser"}, json={
            "model": browser.find_element(By.ID, "model").get_attribute("value"),
            "messages": [{"role": "user", "content": "hi"}]}).json()
        assert [b[0] for b in boxes(browser)] == want["token_ids"]
        stored = browser.execute_script(
            "return [sessionStorage.getItem('tokenwire-api-key'), localStorage.length, "
            "document.cookie]")
        assert stored == ["sk-browser", 0, ""]
    finally:
        browser.execute_script("sessionStorage.clear()")
        server.should_exit = True
        thread.join(timeout=30)


WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def think_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """`tokenwire serve --model smollm2-think`: a model that reasons (tests/e2e/
    test_reasoning_model.py)."""
    path = Path(os.environ.get("TOKENWIRE_THINK_MODEL", "/nonexistent"))
    if not path.is_file():
        if os.environ.get("TOKENWIRE_TEST_REQUIRE_MODELS"):
            pytest.fail(f"{path}: the thinking model is missing (make think-model)")
        pytest.skip("TOKENWIRE_THINK_MODEL names no GGUF (make think-model makes it)")
    tmp = tmp_path_factory.mktemp("think")
    port = free_port()
    up = Upstream("tokenwire-think", [sys.executable, "-m", "tokenwire", "serve", "--model",
                                      "smollm2-think", "--port", str(port)], port,
                  tmp / "serve.log", env={"TOKENWIRE_TOKENIZER_STORE": str(tmp / "store"),
                                          "TOKENWIRE_THINK_MODEL": str(path)}).start()
    try:  # served under its short name (config.py)
        yield up.url, httpx.get(f"{up.url}/v1/models").json()["data"][0]["id"]
    finally:
        up.stop()


@pytest.mark.slow  # a server process of its own, on the thinking model
def test_thinking_kept_and_dropped_side_by_side(browser: Any, think_server: tuple[str, str],
                                                tmp_path: Path) -> None:
    url, model = think_server
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": model, "messages": ask, "tools": [WEATHER], "temperature": 0,
        "max_tokens": 120, "response_format_tokens": True, "return_token_ids": True,
        "store": True}).json()
    choice = r["choices"][0]
    msg = choice["message"]
    assert msg["reasoning_token_ids"] and choice["finish_reason"] == "tool_calls"
    body = {"model": model, "tokenizer_version": r["tokenizer_version"],
            "tools": [WEATHER], "messages": [
        *ask, {"role": "assistant", "content": msg["content"], "reasoning": msg["reasoning"],
               "tool_calls": msg["tool_calls"],
               "token_ids": choice["token_ids"] + [choice["stop_reason"]]},
        {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
         "content": '{"city": "Paris", "temperature_c": 18}'}]}
    browser.get(f"{url}/inspect")
    paste(browser, body, "drift")
    wait_view(browser, "drift")
    kept = httpx.post(f"{url}/v1/chat/completions/render", json=body).json()
    dropped = httpx.post(f"{url}/v1/chat/completions/render",
                         json={**body, "keep_reasoning": False}).json()
    left, right, _ = drawn_pair(browser, "thinking", kept, dropped)
    # the sampled reasoning, between its markers, is its own span where it is kept
    thought = [b[0] for b in left if b[1] == "reasoning"]
    assert thought[1:-1] == msg["reasoning_token_ids"]
    assert not [b for b in right if b[1] == "reasoning"]
    assert screenshot(browser, "thinking", tmp_path).stat().st_size > 10_000
    # the same answer stored: its reasoning is its own span among the sampled ids
    browser.get(f"{url}/inspect?completion={r['id']}")
    wait_view(browser, "stored")
    sampled = boxes(browser, "#view .tokens[data-choice='0']")
    assert [b[0] for b in sampled] == choice["token_ids"]
    assert [b[0] for b in sampled if b[1] == "reasoning"][1:-1] == msg["reasoning_token_ids"]
