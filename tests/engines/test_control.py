"""The embedded engine's control plane (vLLM's RL endpoints), on the real model: pausing in each
of vLLM's modes, weight versions on every sample, new weights (LoRA adapters, a GGUF) without a
restart, and no KV of old weights reused with new ones."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TEST_MAX_MODEL_LEN
from tests.engines.test_llamacpp import ids, run
from tokenwire.engines.base import ControlCall, FinishEvent, SamplingParams, TokenEvent, WeightSpan
from tokenwire.engines.llamacpp import LlamaCppEngine
from tokenwire.engines.llamacpp.rl_endpoints import content_version
from tokenwire.engines.versions import WeightBound
from tokenwire.errors import (
    InvalidRequestError,
    UnsupportedParameterError,
    WeightVersionUnavailableError,
)
from tokenwire.rl.lora import untie_gguf, write_lora_gguf

pytestmark = [pytest.mark.anyio, pytest.mark.engine]



@pytest.fixture(scope="module")
def prompt(prompt_of) -> list[int]:  # type: ignore[no-untyped-def]
    return prompt_of("Say only yes.")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def story(prompt_of) -> list[int]:  # type: ignore[no-untyped-def]
    return prompt_of("Tell me a story about a lighthouse.")  # type: ignore[no-any-return]


@pytest.fixture
def eng(model_path: Path) -> Iterator[LlamaCppEngine]:
    """An engine of its own: these tests pause it and change its weights."""
    engine = LlamaCppEngine(model_path, model_id="SmolLM2-135M-Instruct",
                            max_model_len=TEST_MAX_MODEL_LEN, n_parallel=2)
    asyncio.run(engine.start())
    yield engine
    asyncio.run(engine.aclose())


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A rank-4 adapter on every attention and MLP projection of SmolLM2 (random, seeded):
    enough to change what greedy decoding picks."""
    rng = np.random.default_rng(0)
    dims = {"self_attn.q_proj": (576, 576), "self_attn.k_proj": (576, 192),
            "self_attn.v_proj": (576, 192), "self_attn.o_proj": (576, 576),
            "mlp.gate_proj": (576, 1536), "mlp.up_proj": (576, 1536),
            "mlp.down_proj": (1536, 576)}
    pairs = {f"model.layers.{i}.{m}": (rng.normal(0, 0.03, (4, n_in)),
                                       rng.normal(0, 0.03, (n_out, 4)))
             for i in range(30) for m, (n_in, n_out) in dims.items()}
    return write_lora_gguf(tmp_path_factory.mktemp("lora") / "adapter.gguf", pairs,
                           alpha=8, n_head=9, n_head_kv=3)


async def call(engine: LlamaCppEngine, op: str, body: object = None,
               **query: str) -> object:
    [answer] = await engine.control(ControlCall(op, tuple(query.items()), body))
    assert answer.ok, answer
    return answer.body


async def test_every_sample_says_which_weights_made_it(eng: LlamaCppEngine, prompt: list[int],
                                                       model_path: Path) -> None:
    version = content_version(model_path)
    assert await call(eng, "weight_info") == {"weight_version": version}
    tokens, finish = await run(eng, prompt, max_tokens=200)
    assert finish.reason == "stop" and finish.stop_token is not None
    # the stop id is a sampled token too: the span covers it, as vLLM's do
    assert finish.weight_versions == (WeightSpan(version, 0, len(tokens) + 1),)
    assert await call(eng, "update_weight_version", {"new_version": "step-1"}) \
        == {"success": True, "new_version": "step-1"}
    assert await call(eng, "weight_info") == {"weight_version": "step-1"}
    _, finish = await run(eng, prompt, max_tokens=5, ignore_eos=True)
    assert finish.weight_versions == (WeightSpan("step-1", 0, 5),)


