"""One build for every x86-64 CPU: each of ggml's CPU variants this CPU can run serves the e2e
smoke (a multi-token prompt, 8 concurrent streams, a 1,300-token prompt) in the engine process,
loaded by name (`TOKENWIRE_CPU_VARIANT`); the AMX variant is in no build and never chosen."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.upstreams import Upstream, tokenwire_upstream
from tokenwire.engines.cpu import AMX_VARIANTS, _score, cpu_model, variants

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
VARIANTS = variants()


def test_the_build_has_variants_for_every_x86_64_cpu_and_none_with_amx() -> None:
    assert {"x64", "haswell", "skylakex", "icelake", "zen4"} <= set(VARIANTS)
    assert not AMX_VARIANTS & set(VARIANTS)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant_server(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Upstream]]:
    name = request.param
    if _score(VARIANTS[name]) <= 0:
        pytest.skip(f"this CPU ({cpu_model()}) lacks instructions the {name} variant needs")
    tmp: Path = tmp_path_factory.mktemp(f"variant-{name}")
    srv = tokenwire_upstream(tmp, env={"TOKENWIRE_CPU_VARIANT": name})
    yield name, srv
    srv.stop()


def chat(url: str, content: str, max_tokens: int, stream: bool = False) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def test_each_variant_serves_the_smoke(variant_server: tuple[str, Upstream]) -> None:
    """(x64, the scalar fallback for CPUs older than AVX2, is ~50x slower: its smoke is a
    multi-token prompt and 8 short streams, without the 1,300-token prompt.)"""
    name, srv = variant_server
    scalar = name == "x64"
    health = httpx.get(f"{srv.url}/health", timeout=10).json()
    assert health["models"][MODEL]["engine_process"]["backend"].endswith(f"variant {name}")
    r = chat(srv.url, "Hello there, how are you?", 16)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        streams = list(pool.map(lambda k: chat(srv.url, f"Write {k} words about rivers.",
                                               4 if scalar else 32, stream=True), range(8)))
    for s in streams:
        assert s.status_code == 200 and s.text.endswith("data: [DONE]\n\n")
        assert '"error"' not in s.text
    if scalar:
        return
    long = " ".join(f"word{k}" for k in range(650))  # ~1,300 tokens
    r = chat(srv.url, long, 8)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] >= 1300, r.text


def test_a_variant_not_in_the_build_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="cpu_variant 'sapphirerapids' is not in this build"):
        tokenwire_upstream(tmp_path, env={"TOKENWIRE_CPU_VARIANT": "sapphirerapids"})
