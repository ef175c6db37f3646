"""The embedded engine in a process of its own: what a client sees when it dies, and what the
server keeps. Each test drives a real `tokenwire serve` (the CLI, uvicorn, the engine process,
the real model) and kills the engine process with a real signal."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.upstreams import Upstream, free_port, tokenwire_upstream

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
STORY = [{"role": "user", "content": "Tell me a long story about a dragon and a knight."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    tmp = tmp_path_factory.mktemp("engine-process")
    srv = tokenwire_upstream(tmp, env={"TOKENWIRE_STORAGE": str(tmp / "store.sqlite3")})
    yield srv
    srv.stop()


def engine_process(url: str) -> dict[str, Any]:
    body = httpx.get(f"{url}/health", timeout=10).json()
    (model,) = body["models"].values()
    return dict(model["engine_process"])


def kill_engine(url: str, sig: signal.Signals = signal.SIGKILL) -> tuple[int, list[str]]:
    """Signal the engine process; then watch /health until it serves again. Returns the old
    pid and the states /health went through."""
    before = engine_process(url)
    assert before["state"] == "up", before
    os.kill(before["pid"], sig)
    states: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = httpx.get(f"{url}/health", timeout=10)
        state = r.json()["models"][MODEL]["engine_process"]
        if not states or states[-1] != state["state"]:
            states.append(state["state"])
        if r.status_code == 200 and state["state"] == "up" and state["pid"] != before["pid"]:
            assert state["restarts"] == before["restarts"] + 1
            return before["pid"], states
        time.sleep(0.02)
    raise AssertionError(f"the engine did not come back: {states}")


def stream_events(url: str, path: str, body: dict[str, Any], kill_after: int,
                  headers: dict[str, str] | None = None) -> list[str]:
    """The stream's SSE lines, the engine process SIGKILLed after `kill_after` data lines."""
    lines: list[str] = []
    n_data = 0
    pid = engine_process(url)["pid"]
    with httpx.stream("POST", f"{url}{path}", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line:
                continue
            lines.append(line)
            if line.startswith("data:"):
                n_data += 1
                if n_data == kill_after:
                    os.kill(pid, signal.SIGKILL)
    return lines


def wait_served(url: str) -> None:
    deadline = time.monotonic() + 60
    while httpx.get(f"{url}/health", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "the engine did not come back"
        time.sleep(0.05)


LONG = {"max_tokens": 400, "temperature": 0, "ignore_eos": True}


def test_a_killed_engine_ends_a_chat_stream_in_band_then_serves_again(server: Upstream) -> None:
    lines = stream_events(server.url, "/v1/chat/completions",
                          {"model": MODEL, "messages": STORY, "stream": True, **LONG}, 3)
    data = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert "error" not in data[0]
    err = data[-1]["error"]
    assert err["code"] == "engine_crashed" and "SIGKILL" in err["message"], err
    assert lines[-1] == "data: [DONE]"
    wait_served(server.url)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    r = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=8)
    assert r.choices[0].message.content


def test_the_openai_client_raises_the_crash_by_name(server: Upstream) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    stream = client.completions.create(model=MODEL, prompt="Once upon a time", stream=True,
                                       max_tokens=400, temperature=0,
                                       extra_body={"ignore_eos": True})
    pid = engine_process(server.url)["pid"]
    with pytest.raises(openai.APIError, match="engine process died"):
        for k, _ in enumerate(stream):
            if k == 2:
                os.kill(pid, signal.SIGKILL)
    wait_served(server.url)


def test_a_killed_engine_fails_a_responses_stream_with_its_lifecycle(server: Upstream) -> None:
    lines = stream_events(server.url, "/v1/responses",
                          {"model": MODEL, "input": STORY[0]["content"], "stream": True,
                           "max_output_tokens": 400, "temperature": 0}, 4)
    events = [x.removeprefix("event: ") for x in lines if x.startswith("event: ")]
    assert events[0] == "response.created" and events[-1] == "response.failed", events
    failed = json.loads([x for x in lines if x.startswith("data: ")][-1][6:])
    assert failed["response"]["error"]["code"] == "engine_crashed"
    wait_served(server.url)


def test_a_killed_engine_ends_a_messages_stream_with_anthropics_error(server: Upstream) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    pid = engine_process(server.url)["pid"]
    with pytest.raises(anthropic.APIStatusError) as caught:  # noqa: PT012
        with client.messages.stream(model=MODEL, max_tokens=400, messages=STORY) as stream:
            for k, _ in enumerate(stream):
                if k == 3:
                    os.kill(pid, signal.SIGKILL)
    assert "engine process died" in str(caught.value)
    wait_served(server.url)


def test_a_whole_request_in_flight_gets_a_503_with_retry_after(server: Upstream) -> None:
    pid = engine_process(server.url)["pid"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        whole = pool.submit(httpx.post, f"{server.url}/v1/chat/completions", timeout=60,
                            json={"model": MODEL, "messages": STORY, **LONG})
        time.sleep(1.0)
        assert not whole.done()
        os.kill(pid, signal.SIGKILL)
        r = whole.result()
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert r.json()["error"]["code"] == "engine_crashed"
    # while it restarts: 503 with Retry-After, the rest of the server answers
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": STORY, "max_tokens": 4})
    assert r.status_code in (200, 503)
    if r.status_code == 503:
        assert r.headers["retry-after"] == "1" and "restarting" in r.json()["error"]["message"]
    assert httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 200
    wait_served(server.url)


def test_a_segfault_while_idle_is_a_restart_counted_in_health_and_metrics(
        server: Upstream) -> None:
    before = engine_process(server.url)
    t0 = time.monotonic()
    _, states = kill_engine(server.url, signal.SIGSEGV)
    recovery = time.monotonic() - t0
    print(f"recovered from SIGSEGV in {recovery:.2f} s; /health went {states}")
    after = engine_process(server.url)
    assert "restarting" in states and after["last_exit"] == "SIGSEGV"
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    line = next(x for x in metrics.splitlines() if x.startswith("tokenwire_engine_restarts{"))
    assert float(line.split()[-1]) == before["restarts"] + 1
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": STORY, "max_tokens": 4})
    assert r.status_code == 200


def test_every_acknowledged_record_survives_a_kill_during_a_store_burst(
        server: Upstream) -> None:
    pid = engine_process(server.url)["pid"]

    def one(k: int) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": MODEL, "store": True, "max_tokens": 24 + k, "temperature": 0,
            "messages": [{"role": "user", "content": f"Count to {k}."}]})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, k) for k in range(24)]
        # the kill comes once the first record is acknowledged, whatever the machine's pace
        concurrent.futures.wait(futures, timeout=120,
                                return_when=concurrent.futures.FIRST_COMPLETED)
        os.kill(pid, signal.SIGKILL)
        answers = [f.result() for f in futures]
    kept = [r.json()["id"] for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code != 200]
    assert kept and refused, [r.status_code for r in answers]
    assert all(r.status_code == 503 for r in refused)
    wait_served(server.url)
    for cid in kept:
        assert httpx.get(f"{server.url}/v1/chat/completions/{cid}", timeout=10).status_code == 200