async def test_a_request_bounded_by_version_waits_for_it(eng: LlamaCppEngine,
                                                         prompt: list[int]) -> None:
    """Alone, the engine serves the newest weights (any max_staleness holds); a
    min_weight_version it has not carried yet waits for its label, up to the bound's wait."""
    version = eng.weight_version
    _, finish = await run(eng, prompt, max_tokens=2,
                          weight_bound=WeightBound(min_version=version, max_staleness=0))
    assert finish.weight_versions is not None and finish.weight_versions[0].version == version
    with pytest.raises(WeightVersionUnavailableError, match="'step-9' was never served"):
        await run(eng, prompt, weight_bound=WeightBound(min_version="step-9", wait=0.3))
    waiting = asyncio.create_task(run(eng, prompt, max_tokens=2, weight_bound=WeightBound(
        min_version="step-9", wait=30)))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await call(eng, "update_weight_version", {"new_version": "step-9"})
    _, finish = await waiting
    assert finish.weight_versions is not None and finish.weight_versions[0].version == "step-9"
    await call(eng, "update_weight_version", {"new_version": "step-10"})
    _, finish = await run(eng, prompt, max_tokens=2, weight_bound=WeightBound(
        min_version=version))  # an older version: the newer weights serve it
    assert finish.weight_versions is not None and finish.weight_versions[0].version == "step-10"


async def collect(stream: object) -> tuple[list[int], FinishEvent]:
    out: list[int] = []
    async for ev in stream:  # type: ignore[attr-defined]
        if isinstance(ev, TokenEvent):
            out.append(ev.token_id)
        elif isinstance(ev, FinishEvent):
            return out, ev
    raise AssertionError("no finish")


async def first_tokens(stream: object, n: int) -> list[int]:
    got: list[int] = []
    while len(got) < n:
        ev = await stream.__anext__()  # type: ignore[attr-defined]
        assert isinstance(ev, TokenEvent), ev
        got.append(ev.token_id)
    return got


async def test_pause_abort_ends_what_runs_and_holds_what_comes(eng: LlamaCppEngine,
                                                               prompt: list[int]) -> None:
    greedy = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
    stream = await eng.submit(prompt, greedy)
    await first_tokens(stream, 3)
    assert await call(eng, "pause", mode="abort") == {"status": "paused"}
    rest, finish = await collect(stream)
    assert finish.reason == "abort"
    assert finish.weight_versions is not None and finish.weight_versions[0].start == 0
    assert await call(eng, "is_paused") == {"is_paused": True}
    # admitted while paused: it waits, and runs after resume
    later = asyncio.ensure_future(run(eng, prompt, max_tokens=4, ignore_eos=True))
    await asyncio.sleep(0.3)
    assert not later.done() and eng.n_waiting == 1
    assert await call(eng, "resume") == {"status": "resumed"}
    tokens, finish = await later
    assert finish.reason == "length" and len(tokens) == 4


async def test_pause_wait_drains_then_holds(eng: LlamaCppEngine, prompt: list[int]) -> None:
    stream = await eng.submit(prompt, SamplingParams(max_tokens=40, temperature=0.0,
                                                     ignore_eos=True))
    await first_tokens(stream, 1)
    pausing = asyncio.ensure_future(call(eng, "pause", mode="wait"))
    rest, finish = await collect(stream)
    assert finish.reason == "length" and len(rest) == 39  # it ran to its end
    assert await pausing == {"status": "paused"}
    later = asyncio.ensure_future(run(eng, prompt, max_tokens=3, ignore_eos=True))
    await asyncio.sleep(0.3)
    assert not later.done()
    await call(eng, "resume")
    assert len((await later)[0]) == 3


async def test_keep_freezes_mid_generation_and_a_new_version_shows_two_spans(
        eng: LlamaCppEngine, prompt: list[int]) -> None:
    reference, _ = await run(eng, prompt, max_tokens=30, ignore_eos=True)
    stream = await eng.submit(prompt, SamplingParams(max_tokens=30, temperature=0.0,
                                                     ignore_eos=True))
    head = await first_tokens(stream, 5)
    await call(eng, "pause", mode="keep")
    await asyncio.sleep(0.2)
    assert eng.n_active == 1  # frozen where it stood, not ended
    await call(eng, "update_weight_version", {"new_version": "v2"})
    await call(eng, "resume")
    rest, finish = await collect(stream)
    assert head + rest == ids(reference)  # the same weights: it went on exactly
    assert finish.weight_versions is not None
    first, second = finish.weight_versions
    assert first.end == second.start and second.end == 30 and second.version == "v2"
    assert 5 <= first.end <= 7  # a decode may have been in flight when the pause came


