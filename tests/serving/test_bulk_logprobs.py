"""Whole answers in bulk (docs/hot-path.md): a `TokenRun` reads as the events it stands for,
vLLM's whole body becomes the same tokens by either path, and the logprobs written as JSON in
bulk are the wire models' own entries (the models stay the one definition)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import orjson
import pytest

from tokenwire.engines.base import SamplingParams, TokenEvent, TokenRun, join_events
from tokenwire.engines.vllm import _VllmDecoder
from tokenwire.protocol._base import RawJSON
from tokenwire.protocol.chat import (
    ChatChoice,
    ChatCompletion,
    ChoiceLogprobs,
    ResponseMessage,
)
from tokenwire.protocol.common import TokenLogprob
from tokenwire.protocol.generate import GenerateLogprob, GenerateLogprobEntry
from tokenwire.serving.logprobs import chat_logprobs, chat_logprobs_json, generate_logprobs_json
from tokenwire.tokenizers.hf import HFTokenizer

SHAPES = Path(__file__).parents[1] / "engines" / "shapes" / "vllm"


def _events(tok: HFTokenizer, n: int, k: int, seed: int, *, gaps: bool = False,
            ) -> list[TokenEvent]:
    """Sampled tokens with their top k, over the whole vocabulary (control tokens and ids whose
    bytes are part of a character included); `gaps`: some without a logprob, some not finite."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t = rng.randrange(tok.vocab_size)
        lp = -rng.random() * 20
        if gaps and rng.random() < 0.2:
            lp = rng.choice([None, -math.inf, math.nan])  # type: ignore[assignment]
        top = tuple(sorted(((rng.randrange(tok.vocab_size), -rng.random() * 5)
                            for _ in range(k)), key=lambda e: -e[1]))
        out.append(TokenEvent(t, lp, top))
    return out


def _run(events: list[TokenEvent]) -> TokenRun:
    return TokenRun.of([e.token_id for e in events], [e.logprob for e in events],  # type: ignore[misc]
                       [e.top_logprobs for e in events])


def test_a_run_reads_as_its_events() -> None:
    events = [TokenEvent(5, -0.5, ((5, -0.5), (9, -1.0))), TokenEvent(6, -0.25, ()),
              TokenEvent(7, -2.0, ((1, -0.1),))]
    run = _run(events)
    assert list(run) == events and len(run) == 3 and run[-1] == events[-1]
    assert list(run[1:]) == events[1:] and list(run[:0]) == []
    assert list(join_events(run[:1], run[1:])) == events
    assert isinstance(join_events(run[:1], run[1:]), TokenRun)  # no event made to join them
    assert join_events([events[0]], run[1:]) == events  # a list where one side is
    bare = TokenRun.of([1, 2, 3])
    assert list(bare) == [TokenEvent(1), TokenEvent(2), TokenEvent(3)]
    with pytest.raises(ValueError):
        _ = run + bare


@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("as_ids", [False, True])
def test_bulk_chat_logprobs_are_the_models_entries(tok: HFTokenizer, k: int,
                                                   as_ids: bool) -> None:
    events = _events(tok, 300, k, seed=k)
    models = [m.model_dump(mode="json") for m in chat_logprobs(tok, events, as_ids=as_ids)]
    assert orjson.loads(chat_logprobs_json(tok, events, as_ids=as_ids).data) == models
    assert orjson.loads(chat_logprobs_json(tok, _run(events), as_ids=as_ids).data) == models


def test_bulk_chat_logprobs_spell_what_json_cannot_hold_as_the_models_do(
        tok: HFTokenizer) -> None:
    events = _events(tok, 300, 1, seed=7, gaps=True)
    assert any(e.logprob is None for e in events)
    assert any(e.logprob is not None and not math.isfinite(e.logprob) for e in events)
    def wire(entries: list[TokenLogprob]) -> list[object]:
        return [json.loads(m.model_dump_json()) for m in entries]  # -inf, NaN: null

    assert json.loads(chat_logprobs_json(tok, events).data) == wire(chat_logprobs(tok, events))
    finite = [e for e in events if e.logprob is not None]  # a run holds a logprob per token
    assert json.loads(chat_logprobs_json(tok, _run(finite)).data) == \
        wire(chat_logprobs(tok, finite))
    # an id the client's version lacks: the entry is written without `id`, as the model's is
    def ids(t: int) -> int | None:
        return None if t % 3 == 0 else t + 1

    assert json.loads(chat_logprobs_json(tok, finite, ids=ids).data) == \
        wire(chat_logprobs(tok, finite, ids=ids))


def test_bulk_generate_logprobs_are_the_models_entries(tok: HFTokenizer) -> None:
    events = _events(tok, 200, 2, seed=3) + [TokenEvent(11, None, ((11, -0.5),))]
    for e, raw in zip(events, generate_logprobs_json(events), strict=True):
        entry = GenerateLogprobEntry.model_validate_json(raw)
        assert not entry.model_extra and all(not t.model_extra for t in entry.top_logprobs)
        ranks = {t: r for r, (t, _) in enumerate(e.top_logprobs, start=1)}
        lp = e.logprob if e.logprob is not None else -9999.0
        first = GenerateLogprob(token_id=e.token_id, token=f"token_id:{e.token_id}",
                                logprob=lp, rank=ranks.get(e.token_id))
        expect = GenerateLogprobEntry(**first.model_dump(), top_logprobs=[first, *(
            GenerateLogprob(token_id=t, token=f"token_id:{t}", logprob=v, rank=ranks[t])
            for t, v in e.top_logprobs if t != e.token_id)])
        assert json.loads(raw) == json.loads(expect.model_dump_json())


