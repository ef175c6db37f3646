from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tests.fakes import MODEL, FakeEngine
from tests.upstreams import (
    Upstream,
    free_port,
    hf_model_dir,
    llama_server,
    tokenwire_upstream,
    vllm_server,
)
from tokenwire._heap import freeze_heap, thaw_heap, trim_heap
from tokenwire.api.app import create_app
from tokenwire.config import Settings, default_model_path
from tokenwire.engines.llamacpp import LlamaCppEngine
from tokenwire.packaged import GEMMA3_PACKAGE, gemma3_model_path
from tokenwire.serving.loader import load_template
from tokenwire.serving.models import ModelRegistry, ServedModel
from tokenwire.tokenizers.gguf import tokenizer_from_gguf
from tokenwire.tokenizers.hf import HFTokenizer
from tokenwire.tokenizers.registry import TokenizerRegistry
from tokenwire.tokenizers.source import TokenizerSource

TEST_MAX_MODEL_LEN = 4096
BLOCKED_PHRASE = "forbidden recipe"
"""Blocked by the live server's content policy."""


def pytest_report_header(config: pytest.Config) -> str:
    """The CPU and the kernels it runs (a crash in them is this machine's, not the code's)."""
    from tokenwire.engines.cpu import load_cpu_backend

    backend = load_cpu_backend(os.environ.get("TOKENWIRE_CPU_VARIANT") or None)
    return f"cpu: {backend.describe()}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def gguf_info(model_path: Path) -> TokenizerSource:
    return tokenizer_from_gguf(model_path)


@pytest.fixture(scope="session")
def tok(gguf_info: TokenizerSource) -> HFTokenizer:
    return gguf_info.tokenizer