async def test_a_lora_adapter_is_served_without_a_restart(eng: LlamaCppEngine, story: list[int],
                                                          lora: Path) -> None:
    def lps(tokens: list[TokenEvent]) -> list[float]:
        return [t.logprob or 0.0 for t in tokens]

    base, _ = await run(eng, story, max_tokens=20, ignore_eos=True, logprobs=0)
    before = await call(eng, "weight_info")
    await call(eng, "start_weight_update")
    await call(eng, "update_weights", {"update_info": {"lora_path": str(lora)}})
    await call(eng, "finish_weight_update", {"weight_version": "lora-1"})
    tuned, finish = await run(eng, story, max_tokens=20, ignore_eos=True, logprobs=0)
    # the adapter changes the distribution (measured: the first token's logprob by ~0.1)
    assert abs(lps(tuned)[0] - lps(base)[0]) > 0.01
    assert finish.weight_versions == (WeightSpan("lora-1", 0, 20),)
    # KV computed by the old weights is not reused for the same prompt under new ones
    assert finish.cached_tokens == 0
    again, finish = await run(eng, story, max_tokens=20, ignore_eos=True, logprobs=0)
    assert ids(again) == ids(tuned) and finish.cached_tokens == len(story) - 1
    # no adapter: the bare model again, exactly
    await call(eng, "update_weights", {"update_info": {"lora": []}})
    bare, finish = await run(eng, story, max_tokens=20, ignore_eos=True, logprobs=0)
    assert ids(bare) == ids(base) and lps(bare) == lps(base) and finish.cached_tokens == 0
    assert await call(eng, "weight_info") == before
    # unlabelled: the version names the model and the adapter by their content
    await call(eng, "update_weights", {"update_info": {"lora_path": str(lora),
                                                       "lora_scale": 0.5}})
    version = (await call(eng, "weight_info"))["weight_version"]  # type: ignore[index]
    assert version == f"{before['weight_version']}+lora:{content_version(lora)}@0.5"  # type: ignore[index]


async def test_an_untied_copy_serves_the_same_logits_and_takes_an_unembedding_lora(
        eng: LlamaCppEngine, story: list[int], model_path: Path, tmp_path: Path) -> None:
    """SmolLM2 ties its output layer to its embeddings; its untied copy (Tinker's unembedding
    LoRA needs an output tensor: rl/lora.py) decodes the same ids with the same logprobs, and
    an adapter on `output.weight` applies to it."""
    def lps(tokens: list[TokenEvent]) -> list[float]:
        return [t.logprob or 0.0 for t in tokens]

    base, _ = await run(eng, story, max_tokens=12, ignore_eos=True, logprobs=0)
    untied = untie_gguf(model_path, tmp_path / "untied.gguf")
    await call(eng, "update_weights", {"update_info": {"weights_path": str(untied)}})
    same, _ = await run(eng, story, max_tokens=12, ignore_eos=True, logprobs=0)
    assert ids(same) == ids(base) and lps(same) == lps(base)
    rng = np.random.default_rng(1)
    head = write_lora_gguf(tmp_path / "head.gguf", {"lm_head": (
        rng.normal(0, 0.05, (4, 576)), rng.normal(0, 0.05, (49152, 4)))},
        alpha=8, n_head=9, n_head_kv=3)
    await call(eng, "update_weights", {"update_info": {"lora_path": str(head)}})
    tuned, _ = await run(eng, story, max_tokens=12, ignore_eos=True, logprobs=0)
    assert abs(lps(tuned)[0] - lps(base)[0]) > 0.01