def test_a_response_carrying_raw_json_writes_the_same_json_either_way(
        tok: HFTokenizer) -> None:
    events = _events(tok, 50, 1, seed=1)
    choice = ChatChoice(index=0, message=ResponseMessage(content="x"), finish_reason="length",
                        logprobs=ChoiceLogprobs(content=chat_logprobs_json(tok, _run(events))))
    done = ChatCompletion(id="c", created=1, model="m", choices=[choice])
    spliced = done.json_bytes()  # orjson, the fragment as it is
    assert json.loads(spliced) == json.loads(done.model_dump_json())  # pydantic, read back
    assert json.loads(spliced)["choices"][0]["logprobs"]["content"] == \
        [m.model_dump(mode="json") for m in chat_logprobs(tok, events)]
    assert done.model_dump(mode="json")["choices"][0]["logprobs"]["content"] == \
        json.loads(spliced)["choices"][0]["logprobs"]["content"]  # what storage keeps
    # a client reads it back into the models (the union's list)
    back = ChatCompletion.model_validate_json(spliced)
    assert back.choices[0].logprobs is not None
    assert not isinstance(back.choices[0].logprobs.content, RawJSON)
    # the OpenAPI document knows nothing of it
    assert "RawJSON" not in json.dumps(ChatCompletion.model_json_schema())


def _body(n: int, k: int, seed: int) -> bytes:
    """vLLM 0.34's unstreamed generate body (tests/engines/shapes), `n` tokens with logprobs:
    the sampled token first, then the k + 1 most likely (what tokenwire asks for)."""
    rng = random.Random(seed)
    shape = json.loads((SHAPES / "generate_response_nonstream_logprobs_v034.json").read_text())
    ids, content = [], []
    for _ in range(n):
        t = rng.randrange(49152)
        lp = -rng.random() * 4
        tops = sorted([(rng.randrange(49152), -rng.random() * 4) for _ in range(k + 1)],
                      key=lambda e: -e[1])
        entries = [{"token_id": t, "logprob": lp, "rank": 9}]
        entries += [{"token_id": i, "logprob": v, "rank": r + 1}
                    for r, (i, v) in enumerate(tops)]
        ids.append(t)
        content.append({"token_id": t, "logprob": lp, "rank": 9, "top_logprobs": entries})
    choice = shape["choices"][0]
    choice |= {"token_ids": ids, "logprobs": {"content": content}, "finish_reason": "length"}
    return json.dumps(shape).encode()


@pytest.mark.parametrize("k", [None, 0, 1, 2])
def test_a_whole_vllm_body_is_the_same_tokens_by_either_path(k: int | None) -> None:
    """The run (msgspec, arrays) and the per-token events (dicts) of one body agree."""
    body = _body(64, k or 0, seed=5)
    params = SamplingParams(max_tokens=64, logprobs=k)
    fast = _VllmDecoder([1, 2], params, frozenset())
    events = fast.feed(fast.parse(body))
    assert isinstance(events[0], TokenRun) and len(events[0]) == 64
    slow = _VllmDecoder([1, 2], params, frozenset())
    chunk = json.loads(body)
    expected = slow._tokens(chunk["choices"][0]["token_ids"], chunk["choices"][0]["logprobs"])
    assert list(events[0]) == expected
    # a stream's chunk of several tokens: the same tokens, an event each, as they came
    again = _VllmDecoder([1, 2], params, frozenset())
    assert again.feed(json.loads(body))[:64] == expected


def test_a_whole_body_that_ends_on_a_stop_id_keeps_it_out_of_the_run() -> None:
    body = json.loads(_body(8, 1, seed=2))
    body["choices"][0]["finish_reason"] = "stop"
    stop = body["choices"][0]["token_ids"][-1]
    dec = _VllmDecoder([1], SamplingParams(max_tokens=8, logprobs=1), frozenset({stop}))
    run, finish = dec.feed(dec.parse(json.dumps(body).encode())) + dec.end()
    assert isinstance(run, TokenRun) and len(run) == 7
    assert finish.stop_token is not None and finish.stop_token.token_id == stop  # type: ignore[union-attr]
    assert finish.stop_token.logprob == body["choices"][0]["logprobs"]["content"][-1]["logprob"]  # type: ignore[union-attr]


def test_an_error_body_is_read_as_before() -> None:
    dec = _VllmDecoder([1], SamplingParams(max_tokens=8), frozenset())
    err = (SHAPES / "error_response_generic.json").read_bytes()
    assert dec.parse(err) == json.loads(err)
    assert dec.parse(b"<html>bad gateway</html>")["error"]["message"].startswith("<html>")