@pytest.fixture(scope="session")
def engine(model_path: Path) -> Iterator[LlamaCppEngine]:
    """The real llama.cpp engine on the real model, shared by the engine tests."""
    eng = LlamaCppEngine(model_path, model_id="SmolLM2-135M-Instruct",
                         max_model_len=TEST_MAX_MODEL_LEN, n_parallel=4)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma 3 270M, the second family (SentencePiece): `make install` installs it, and
    `make test` fails without it; a run outside make skips its tests, saying why."""
    try:
        return gemma3_model_path()
    except FileNotFoundError as exc:
        if os.environ.get("TOKENWIRE_TEST_REQUIRE_MODELS"):
            pytest.fail(f"{exc} (TOKENWIRE_TEST_REQUIRE_MODELS is set)")
        pytest.skip(f"{GEMMA3_PACKAGE} is not installed ({exc})")


@pytest.fixture(scope="session")
def gemma_info(gemma_path: Path) -> TokenizerSource:
    return tokenizer_from_gguf(gemma_path)


@pytest.fixture(scope="session")
def gemma_tok(gemma_info: TokenizerSource) -> HFTokenizer:
    return gemma_info.tokenizer


@pytest.fixture(scope="session")
def gemma_engine(gemma_path: Path) -> Iterator[LlamaCppEngine]:
    """The real llama.cpp engine on Gemma 3 270M."""
    eng = LlamaCppEngine(gemma_path, model_id="gemma-3-270m", max_model_len=TEST_MAX_MODEL_LEN,
                         n_parallel=2)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="session")
def llama_cpp_models() -> Path:
    """llama.cpp's vocabulary test files and chat templates (scripts/llama-cpp-models.sh, which
    `make test` runs); a run outside make without them skips their tests, saying why."""
    path = Path(os.environ.get("TOKENWIRE_LLAMA_CPP_MODELS", "/nonexistent"))
    if not (path / "templates").is_dir():
        if os.environ.get("TOKENWIRE_TEST_REQUIRE_MODELS"):
            pytest.fail(f"{path}: llama.cpp's vocabulary files are missing "
                        "(TOKENWIRE_TEST_REQUIRE_MODELS is set)")
        pytest.skip("TOKENWIRE_LLAMA_CPP_MODELS names no folder of llama.cpp's vocabulary files "
                    "(make test fetches them)")
    return path


_free_port = free_port  # the name the tests import


@dataclass
class LiveServer:
    url: str
    settings: Settings
    app: object
    upstream: Upstream | None = None
    """The process behind a gateway (TOKENWIRE_TEST_UPSTREAM), None on the embedded engine."""

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


TEST_UPSTREAM = os.environ.get("TOKENWIRE_TEST_UPSTREAM", "")
"""Where the e2e suite's live server gets its ids: "" (the embedded engine), "tokenwire" (a
gateway in front of a second tokenwire process, over vLLM's /inference/v1/generate),
"llama-server" (a gateway in front of llama.cpp's server) or "vllm" (a gateway in front of real
vLLM, with the model's Hugging Face directory as its tokenizer). `make test` runs all four."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TEST_UPSTREAM != "llama-server":
        return
    skip = pytest.mark.skip(reason="llama-server cannot score prompt tokens (no prompt "
                            "logprobs); the gateway refuses that by name, tested in "
                            "tests/e2e/test_gateway.py")
    for item in items:
        if "prompt_logprobs" in item.keywords:
            item.add_marker(skip)


def start_server(app: object, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    """A real uvicorn server in a thread; returns once it serves."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,  # type: ignore[arg-type]
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 180
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    return server, thread


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A real uvicorn server with the real model, in a thread: on the embedded engine, or a
    gateway in front of a real upstream process (TEST_UPSTREAM)."""
    # the defaults a user gets from `make serve`, bar the port, the store, and a policy
    policy = tmp_path_factory.mktemp("policy") / "policy.json"
    policy.write_text(json.dumps({"blocked_phrases": [BLOCKED_PHRASE]}))
    upstream: Upstream | None = None
    gateway: dict[str, object] = {}
    procs = tmp_path_factory.mktemp("upstreams")
    if TEST_UPSTREAM == "tokenwire":
        upstream = tokenwire_upstream(procs)
        gateway = {"engine": "vllm"}
    elif TEST_UPSTREAM == "llama-server":
        upstream = llama_server(procs)
        gateway = {"engine": "llama-server"}
    elif TEST_UPSTREAM == "vllm":  # as a user runs it: the directory vLLM serves, pinned
        upstream = vllm_server(procs)
        gateway = {"engine": "vllm", "tokenizer": hf_model_dir()}
    elif TEST_UPSTREAM:
        raise ValueError(f"TOKENWIRE_TEST_UPSTREAM={TEST_UPSTREAM!r}: tokenwire, llama-server "
                         "or vllm")
    if upstream is not None:
        gateway = {"upstream": [upstream.url], "tokenizer": default_model_path(), **gateway}
    # (a generated request naming a weight version no replica serves waits this long: the
    # schema test sends many)
    settings = Settings(port=_free_port(), tokenizer_store=tmp_path_factory.mktemp("tokenizers"),
                        content_policy=policy, weight_version_wait=0.5,
                        **gateway)  # type: ignore[arg-type]
    app = create_app(settings)
    server, thread = start_server(app, settings.port)
    yield LiveServer(url=f"http://127.0.0.1:{settings.port}", settings=settings, app=app,
                     upstream=upstream)
    server.should_exit = True
    thread.join(timeout=60)
    if upstream is not None:
        upstream.stop()


@contextlib.contextmanager
def plain_live_server(tmp: Path) -> Iterator[LiveServer]:
    """`tokenwire serve` as `make serve` starts it (the embedded model, no content policy,
    keyless), in a thread, with a store of its own in `tmp`: for tests that change what the
    shared `live_server` must keep (its weights, its records)."""
    settings = Settings(port=_free_port(), tokenizer_store=tmp / "tokenizers")
    app = create_app(settings)
    server, thread = start_server(app, settings.port)
    try:
        yield LiveServer(url=f"http://127.0.0.1:{settings.port}", settings=settings, app=app)
    finally:
        server.should_exit = True
        thread.join(timeout=60)


# -- the in-process app on a scripted engine (fast HTTP-layer tests) ---------------------


@pytest.fixture
def fake_engine(gguf_info: TokenizerSource) -> FakeEngine:
    tok = gguf_info.tokenizer
    # "Bonjour à tous 🎉" then end-of-turn: multi-byte characters split across ids
    return FakeEngine(vocab_size=tok.vocab_size, eog_id=gguf_info.eos_id or 2,
                      script=tok.encode("Bonjour à tous 🎉 ça va?"))


@pytest.fixture
def registry(tmp_path: Path) -> TokenizerRegistry:
    return TokenizerRegistry(tmp_path / "store")


@pytest.fixture
def make_app(gguf_info: TokenizerSource, fake_engine: FakeEngine, registry: TokenizerRegistry,
             tmp_path: Path):  # type: ignore[no-untyped-def]
    """An app serving the scripted engine (or `engine`) as MODEL, with the real tokenizer and
    template; keyword arguments are Settings."""

    def make(engine: object = None, **overrides: object):  # type: ignore[no-untyped-def]
        tok = gguf_info.tokenizer
        entry = registry.register(tok, aliases=[tok.family],
                                  chat_template=gguf_info.chat_template,
                                  bos_id=gguf_info.bos_id, eos_id=gguf_info.eos_id,
                                  add_bos=gguf_info.add_bos)
        settings = Settings(tokenizer_store=tmp_path / "store", **overrides)  # type: ignore[arg-type]
        models = ModelRegistry()
        models.add(ServedModel(id=MODEL, engine=engine or fake_engine, tokenizer_entry=entry,
                               template=load_template(settings, gguf_info)))
        return create_app(settings, models=models, tokenizers=registry)

    return make


@pytest.fixture
def app(make_app):  # type: ignore[no-untyped-def]
    return make_app()


@contextlib.asynccontextmanager
async def loop_gaps(every: float = 0.005) -> AsyncIterator[list[float]]:
    """The gaps between the event loop's turns while the block runs: a task asks to wake every
    `every` seconds and records how long each wait really took (a blocked loop shows as one long
    gap, recorded once the loop is free again, before the block's end is left).

    The heap is frozen meanwhile, as a served app freezes it after start: this process holds a
    whole suite's objects instead, and one full collection of them (0.58 s in CI, set off by
    any thread's allocation) would show as a gap that is not the block's doing."""
    trim_heap()
    freeze_heap()
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(every)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(tick())
    await asyncio.sleep(0)  # the ticker starts its clock before the block runs
    try:
        yield gaps
        await asyncio.sleep(every * 4)  # the ticker records the gap it is in
    finally:
        task.cancel()
        thaw_heap()


@contextlib.asynccontextmanager
async def serve_in_process(app) -> AsyncIterator[httpx.AsyncClient]:  # type: ignore[no-untyped-def]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            yield c


async def stream_frames(client: httpx.AsyncClient, path: str, payload: dict[str, Any],
                        ) -> list[dict[str, Any]]:
    """A streamed request's `data:` events, parsed (the stream must end with `[DONE]`)."""
    r = await client.post(path, json={**payload, "stream": True})
    assert r.status_code == 200, r.text
    frames = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


@pytest.fixture
async def client(app) -> AsyncIterator[httpx.AsyncClient]:  # type: ignore[no-untyped-def]
    async with serve_in_process(app) as c:
        yield c