def test_the_control_planes_state_is_restored_after_a_crash(server: Upstream) -> None:
    url = server.url
    r = httpx.post(f"{url}/update_weight_version", json={"new_version": "step-7"}, timeout=30)
    assert r.status_code == 200, r.text
    assert httpx.post(f"{url}/pause", params={"mode": "keep"}, timeout=30).status_code == 200
    kill_engine(url)
    assert httpx.get(f"{url}/weight_info", timeout=30).json()["weight_version"] == "step-7"
    assert httpx.get(f"{url}/is_paused", timeout=30).json()["is_paused"] is True
    assert httpx.post(f"{url}/resume", timeout=30).status_code == 200
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": STORY, "max_tokens": 4})
    assert r.status_code == 200
    assert r.json()["choices"][0]["weight_versions"][0]["version"] == "step-7"


def serve_cmd(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tokenwire", "serve", "--port", str(port), *extra]


def test_a_crash_at_the_self_check_is_one_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    env = {**os.environ, "TOKENWIRE_ENGINE_FAULT": "self-check",
           "TOKENWIRE_TOKENIZER_STORE": str(tmp_path / "tok")}
    done = subprocess.run(serve_cmd(free_port()), env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("tokenwire serve: not starting: the engine process died (SIGSEGV) "
                           "while decoding its start-up check batch on "), line
    assert "ggml CPU variant" in line and "AMX" in line, line


def test_a_crash_loop_after_a_restart_stops_the_server_with_one_error(tmp_path: Path) -> None:
    port = free_port()
    srv = Upstream("tokenwire", serve_cmd(port), port, tmp_path / "serve.log",
                   env={"TOKENWIRE_ENGINE_FAULT": "self-check@2",
                        "TOKENWIRE_TOKENIZER_STORE": str(tmp_path / "tok")}).start()
    try:
        os.kill(engine_process(srv.url)["pid"], signal.SIGKILL)
        assert srv.proc is not None
        code = srv.proc.wait(timeout=120)
    finally:
        srv.stop()
    log = srv.log.read_text()
    assert code == 1, log[-2000:]
    assert "tokenwire serve: stopped: the engine failed to start 5 times in a row" in log


def test_workers_share_one_engine_process_and_survive_its_crash(tmp_path: Path) -> None:
    port = free_port()
    srv = Upstream("tokenwire", serve_cmd(port, "--workers", "2"), port, tmp_path / "w.log",
                   env={"TOKENWIRE_TOKENIZER_STORE": str(tmp_path / "tok")}).start()
    try:
        def ask() -> int:
            return httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
                "model": MODEL, "messages": STORY, "max_tokens": 4}).status_code

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert list(pool.map(lambda _: ask(), range(8))) == [200] * 8
        kill_engine(srv.url)
        deadline = time.monotonic() + 30  # each worker reconnects on its own
        while True:
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                codes = list(pool.map(lambda _: ask(), range(8)))
            if codes == [200] * 8 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert codes == [200] * 8
    finally:
        srv.stop()