async def test_a_gguf_replaces_the_weights_when_nothing_runs(eng: LlamaCppEngine, prompt: list[int],
                                                             model_path: Path,
                                                             gemma_path: Path) -> None:
    base, _ = await run(eng, prompt, max_tokens=10, ignore_eos=True)
    stream = await eng.submit(prompt, SamplingParams(max_tokens=30, temperature=0.0,
                                                     ignore_eos=True))
    await first_tokens(stream, 2)
    await call(eng, "pause", mode="keep")
    reload = ControlCall("collective_rpc", (), {"method": "reload_weights",
                                                "kwargs": {"weights_path": str(model_path)}})
    with pytest.raises(InvalidRequestError, match="frozen by pause"):
        await eng.control(reload)
    await call(eng, "pause", mode="abort")
    assert (await collect(stream))[1].reason == "abort"
    assert await call(eng, "collective_rpc", reload.body) == {"results": [None]}
    with pytest.raises(InvalidRequestError, match="another vocabulary") as info:
        await call(eng, "update_weights", {"update_info": {"weights_path": str(gemma_path)}})
    assert info.value.param == "weights_path"
    await call(eng, "resume")
    again, finish = await run(eng, prompt, max_tokens=10, ignore_eos=True)
    assert ids(again) == ids(base) and finish.cached_tokens == 0
    assert finish.weight_versions == (WeightSpan(content_version(model_path), 0, 10),)


