"""The embedded llama.cpp engine, on the real model."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

import pytest

from tests.conftest import loop_gaps
from tokenwire.engines.base import (
    Engine,
    FinishEvent,
    PromptLogprobsEvent,
    SamplingParams,
    TokenEvent,
)
from tokenwire.engines.llamacpp import LlamaCppEngine
from tokenwire.engines.llamacpp.slots import MIN_COPY, common_prefix
from tokenwire.errors import EngineError, RateLimitError, ServiceUnavailableError
from tokenwire.tokenizers.source import TokenizerSource

pytestmark = [pytest.mark.anyio, pytest.mark.engine]


async def run(engine: LlamaCppEngine, prompt: Sequence[int], **kw: object,
              ) -> tuple[list[TokenEvent], FinishEvent]:
    params = SamplingParams(**{"max_tokens": 40, "temperature": 0.0, **kw})  # type: ignore[arg-type]
    events = [ev async for ev in await engine.submit(prompt, params)
              if not isinstance(ev, PromptLogprobsEvent)]  # (tests that want it read it)
    *tokens, finish = events
    assert isinstance(finish, FinishEvent)
    assert all(isinstance(t, TokenEvent) for t in tokens)
    return tokens, finish  # type: ignore[return-value]


def ids(tokens: list[TokenEvent]) -> list[int]:
    return [t.token_id for t in tokens]


async def test_implements_the_protocol(engine: LlamaCppEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.info.vocab_size == 49152
    assert engine.info.max_model_len == 4096
    assert 2 in engine.info.eog_ids  # <|im_end|>


async def test_greedy_is_deterministic_and_batch_invariant(engine: LlamaCppEngine,
                                                           prompt_of) -> None:  # type: ignore[no-untyped-def]
    p = prompt_of("Tell me a story about a lighthouse.")
    alone, _ = await run(engine, p, max_tokens=30)
    again, _ = await run(engine, p, max_tokens=30)
    assert ids(alone) == ids(again)
    together = await asyncio.gather(
        run(engine, p, max_tokens=30), run(engine, p, max_tokens=30),
        run(engine, prompt_of("Something else entirely: cats."), max_tokens=30),
    )
    assert ids(together[0][0]) == ids(together[1][0]) == ids(alone)


async def test_seeded_sampling_is_reproducible(engine: LlamaCppEngine, prompt_of) -> None:  # type: ignore[no-untyped-def]
    p = prompt_of("Write a poem.")
    a, _ = await run(engine, p, temperature=1.0, seed=11)
    b, _ = await run(engine, p, temperature=1.0, seed=11)
    c, _ = await run(engine, p, temperature=1.0, seed=12)
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)


async def test_max_tokens_and_end_of_generation(engine: LlamaCppEngine, prompt_of) -> None:  # type: ignore[no-untyped-def]
    tokens, finish = await run(engine, prompt_of("Tell me a long story."), max_tokens=7)
    assert len(tokens) == 7 and finish.reason == "length" and finish.stop_token is None
    tokens, finish = await run(engine, prompt_of("Say only yes."), max_tokens=40)
    assert finish.reason == "stop"
    assert finish.stop_token is not None
    assert finish.stop_token.token_id in engine.info.eog_ids
    assert not set(ids(tokens)) & engine.info.eog_ids


async def test_logprobs(engine: LlamaCppEngine, prompt_of) -> None:  # type: ignore[no-untyped-def]
    tokens, _ = await run(engine, prompt_of("Name a color."), max_tokens=8, logprobs=5)
    for t in tokens:
        assert t.logprob is not None and t.logprob <= 0
        assert len(t.top_logprobs) == 5
        lps = [lp for _, lp in t.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert sum(math.exp(lp) for lp in lps) <= 1.0 + 1e-6
        # greedy: the chosen token is the most likely one
        assert t.top_logprobs[0][0] == t.token_id
        assert t.top_logprobs[0][1] == pytest.approx(t.logprob)
    plain, _ = await run(engine, prompt_of("Name a color."), max_tokens=8)
    assert plain[0].logprob is None and plain[0].top_logprobs == ()
    assert ids(plain) == ids(tokens)


async def test_frequency_penalty_reaches_the_sampler(engine: LlamaCppEngine, prompt_of) -> None:  # type: ignore[no-untyped-def]
    p = prompt_of("Reply with a single emoji.")
    plain, _ = await run(engine, p, max_tokens=30)
    penalised, _ = await run(engine, p, max_tokens=30, frequency_penalty=2.0)

    def repeats(ts: list[TokenEvent]) -> int:
        return len(ts) - len(set(ids(ts)))

    assert repeats(penalised) < repeats(plain)


async def test_more_requests_than_slots_wait_their_turn(engine: LlamaCppEngine,
                                                        prompt_of) -> None:  # type: ignore[no-untyped-def]
    p = prompt_of("Count to twenty.")
    results = await asyncio.gather(*(run(engine, p, max_tokens=12) for _ in range(7)))
    assert all(len(tokens) == 12 for tokens, _ in results)
    assert len({tuple(ids(t)) for t, _ in results}) == 1


async def test_closing_the_stream_frees_the_slot(engine: LlamaCppEngine, prompt_of) -> None:  # type: ignore[no-untyped-def]
    stream = await engine.submit(prompt_of("Tell me a very long story."),
                             SamplingParams(max_tokens=2000, temperature=0.0))
    got = 0
    async for _ in stream:
        got += 1
        if got == 3:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while engine.n_active and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert engine.n_active == 0
    tokens, _ = await run(engine, prompt_of("Say only yes."), max_tokens=5)
    assert tokens


async def test_the_event_loop_stays_free(engine: LlamaCppEngine, prompt_of) -> None:  # type: ignore[no-untyped-def]
    """Model compute runs in the engine thread: the loop keeps ticking during a long prefill."""
    long_prompt = prompt_of("word " * 700)
    async with loop_gaps(0.005) as gaps:
        await run(engine, long_prompt, max_tokens=5)
    assert len(gaps) > 10
    assert max(gaps) < 1.0  # generous: a blocked loop would stall for the whole prefill


async def test_a_stopped_engine_refuses(model_path) -> None:  # type: ignore[no-untyped-def]
    eng = LlamaCppEngine(model_path, model_id="m", max_model_len=256, n_parallel=1)
    with pytest.raises(ServiceUnavailableError):
        await eng.submit([1, 2, 3], SamplingParams(max_tokens=1))


async def test_a_full_queue_refuses_at_once(model_path) -> None:  # type: ignore[no-untyped-def]
    eng = LlamaCppEngine(model_path, model_id="m", max_model_len=512, n_parallel=1,
                         max_queued=1)
    await eng.start()
    try:
        params = SamplingParams(max_tokens=200, temperature=0.0)
        running = await eng.submit([504, 3575, 282], params)
        await running.__anext__()  # admitted, decoding
        waiting = await eng.submit([504, 3575, 282], params)  # queued behind it
        with pytest.raises(RateLimitError) as info:
            await eng.submit([504], params)
        assert info.value.headers["Retry-After"] == "1"
        await running.aclose()  # type: ignore[attr-defined]
        tokens = [ev async for ev in waiting]
        assert isinstance(tokens[-1], FinishEvent)
    finally:
        await eng.aclose()


async def test_a_failed_decode_fails_its_requests_and_the_engine_recovers(
        engine: LlamaCppEngine, prompt_of, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    real = type(engine.llama).decode
    calls = {"n": 0}

    def flaky(self, batch):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected decode failure")
        return real(self, batch)

    monkeypatch.setattr(type(engine.llama), "decode", flaky)
    p = prompt_of("Tell me a story.")
    with pytest.raises(EngineError) as failed:
        await run(engine, p, max_tokens=20)
    cause = failed.value.__cause__  # chained to what llama.cpp raised, for the log and debugger
    assert isinstance(cause, RuntimeError) and str(cause) == "injected decode failure"
    assert engine.n_active == 0
    monkeypatch.undo()
    tokens, finish = await run(engine, p, max_tokens=5)
    assert len(tokens) == 5 and finish.reason == "length"


async def test_shutdown_ends_streams_cleanly(model_path) -> None:  # type: ignore[no-untyped-def]
    eng = LlamaCppEngine(model_path, model_id="m", max_model_len=512, n_parallel=1)
    await eng.start()
    stream = await eng.submit([504, 3575, 282], SamplingParams(max_tokens=400, temperature=0.0))
    await stream.__anext__()
    queued = await eng.submit([504], SamplingParams(max_tokens=400, temperature=0.0))
    await eng.aclose()
    for s in (stream, queued):
        with pytest.raises(ServiceUnavailableError):
            async for _ in s:
                pass


def test_a_consumer_whose_loop_is_gone_does_not_stop_the_engine(engine: LlamaCppEngine,
                                                                prompt_of) -> None:  # type: ignore[no-untyped-def]
    async def start_and_abandon() -> None:
        stream = await engine.submit(prompt_of("Tell me a long story."),
                                 SamplingParams(max_tokens=300, temperature=0.0))
        await stream.__anext__()  # then the loop ends with the stream still open

    asyncio.run(start_and_abandon())
    tokens, _ = asyncio.run(run(engine, prompt_of("Say only yes."), max_tokens=4))
    assert tokens
    deadline = time.monotonic() + 10
    while engine.n_active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.n_active == 0


async def test_bad_prompts_never_reach_a_batch(engine: LlamaCppEngine) -> None:
    from tokenwire.errors import ContextLengthExceededError, InvalidRequestError

    p = SamplingParams(max_tokens=1)
    with pytest.raises(InvalidRequestError):
        await engine.submit([], p)
    with pytest.raises(ContextLengthExceededError):
        await engine.submit([253] * engine.info.max_model_len, p)
    with pytest.raises(InvalidRequestError):
        await engine.submit([253, engine.info.vocab_size], p)
    assert engine.n_waiting == 0


async def test_idle_slots_count_before_the_queue(model_path) -> None:  # type: ignore[no-untyped-def]
    eng = LlamaCppEngine(model_path, model_id="m", max_model_len=256, n_parallel=2,
                         max_queued=0)
    await eng.start()
    try:
        assert eng.info.max_sequences == 2
        params = SamplingParams(max_tokens=3, temperature=0.0)
        a, b = await eng.submit([504], params), await eng.submit([504], params)  # two free slots
        with pytest.raises(RateLimitError):
            await eng.submit([504], params)
        for s in (a, b):
            assert isinstance([ev async for ev in s][-1], FinishEvent)
    finally:
        await eng.aclose()


async def test_the_prefix_cache_reuses_a_conversation_and_changes_nothing(
        engine: LlamaCppEngine, prompt_of, gguf_info: TokenizerSource) -> None:  # type: ignore[no-untyped-def]
    """Turn 2's prompt starts with turn 1's prompt and output: only the rest is computed, and
    what the model reads is the same: each id sampled from the cached prefix has the logprob a
    full prefill of the same ids gives it (a scoring request reuses nothing), to the bound that
    llama.cpp's cut-dependent numerics allow (docs/engines.md, "Exactness": the greedy ids
    themselves may flip on a near tie, and do on some CPU variants: on haswell at the third
    id of this prompt)."""
    tok = gguf_info.tokenizer
    first = prompt_of("Name three colours.")
    out, fin = await run(engine, first, max_tokens=24)
    assert fin.cached_tokens is not None
    follow = tok.encode("<|im_end|>\n<|im_start|>user\nAnd three fruits?<|im_end|>\n"
                        "<|im_start|>assistant\n", parse_special=True)
    second = first + ids(out) + follow
    cached_out, cached_fin = await run(engine, second, max_tokens=24, logprobs=0)
    # all of turn 1's ids but the last sampled one were fed, so their KV is there
    assert cached_fin.cached_tokens is not None
    assert cached_fin.cached_tokens >= len(first) + len(out) - 1
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    events = [ev async for ev in await engine.submit(second + ids(cached_out), params)]
    full_fin = events[-1]
    assert isinstance(full_fin, FinishEvent) and full_fin.cached_tokens == 0
    scored = next(e for e in events if isinstance(e, PromptLogprobsEvent)).entries
    full = [e.logprob for e in scored[len(second) - 1:]]
    assert [e.token_id for e in scored[len(second) - 1:]] == ids(cached_out)
    cached = [t.logprob for t in cached_out]
    assert all(abs(a - b) < 1.0 for a, b in zip(cached, full, strict=True)), (cached, full)
    # the same prompt again: everything but its last token comes from the cache
    _, again = await run(engine, second, max_tokens=1)
    assert again.cached_tokens == len(second) - 1


async def test_a_worker_that_dies_says_why_in_health(model_path) -> None:  # type: ignore[no-untyped-def]
    """An error outside a decode step stops the worker: every sequence gets a 503, samplers and
    slots are freed, and health() reports it with the reason (so /health answers 503 and a
    supervisor restarts the process), instead of a server that says ok and serves nothing."""
    eng = LlamaCppEngine(model_path, max_model_len=512, n_parallel=2)
    await eng.start()
    try:
        assert eng.health().ok
        running = await eng.submit([1, 2, 3], SamplingParams(max_tokens=200, temperature=0.0))
        first = await running.__anext__()
        assert isinstance(first, TokenEvent)

        def broken(seq):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

        eng._place = broken  # type: ignore[method-assign]
        waiting = await eng.submit([1, 2, 3], SamplingParams(max_tokens=4))
        with pytest.raises(ServiceUnavailableError):
            async for _ in waiting:
                pass
        with pytest.raises(ServiceUnavailableError):
            async for _ in running:
                pass
        health = eng.health()
        assert not health.ok and "boom" in (health.reason or "")
        assert eng.n_active == 0 and eng.n_waiting == 0
        with pytest.raises(ServiceUnavailableError):
            await eng.submit([1, 2, 3], SamplingParams(max_tokens=4))
    finally:
        await eng.aclose()


def split_equal(seq_ids: Sequence[int], n_ubatch: int) -> int:
    """How many ubatches llama.cpp cuts a batch into when each sequence has its own KV stream:
    llama_batch_allocr::split_equal(n_ubatch, sequential=true), transcribed."""
    n = len(seq_ids)
    used = [False] * n
    count = 0
    while not all(used):
        chosen: list[int] = []
        for i in range(n):
            s = seq_ids[i]
            if used[i] or s in chosen or (chosen and s != chosen[-1] + 1):
                continue
            chosen.append(s)
            if len(chosen) > n_ubatch:
                break
        rows = {s: [i for i in range(n) if not used[i] and seq_ids[i] == s] for s in chosen}
        k = 0
        while all(len(rows[s]) > k for s in chosen):
            for s in chosen:
                used[rows[s][k]] = True
            k += 1
            if (k + 1) * len(chosen) > n_ubatch:
                break
        count += 1
    return count


def record_steps(eng: LlamaCppEngine) -> list[tuple[list[int], list[int], int]]:
    """(sequence ids, positions, ubatches run) of every decode from now on."""
    llama = eng.llama
    steps: list[tuple[list[int], list[int], int]] = []
    decode = llama.decode

    def recording(batch):  # type: ignore[no-untyped-def]
        before = llama.ubatches
        rc = decode(batch)
        steps.append((batch.seq[:batch.n].tolist(), batch.pos[:batch.n].tolist(),
                      llama.ubatches - before))
        return rc

    llama.decode = recording  # type: ignore[method-assign]
    return steps


async def test_one_forward_pass_per_decode_step(model_path, prompt_of) -> None:  # type: ignore[no-untyped-def]
    """Slots recycled out of order, prompt chunks beside decoding sequences: every batch is in
    slot order, so a step of decoding sequences in consecutive slots is one ubatch; and the
    count llama.cpp reports is the one its split rule gives (so this cannot drift silently)."""
    eng = LlamaCppEngine(model_path, max_model_len=512, n_parallel=4, count_ubatches=True)
    await eng.start()
    try:
        steps = record_steps(eng)
        questions = ["Name a colour.", "Tell me about the sea.", "Count to five.",
                     "What is two plus two?", "Write a haiku.", "Say hello.",
                     "Describe a cat.", "Name a city."]
        lengths = [6, 30, 14, 22, 9, 26, 12, 18]
        await asyncio.gather(*(run(eng, prompt_of(q), max_tokens=k)
                               for q, k in zip(questions, lengths, strict=True)))
    finally:
        await eng.aclose()
    decode_only = [(seqs, n) for seqs, _, n in steps if len(set(seqs)) == len(seqs)]
    assert all(seqs == sorted(seqs) for seqs, _, _ in steps)
    assert all(n == split_equal(seqs, 512) for seqs, _, n in steps)
    runs = [1 + sum(b != a + 1 for a, b in zip(seqs, seqs[1:], strict=False))
            for seqs, _ in decode_only]
    assert [n for _, n in decode_only] == runs
    full = [n for seqs, n in decode_only if seqs == [0, 1, 2, 3]]
    assert len(full) > 5 and set(full) == {1}
    # slots did come back out of order (else the test shows nothing)
    assert any(runs_ > 1 for runs_ in runs) or any(seqs[0] != 0 for seqs, _ in decode_only)


async def test_the_same_prompt_at_once_is_prefilled_once(model_path, prompt_of) -> None:  # type: ignore[no-untyped-def]
    """n > 1, or one prompt sent several times at once: one sequence prefills it, the others
    copy its KV and feed only their last prompt id; each gets what it gets alone."""
    eng = LlamaCppEngine(model_path, max_model_len=512, n_parallel=4)
    await eng.start()
    try:
        p = prompt_of("Tell me a story about a lighthouse keeper and her dog. " * 4)
        steps = record_steps(eng)
        results = await asyncio.gather(*(run(eng, p, max_tokens=12) for _ in range(4)))
        steps = list(steps)  # the scoring run below is the reference, not counted
        alone, _ = await run(eng, p, max_tokens=12, prompt_logprobs=0)  # computes all
    finally:
        await eng.aclose()
    assert all(ids(out) == ids(alone) for out, _ in results)
    assert sorted(fin.cached_tokens or 0 for _, fin in results) == [0] + [len(p) - 1] * 3
    prompt_fed = sum(pos < len(p) for _, positions, _ in steps for pos in positions)
    assert prompt_fed == len(p) + 3


async def test_a_shared_system_prompt_is_copied_and_the_history_kept(
        model_path, prompt_of, gguf_info: TokenizerSource) -> None:  # type: ignore[no-untyped-def]
    """A new conversation sharing only the system prompt with a cached one gets that prefix
    copied into an empty slot; the cached conversation's next turn still finds all of it."""
    tok = gguf_info.tokenizer
    eng = LlamaCppEngine(model_path, max_model_len=1024, n_parallel=2)
    await eng.start()
    try:
        a1 = prompt_of("Name three colours and say why you like them.")
        out, _ = await run(eng, a1, max_tokens=24)
        b = prompt_of("Write two lines about rain.")
        shared = common_prefix(a1, b)
        assert shared >= MIN_COPY  # the template's system prompt
        b_out, b_fin = await run(eng, b, max_tokens=16)
        assert b_fin.cached_tokens == shared
        a2 = a1 + ids(out) + tok.encode("<|im_end|>\n<|im_start|>user\nAnd fruits?<|im_end|>\n"
                                        "<|im_start|>assistant\n", parse_special=True)
        _, a2_fin = await run(eng, a2, max_tokens=4)
        assert (a2_fin.cached_tokens or 0) >= len(a1) + len(out) - 1
        cold, cold_fin = await run(eng, b, max_tokens=16, prompt_logprobs=0)
        assert cold_fin.cached_tokens == 0 and ids(b_out) == ids(cold)
    finally:
        await eng.aclose()