HOSTILE = [
    b'{"new_version": "\\ud800"}', b'{"weight_version": "\\udfff tail"}', b'{"new_version": ""}',
    b'{"new_version": 7}', b'{"new_version": "' + b"v" * 300 + b'"}', b'{"surprise": 1}',
    b'[1, 2]', b'"text"', b'{"new_version": "ok", "extra": true}', b'{not json',
    b'{"update_info": {"weights_path": "\\ud800"}}', b'{"update_info": "x"}',
    b'{"update_info": {"lora": [{"path": 5}]}}', b'{"update_info": {"lora_path": "/nope"}}',
    b'{"method": "\\ud83d"}', b'{"method": "reload_weights", "kwargs": {"weights_path": 1}}',
    b'{"init_info": null}', b'\x00\xff',
]


def test_hostile_control_bodies_leave_the_server_serving(server: Upstream) -> None:
    """Every control route, every hostile body: a 4xx naming the field (or the call done),
    never a 500, and nothing left set that a later request cannot serve."""
    from tokenwire.protocol.control import CONTROL_OPS

    url = server.url
    for op, (method, path) in CONTROL_OPS.items():
        for body in HOSTILE:
            r = httpx.request(method, f"{url}{path}", content=body, timeout=30,
                              headers={"content-type": "application/json"})
            assert r.status_code < 500, (op, body, r.status_code, r.text)
            if r.status_code >= 400:
                assert r.json()["error"]["message"], (op, body)
    httpx.post(f"{url}/resume", timeout=30)
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": STORY, "max_tokens": 4})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/update_weight_version", content=HOSTILE[0], timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(f"{url}/update_weight_version", content=HOSTILE[8], timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "extra"