@pytest.mark.parametrize(("op", "body", "param"), [
    ("update_weights", {"update_info": {"lora_path": "/nonexistent.gguf"}},
     "update_info.lora_path"),
    ("update_weights", {"update_info": {}}, "update_info"),
    ("update_weights", {"update_info": {"lora": [{"path": 3}]}}, "update_info.lora[0].path"),
    ("update_weight_version", {}, "new_version"),
    ("collective_rpc", {"method": "save_sharded_state"}, "method"),
    ("sleep", None, "sleep"),
    ("load_lora_adapter", {"lora_name": "a", "lora_path": "/x"}, "load_lora_adapter"),
    ("unload_lora_adapter", {"lora_name": "a"}, "unload_lora_adapter"),
])
async def test_bad_calls_are_refused_by_name(eng: LlamaCppEngine, prompt: list[int], op: str,
                                             body: object, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        await eng.control(ControlCall(op, (), body))
    assert info.value.param == param
    if op == "sleep":
        assert isinstance(info.value, UnsupportedParameterError)
    # and the engine still serves
    assert len((await run(eng, prompt, max_tokens=2, ignore_eos=True))[0]) == 2


async def test_reset_prefix_cache(eng: LlamaCppEngine, prompt: list[int]) -> None:
    await run(eng, prompt, max_tokens=2)
    assert (await run(eng, prompt, max_tokens=2))[1].cached_tokens == len(prompt) - 1
    assert await call(eng, "reset_prefix_cache") == {"success": True}
    assert (await run(eng, prompt, max_tokens=2))[1].cached_tokens == 0


QUESTIONS = ["Tell me a story about a lighthouse.", "Name three colours.", "What is 17 * 3?",
             "Write a haiku about rain.", "Why is the sea salty?", "List four fruits.",
             "Describe a cat in one sentence.", "What is the capital of Peru?"]


async def test_deterministic_mode_gives_each_request_its_solo_output(model_path: Path,
                                                                     prompt_of) -> None:  # type: ignore[no-untyped-def]
    """`deterministic`: what a request samples does not depend on what runs beside it."""
    engine = LlamaCppEngine(model_path, max_model_len=TEST_MAX_MODEL_LEN, n_parallel=4,
                            deterministic=True)
    await engine.start()
    try:
        prompts = [prompt_of(q) for q in QUESTIONS]
        alone = [ids((await run(engine, p, max_tokens=48))[0]) for p in prompts]
        for _ in range(2):  # all at once (more than the slots: some wait), twice
            together = await asyncio.gather(*(run(engine, p, max_tokens=48) for p in prompts))
            assert [ids(t) for t, _ in together] == alone
            assert all(f.cached_tokens == 0 for _, f in together)  # no cached prefix
    finally:
        await engine.aclose()


async def test_processed_logprobs_are_those_of_the_distribution_drawn_from(
        model_path: Path, prompt_of) -> None:  # type: ignore[no-untyped-def]
    """`logprobs_mode`: raw (the model's distribution) or processed (after temperature and
    truncation: what the sampler drew from, the importance ratio's denominator)."""
    engines = {mode: LlamaCppEngine(model_path, max_model_len=TEST_MAX_MODEL_LEN, n_parallel=1,
                                    prefix_cache=False, logprobs_mode=mode)
               for mode in ("raw_logprobs", "processed_logprobs")}
    for e in engines.values():
        await e.start()
    try:
        p = prompt_of("Write a poem about the sea.")
        raw, _ = await run(engines["raw_logprobs"], p, max_tokens=4, logprobs=5)
        assert engines["processed_logprobs"].info.logprobs_mode == "processed_logprobs"
        got, _ = await run(engines["processed_logprobs"], p, max_tokens=6, temperature=0.7,
                           top_k=5, seed=3, logprobs=5)
        for t in got:  # only what top-k kept has mass, and it sums to one
            assert len(t.top_logprobs) == 5 and t.logprob is not None
            assert sum(math.exp(lp) for _, lp in t.top_logprobs) == pytest.approx(1, abs=1e-4)
            assert t.token_id in dict(t.top_logprobs)
        # the first position: raw logits over temperature, renormalised over the 5 kept
        scaled = {i: lp / 0.7 for i, lp in raw[0].top_logprobs}
        norm = math.log(sum(math.exp(v) for v in scaled.values()))
        assert dict(got[0].top_logprobs) == pytest.approx(
            {i: v - norm for i, v in scaled.items()}, abs=1e-3)
        # greedy is not processed by temperature or truncation: the same numbers as raw
        greedy, _ = await run(engines["processed_logprobs"], p, max_tokens=4, logprobs=5)
        assert ids(greedy) == ids(raw)
        assert [t.logprob for t in greedy] == pytest.approx([t.logprob for t in raw], abs=1e-4)
    finally:
        for e in engines.values():
            await e.aclose()


async def test_the_sampling_mask_is_what_the_sampler_could_draw(
        model_path: Path, prompt_of) -> None:  # type: ignore[no-untyped-def]
    """vLLM's `--return-sampling-mask`: each sampled token (the stop id included) lists the ids
    the chain left drawable, which are exactly those its processed logprobs give mass to."""
    with pytest.raises(ValueError, match="processed_logprobs"):
        LlamaCppEngine(model_path, sampling_mask=True)
    engine = LlamaCppEngine(model_path, max_model_len=TEST_MAX_MODEL_LEN, n_parallel=1,
                            logprobs_mode="processed_logprobs", sampling_mask=True)
    await engine.start()
    try:
        assert engine.info.sampling_mask
        p = prompt_of("Say only yes.")
        for seed in range(8):  # a seed whose sample ends with the end-of-turn id
            tokens, finish = await run(engine, p, max_tokens=60, temperature=0.8, top_k=6,
                                       seed=seed, logprobs=6)
            if finish.stop_token is not None:
                break
        assert finish.stop_token is not None
        for t in [*tokens, finish.stop_token]:
            assert t.sampling_mask is not None and t.token_id in t.sampling_mask
            assert list(t.sampling_mask) == sorted(t.sampling_mask)
            assert set(t.sampling_mask) == {i for i, lp in t.top_logprobs if lp > -9999}
        # top-p truncates further where the distribution is peaked: masks of one id show up
        tokens, _ = await run(engine, p, max_tokens=12, temperature=0.8, top_k=40, top_p=0.5,
                              seed=1)
        assert all(t.sampling_mask is not None and len(t.sampling_mask) <= 40 for t in tokens)
        assert any(t.sampling_mask == (t.token_id,) for t in tokens)
    finally:
        await engine.aclose()