async def test_without_the_prefix_cache_every_prompt_is_computed_as_alone(
        model_path, prompt_of) -> None:  # type: ignore[no-untyped-def]
    """`prefix_cache=False` (`--no-prefix-cache`): nothing is reused, not even the same prompt
    again or a conversation's next turn, so each request's logprobs are a full prefill's: llama.cpp
    is not batch-invariant (docs/engines.md, "Exactness"), and this is the way to pay for that."""
    eng = LlamaCppEngine(model_path, max_model_len=512, n_parallel=2, prefix_cache=False)
    await eng.start()
    try:
        p = prompt_of("Tell me about the sea, the ships that sail on it and their crews. " * 3)
        assert len(p) >= 64  # long enough for llama.cpp's tiled attention on a full prefill
        first, fin1 = await run(eng, p, max_tokens=6, logprobs=1)
        turn = [*p, *ids(first), *prompt_of("And then?")[1:]]
        again, fin2 = await run(eng, p, max_tokens=6, logprobs=1)
        _, fin3 = await run(eng, turn, max_tokens=2)
    finally:
        await eng.aclose()
    assert [fin1.cached_tokens, fin2.cached_tokens, fin3.cached_tokens] == [0, 0, 0]
    assert [(t.token_id, t.logprob) for t in again] == [(t.token_id, t.logprob) for t in first]


async def test_a_cache_salt_isolates_the_prefix_cache(engine: LlamaCppEngine,  # type: ignore[no-untyped-def]
                                                      gguf_info) -> None:
    """A salted request reuses only prefixes its own salt computed (vLLM's `cache_salt`): no
    tenant can time another's cached prompt; greedy ids are the same either way. (A raw
    prompt no other test sends: chat prompts share the template's system prompt.)"""
    p = gguf_info.tokenizer.encode("Zebras of planet Quorx-7 count in base eleven: one, two,")
    out, first = await run(engine, p, cache_salt="a")
    assert first.cached_tokens == 0
    for salt in (None, "b"):
        other_out, other = await run(engine, p, cache_salt=salt)
        assert other.cached_tokens == 0 and ids(other_out) == ids(out)
    _, again = await run(engine, p, cache_salt="a")
    assert again.cached_tokens == len(p) - 1
