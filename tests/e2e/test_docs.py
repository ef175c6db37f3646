"""The examples of the reference (docs/api.md and its pages, docs/api/*.md) and of every journey
page (serve.md, fleet.md, rl.md, storage.md), sent to a real server: the docs cannot drift from
the code.

An `http` block is a request (method, path, JSON body); the `json <status>` or `sse <status>`
block after it is the answer. In the expected JSON, "..." matches any value, a "...": "..."
member allows further members, and a trailing "..." in an array allows further elements. A
`python` block runs as written, its `assert`s the test. Each runs once per server, in page
order: an example that changes state (a stored `request_id`, a weight label) stands on one
page only.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TEST_UPSTREAM, LiveServer

pytestmark = pytest.mark.engine

JOURNEYS = ("serve.md", "fleet.md", "rl.md", "storage.md")
"""One page per journey a user takes: serve it and call it, front a vLLM fleet, an RL rollout
with tools, mask and weight sync, store and retrieve as ids."""
ROOT = Path(__file__).parents[2] / "docs"
REFERENCE = [ROOT / "api.md", *sorted((ROOT / "api").glob("*.md"))]
"""The reference: the index and one page per API family and the control plane."""
DOCS = [*REFERENCE, *(ROOT / name for name in JOURNEYS)]
FENCE = re.compile(r"```(\w+)([^\n]*)\n(.*?)```", re.S)
ANY = "..."


def _examples() -> list[tuple[str, str, Any, int, str, str]]:
    out = []
    for doc in DOCS:
        blocks = FENCE.findall(doc.read_text())
        for (lang, _, req), (kind, status, expected) in zip(blocks, blocks[1:], strict=False):
            if lang != "http":
                continue
            head, _, payload = req.partition("\n")
            method, path = head.split()
            out.append((method, path, json.loads(payload) if payload.strip() else None,
                        int(status), kind, expected))
    return out


EXAMPLES = _examples()


def matches(expected: Any, actual: Any, where: str = "$") -> None:
    if expected == ANY:
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict), where
        for extra in ("weight_versions", "logprobs_mode"):
            if extra not in expected:
                # every finished choice names its weights' version, and a response with
                # logprobs their mode: the examples show them where they are the subject
                actual = {k: v for k, v in actual.items() if k != extra}
        if "weight_versions" in expected and TEST_UPSTREAM == "llama-server" \
                and "weight_versions" not in actual:
            expected = {k: v for k, v in expected.items() if k != "weight_versions"}
        open_ended = expected.get(ANY) == ANY
        keys = set(expected) - {ANY}
        if not open_ended:
            assert set(actual) == keys, f"{where}: keys {sorted(actual)} != {sorted(keys)}"
        for k in keys:
            assert k in actual, f"{where}.{k} missing"
            matches(expected[k], actual[k], f"{where}.{k}")
    elif isinstance(expected, list):
        assert isinstance(actual, list), where
        if expected and expected[-1] == ANY:
            expected = expected[:-1]
            actual = actual[:len(expected)]
        assert len(actual) == len(expected), f"{where}: {len(actual)} != {len(expected)} items"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            matches(e, a, f"{where}[{i}]")
    elif isinstance(expected, float):
        # llama.cpp's numbers depend on how a prompt reached the KV cache (cut into ubatches,
        # or partly served by the prefix cache): the last digits of a logprob move, by up to
        # ~0.05 here on a short prompt (docs/engines.md, "Exactness"); through real vLLM the
        # weights are bf16 dequantized from the Q4_1 the examples were written with: measured
        # 0.26 apart on a scored prompt. ggml's CPU variants differ too (the engine loads the
        # one for its CPU): a prompt logprob 0.14 apart between haswell (AVX2) and the AVX-512
        # build the examples were written on
        tolerance = 1.0 if TEST_UPSTREAM == "vllm" else 0.25
        assert isinstance(actual, int | float) and math.isclose(expected, actual,
                                                                abs_tol=tolerance), \
            f"{where}: {actual} != {expected}"
    else:
        assert expected == actual, f"{where}: {actual!r} != {expected!r}"


PYTHON = [(doc, code) for doc in DOCS for lang, _, code in FENCE.findall(doc.read_text())
          if lang == "python"]
"""Every page's Python examples, the reference's (if any) and each journey's."""

CONTROL = "client.control("
"""A block that calls the control plane, which llama-server lacks (rl.md, "What holds where")."""


def test_the_docs_have_examples() -> None:
    assert len(REFERENCE) > 1 and len(EXAMPLES) >= 10
    for name in JOURNEYS:  # every journey runs
        assert any(doc.name == name for doc, _ in PYTHON), name


def test_each_example_is_on_one_page() -> None:
    """A stateful example run twice fails the second time (a stored `request_id` is a
    duplicate_id): no example, and no stored request_id, stands in two places."""
    blocks = [code for doc in DOCS for lang, _, code in FENCE.findall(doc.read_text())
              if lang in ("http", "python")]
    assert len(blocks) == len(set(blocks))
    ids = [e[2]["request_id"] for e in EXAMPLES
           if isinstance(e[2], dict) and e[2].get("store") and "request_id" in e[2]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(("doc", "code"), [
    pytest.param(doc, code, marks=[pytest.mark.skipif(
        CONTROL in code and TEST_UPSTREAM == "llama-server",
        reason="llama-server has no control plane (docs/rl.md, what holds where)")])
    for doc, code in PYTHON],
    ids=[f"{doc.stem}-python{i}" for i, (doc, _) in enumerate(PYTHON)])
def test_doc_python_example(live_server: LiveServer, doc: Path, code: str) -> None:
    """Run as written (its `assert`s are the test), the base URL the live server's."""
    code = code.replace("http://127.0.0.1:8000", live_server.url)
    exec(compile(code, str(doc), "exec"), {})


def _scores_prompt(body: Any) -> bool:
    return isinstance(body, dict) and bool(body.get("echo")) and body.get("logprobs") is not None


@pytest.mark.parametrize(("method", "path", "body", "status", "kind", "expected"), [
    pytest.param(*e, marks=[pytest.mark.prompt_logprobs] if _scores_prompt(e[2]) else [])
    for e in EXAMPLES], ids=[f"{i}-{e[0]} {e[1]}" for i, e in enumerate(EXAMPLES)])
def test_doc_example(live_server: LiveServer, method: str, path: str, body: Any, status: int,
                     kind: str, expected: str) -> None:
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        r = http.request(method, path, json=body)
    assert r.status_code == status, r.text
    if kind == "json":
        matches(json.loads(expected), r.json())
        return
    assert kind == "sse"
    got = [line for line in r.text.splitlines() if line.startswith("data: ")]
    want = [line for line in expected.splitlines() if line.startswith("data: ")]
    assert len(got) == len(want), r.text
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w == "data: [DONE]":
            assert g == w
        else:
            matches(json.loads(w[6:]), json.loads(g[6:]), f"chunk[{i}]")
