"""Text Generation Inference's routes over HTTP, in process (the scripted engine): details mode
(each sampled id with its text, logprob and `special`), TGI's SSE framing, `POST /` as
`huggingface_hub` posts to it, TGI's rules for sampling, stop strings and `return_full_text`,
and its validation messages and error shape (in-band in a stream). The official client runs
against a real server in tests/e2e/test_tgi.py."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import httpx
import pytest

from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine, FakeStream
from tokenwire.engines.base import EngineEvent, FinishEvent, SamplingParams, TokenEvent
from tokenwire.errors import RateLimitError
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.anyio


def frames(r: httpx.Response) -> list[dict[str, Any]]:
    """TGI's SSE: `data:<json>` and a blank line per event, no space, nothing after."""
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("\n\n") and "[DONE]" not in r.text
    raw = r.text[:-2].split("\n\n")
    assert all(f.startswith("data:{") for f in raw), raw
    return [json.loads(f[len("data:"):]) for f in raw]


def texts(tok: HFTokenizer, ids: Sequence[int]) -> str:
    return b"".join(tok.token_bytes(t) for t in ids if t not in tok.special_ids).decode()


async def test_details_are_the_sampled_ids(client: httpx.AsyncClient, tok: HFTokenizer,
                                           fake_engine: FakeEngine) -> None:
    r = await client.post("/generate", json={"inputs": "Say hi",
                                             "parameters": {"details": True}})
    assert r.status_code == 200, r.text
    body = r.json()
    details = body["details"]
    script, eos = fake_engine.script, fake_engine.eog_id
    # every sampled id, the end-of-generation one last (special, its own text)
    assert [t["id"] for t in details["tokens"]] == [*script, eos]
    assert details["tokens"][-1] == {"id": eos, "text": "<|im_end|>", "logprob": -0.5,
                                     "special": True}
    assert not any(t["special"] for t in details["tokens"][:-1])
    # each token's text is what it adds ("" where a character is not complete yet)
    assert "".join(t["text"] for t in details["tokens"][:-1]) == texts(tok, script)
    assert "" in [t["text"] for t in details["tokens"]]  # the 🎉 spans ids
    # the text is the generated ids' without control tokens; not the prompt (not POST /)
    assert body["generated_text"] == "Bonjour à tous 🎉 ça va?" == texts(tok, script)
    assert details["finish_reason"] == "eos_token"
    assert details["generated_tokens"] == len(script) + 1
    assert details["seed"] is None and details["prefill"] == []  # greedy: no seed
    assert "best_of_sequences" not in details and "top_tokens" not in details
    assert fake_engine.params[-1].temperature == 0.0  # `parameters` sent: TGI's greedy
    assert fake_engine.prompts[-1] == tok.encode("Say hi")
    # without details: the text alone
    r = await client.post("/generate", json={"inputs": "Say hi", "parameters": {}})
    assert r.json() == {"generated_text": texts(tok, script)}


async def test_tgis_rule_picks_greedy_or_sampling(client: httpx.AsyncClient,
                                                  fake_engine: FakeEngine) -> None:
    async def params(parameters: dict[str, Any] | None) -> tuple[SamplingParams, Any]:
        body: dict[str, Any] = {"inputs": "Hi"}
        if parameters is not None:
            body["parameters"] = {**parameters, "details": True, "max_new_tokens": 2}
        r = await client.post("/generate", json=body)
        assert r.status_code == 200, r.text
        return fake_engine.params[-1], r.json().get("details", {}).get("seed")

    # no `parameters` at all: TGI samples (default_parameters), with a seed of its own
    sp, _ = await params(None)
    assert sp.temperature == 1.0 and sp.seed is not None
    sp, seed = await params({})
    assert sp.temperature == 0.0 and seed is None
    sp, seed = await params({"temperature": 1.0})  # 1 is no change: still greedy
    assert sp.temperature == 0.0 and seed is None
    sp, seed = await params({"temperature": 0.5, "top_k": 5, "top_p": 0.9, "seed": 7})
    assert (sp.temperature, sp.top_k, sp.top_p, seed) == (0.5, 5, 0.9, 7)
    again, _ = await params({"temperature": 0.5, "top_k": 5, "top_p": 0.9, "seed": 7})
    assert again.seed == sp.seed  # the seed reproduces the draw
    sp, seed = await params({"do_sample": True, "repetition_penalty": 1.3,
                             "frequency_penalty": 0.5})
    assert sp.temperature == 1.0 and isinstance(seed, int)
    assert (sp.repetition_penalty, sp.frequency_penalty) == (1.3, 0.5)
    drawn, _ = await params({"do_sample": True, "seed": seed})
    assert drawn.seed == sp.seed  # the seed a response names draws it again


async def test_a_stop_string_ends_the_text_with_it(client: httpx.AsyncClient, tok: HFTokenizer,
                                                   fake_engine: FakeEngine) -> None:
    """TGI's rule: the stop string stays in the text, the token that completes it is the last;
    one completed inside a token that goes on ("tou" in " t"+"ous") does not stop it, where
    /inference/v1/generate (vLLM's rule) stops."""
    r = await client.post("/generate", json={"inputs": "Hi", "parameters": {
        "details": True, "stop": ["nothing", "à t"]}})
    details = r.json()["details"]
    assert r.json()["generated_text"] == "Bonjour à t"
    assert details["finish_reason"] == "stop_sequence"
    assert [t["id"] for t in details["tokens"]] == fake_engine.script[:4]
    r = await client.post("/generate", json={"inputs": "Hi", "parameters": {
        "details": True, "stop": ["tou"]}})
    assert r.json()["details"]["finish_reason"] == "eos_token"
    vllm = await client.post("/inference/v1/generate", json={
        "token_ids": tok.encode("Hi"), "sampling_params": {"stop": ["tou"]}})
    assert vllm.json()["choices"][0]["token_ids"] == fake_engine.script[:5]


async def test_the_stream_is_tgis(client: httpx.AsyncClient, tok: HFTokenizer,
                                  fake_engine: FakeEngine) -> None:
    ids = tok.encode("Say hi")
    r = await client.post("/generate_stream", json={"inputs": ids, "parameters": {
        "details": True, "max_new_tokens": 5, "top_n_tokens": 2}})
    events = frames(r)
    assert [e["index"] for e in events] == [1, 2, 3, 4, 5]
    assert [e["token"]["id"] for e in events] == fake_engine.script[:5]
    assert all(e["generated_text"] is None and e["details"] is None for e in events[:-1])
    assert events[-1]["generated_text"] == texts(tok, fake_engine.script[:5])
    assert events[-1]["details"] == {"finish_reason": "length", "generated_tokens": 5,
                                     "seed": None, "input_length": len(ids)}
    tops = events[0]["top_tokens"]
    assert [t["logprob"] for t in tops] == [-0.5, -1.5]
    assert tops[0]["id"] == events[0]["token"]["id"]
    assert list(events[0]) == ["index", "token", "top_tokens", "generated_text", "details"]
    # without details: no details, even on the last event; the EOS is the last token
    events = frames(await client.post("/generate_stream", json={"inputs": "Hi"}))
    assert events[-1]["token"] == {"id": fake_engine.eog_id, "text": "<|im_end|>",
                                   "logprob": -0.5, "special": True}
    assert events[-1]["details"] is None and "top_tokens" not in events[-1]


async def test_the_root_route_is_tgis_compat_route(client: httpx.AsyncClient,
                                                   tok: HFTokenizer,
                                                   fake_engine: FakeEngine) -> None:
    """`POST /` as `huggingface_hub` posts to a base URL: a list holding the one answer, the
    prompt first in the text (return_full_text's default there); `stream` picks SSE."""
    r = await client.post("/", json={"inputs": "Hi", "parameters": {"max_new_tokens": 3},
                                     "stream": False})
    assert r.status_code == 200
    assert r.json() == [{"generated_text": "Hi" + texts(tok, fake_engine.script[:3])}]
    r = await client.post("/", json={"inputs": "Hi", "parameters": {
        "max_new_tokens": 3, "return_full_text": False}})
    assert r.json() == [{"generated_text": texts(tok, fake_engine.script[:3])}]
    ids = tok.encode("Hi")  # ids as inputs: their text is the prompt's
    events = frames(await client.post("/", json={"inputs": ids, "stream": True,
                                                 "parameters": {"max_new_tokens": 3}}))
    assert events[-1]["generated_text"] == "Hi" + texts(tok, fake_engine.script[:3])
    r = await client.post("/generate", json={"inputs": "Hi", "stream": True,
                                             "parameters": {"max_new_tokens": 3}})
    assert r.json() == {"generated_text": texts(tok, fake_engine.script[:3])}  # not POST /


class Graded(FakeEngine):
    """Each admitted sequence's logprobs one higher than the one before."""

    async def submit(self, prompt: Sequence[int], params: SamplingParams) -> FakeStream:
        k = len(self.prompts)
        inner = await super().submit(prompt, params)

        def graded(ev: TokenEvent | None) -> TokenEvent | None:
            return None if ev is None else dataclasses.replace(ev, logprob=-3.0 + k)

        async def events() -> AsyncGenerator[EngineEvent, None]:
            async for ev in inner:
                if isinstance(ev, TokenEvent):
                    ev = graded(ev)  # type: ignore[assignment]
                elif isinstance(ev, FinishEvent):
                    ev = dataclasses.replace(ev, stop_token=graded(ev.stop_token))
                yield ev

        return FakeStream(events())


async def test_best_of_answers_the_most_likely(make_app, gguf_info, tok: HFTokenizer,  # type: ignore[no-untyped-def]
                                               ) -> None:
    engine = Graded(vocab_size=tok.vocab_size, eog_id=gguf_info.eos_id, script=[])
    engine.scripts = [tok.encode(" one two"), tok.encode(" three"), tok.encode(" four")]
    async with serve_in_process(make_app(engine)) as c:
        r = await c.post("/generate", json={"inputs": "Count", "parameters": {
            "best_of": 3, "do_sample": True, "details": True, "decoder_input_details": True}})
        assert r.status_code == 200, r.text
        body = r.json()
        details = body["details"]
        assert body["generated_text"] == " four"  # the third: the highest mean logprob
        others = details["best_of_sequences"]
        assert [o["generated_text"] for o in others] == [" one two", " three"]
        assert [o["seed"] for o in others] == [details["seed"] - 2, details["seed"] - 1]
        prompt = tok.encode("Count")
        for seq in [details, *others]:
            assert [p["id"] for p in seq["prefill"]] == prompt
            assert seq["prefill"][0]["logprob"] is None
        # each sequence's seed draws it alone
        one = await c.post("/generate", json={"inputs": "Count", "parameters": {
            "do_sample": True, "seed": details["seed"]}})
        assert one.status_code == 200
        assert engine.params[-1].seed == engine.params[-2].seed


async def test_prefill_is_the_prompts_scoring(client: httpx.AsyncClient, tok: HFTokenizer,
                                              fake_engine: FakeEngine) -> None:
    ids = tok.encode("Say hi to me")
    r = await client.post("/generate", json={"inputs": ids, "parameters": {
        "decoder_input_details": True, "max_new_tokens": 1}})
    prefill = r.json()["details"]["prefill"]
    assert [p["id"] for p in prefill] == ids
    assert [p["logprob"] for p in prefill] == [None] + [-1.0] * (len(ids) - 1)
    assert [p["text"] for p in prefill] == [tok.token_bytes(t).decode() for t in ids]
    assert fake_engine.params[-1].prompt_logprobs == 0


@pytest.mark.parametrize(("parameters", "message", "param"), [
    ({"temperature": 0}, "`temperature` must be strictly positive", "temperature"),
    ({"repetition_penalty": 0}, "`repetition_penalty` must be strictly positive",
     "repetition_penalty"),
    ({"frequency_penalty": 3}, "`frequency_penalty` must be >= -2.0 and <= 2.0",
     "frequency_penalty"),
    ({"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0", "top_p"),
    ({"typical_p": 1.0}, "`typical_p` must be > 0.0 and < 1.0", "typical_p"),
    ({"top_k": 0}, "`top_k` must be strictly positive", "top_k"),
    ({"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive", "max_new_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "`stop` supports up to 4 stop sequences. Given: 5",
     "stop"),
    ({"best_of": 2}, "you must use sampling when `best_of` is > 1", "best_of"),
    ({"best_of": 2, "do_sample": True, "seed": 1}, "`seed` must not be set when `best_of` > 1",
     "seed"),
    ({"best_of": 17, "do_sample": True}, "`best_of` must be > 0 and <= 16. Given: 17",
     "best_of"),
    ({"top_n_tokens": 21}, "`top_n_tokens` must be >= 0 and <= 20. Given: 21", "top_n_tokens"),
    ({"truncate": 0}, "`truncate` must be strictly positive and less than 2047. Given: 0",
     "truncate"),
    # what tokenwire cannot honour, refused by name
    ({"typical_p": 0.5}, "`typical_p` is not supported", "typical_p"),
    ({"watermark": True}, "`watermark` is not supported", "watermark"),
    ({"grammar": {"type": "regex", "value": "a+"}}, "a `regex` grammar is not supported",
     "grammar.type"),
])
async def test_validation_is_tgis(client: httpx.AsyncClient, parameters: dict[str, Any],
                                  message: str | None, param: str | None) -> None:
    r = await client.post("/generate", json={"inputs": "Hi you", "parameters": parameters})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error_type"] == "validation"
    assert body["error"].startswith(f"Input validation error: {message}"), body
    if param is not None:
        assert body["param"] == f"parameters.{param}"


async def test_lengths_are_tgis(client: httpx.AsyncClient, tok: HFTokenizer,
                                fake_engine: FakeEngine) -> None:
    """TGI counts at most 1024 of `max_new_tokens` against the context (its first chunk), and
    generates on to the context's end; `truncate` keeps the prompt's last ids."""
    long = " word" * 1100
    n = len(tok.encode(long))
    r = await client.post("/generate", json={"inputs": long,
                                             "parameters": {"max_new_tokens": 1000}})
    assert r.status_code == 422
    assert r.json()["error"] == ("Input validation error: `inputs` tokens + `max_new_tokens` "
                                 f"must be <= 2048. Given: {n} `inputs` tokens and 1000 "
                                 "`max_new_tokens`")
    r = await client.post("/generate", json={"inputs": long * 2})  # none left to generate
    assert r.json()["error"].endswith(f"Given: {2 * n} `inputs` tokens and 0 `max_new_tokens`")
    r = await client.post("/generate", json={"inputs": [42] * 2048})
    assert r.json()["error"] == ("Input validation error: `inputs` must have less than 2047 "
                                 "tokens. Given: 2048")
    r = await client.post("/generate", json={"inputs": [42] * 100, "parameters": {
        "max_new_tokens": 2000, "details": True}})
    assert r.status_code == 200 and fake_engine.params[-1].max_tokens == 2048 - 100
    r = await client.post("/generate", json={"inputs": long * 2, "parameters": {
        "truncate": 3, "max_new_tokens": 1, "details": True, "decoder_input_details": True}})
    assert [p["id"] for p in r.json()["details"]["prefill"]] == tok.encode(long * 2)[-3:]
    assert r.json()["details"]["finish_reason"] == "length"


async def test_bad_bodies_and_inputs(client: httpx.AsyncClient, tok: HFTokenizer) -> None:
    for body, param in [({"inputs": ""}, "inputs"), ({"inputs": []}, "inputs"),
                        ({"inputs": [1, tok.vocab_size]}, "inputs[1]"),
                        ({"inputs": "Hi", "parameters": {"seed": -1}}, "parameters.seed"),
                        ({"inputs": "Hi", "parameters": {"stop": None}}, "parameters.stop"),
                        ({"inputs": "Hi", "parameters": {"nope": 1}}, "parameters.nope"),
                        ({"parameters": {}}, "inputs"),
                        ({"inputs": "Hi", "model": "nope"}, "model"),
                        ({"inputs": "Hi", "parameters": {"adapter_id": "nope"}},
                         "parameters.adapter_id")]:
        r = await client.post("/generate", json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["error_type"] == "validation" and r.json()["param"] == param, body
    r = await client.post("/generate", json={"inputs": "Hi", "model": MODEL,
                                             "parameters": {"max_new_tokens": 1}})
    assert r.status_code == 200


async def test_a_stream_refuses_in_band(client: httpx.AsyncClient,
                                        fake_engine: FakeEngine) -> None:
    for parameters, message in [
        ({"best_of": 2, "do_sample": True},
         "`best_of` != 1 is not supported when streaming tokens"),
        ({"best_of": 0}, "`best_of` != 1 is not supported when streaming tokens"),
        ({"decoder_input_details": True},
         "`decoder_input_details` == true is not supported when streaming tokens"),
        ({"temperature": -1}, "`temperature` must be strictly positive"),
    ]:
        [event] = frames(await client.post("/generate_stream", json={
            "inputs": "Hi", "parameters": parameters}))
        assert event["error"] == f"Input validation error: {message}"
        assert event["error_type"] == "validation"
    fake_engine.refuse = RateLimitError("the queue is full")
    [event] = frames(await client.post("/", json={"inputs": "Hi", "stream": True}))
    assert event["error_type"] == "overloaded"
    r = await client.post("/generate", json={"inputs": "Hi"})
    assert r.status_code == 429 and r.json()["error_type"] == "overloaded"
    fake_engine.refuse = None
    # a failure mid-stream: the tokens sent, then TGI's generation error
    fake_engine.fail_after = 2
    events = frames(await client.post("/generate_stream", json={"inputs": "Hi"}))
    assert [e.get("index") for e in events] == [1, 2, None]
    assert events[-1]["error_type"] == "generation"
    assert events[-1]["error"].startswith("Request failed during generation: ")


async def test_control_tokens_in_text_are_the_raw_prompt_rule(make_app, gguf_info,  # type: ignore[no-untyped-def]
                                                              registry, tmp_path,
                                                              tok: HFTokenizer,
                                                              fake_engine: FakeEngine) -> None:
    """Text is encoded as TGI's tokenizer does (control-token strings parsed, the BOS first
    where the model adds one): control ids are a raw prompt's, refused where raw prompts are;
    the BOS the server adds is not the client's."""
    from tokenwire.api.app import create_app
    from tokenwire.config import Settings
    from tokenwire.serving.loader import load_template
    from tokenwire.serving.models import ModelRegistry, ServedModel

    settings = Settings(tokenizer_store=tmp_path / "store", raw_prompts="deny")
    entry = registry.register(tok, aliases=[tok.family], chat_template=gguf_info.chat_template,
                              bos_id=gguf_info.bos_id, eos_id=gguf_info.eos_id)
    models = ModelRegistry()
    models.add(ServedModel(id=MODEL, engine=fake_engine, tokenizer_entry=entry,
                           template=load_template(settings, gguf_info)))
    async with serve_in_process(make_app(raw_prompts="allow")) as c:
        r = await c.post("/generate", json={"inputs": "<|im_start|>user\nHi",
                                            "parameters": {"max_new_tokens": 1}})
        assert r.status_code == 200
        assert fake_engine.prompts[-1] == tok.encode("<|im_start|>user\nHi",
                                                     parse_special=True)
    entry.add_bos = True  # as a model whose tokenizer adds one (Gemma's)
    async with serve_in_process(create_app(settings, models=models, tokenizers=registry)) as c:
        r = await c.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 1}})
        assert r.status_code == 200, r.text
        assert fake_engine.prompts[-1] == [gguf_info.bos_id, *tok.encode("Hi")]
        r = await c.post("/generate", json={"inputs": "<|im_start|>user\nHi"})
        assert r.status_code == 422 and r.json()["code"] == "special_token_not_allowed"
        assert r.json()["param"] == "inputs"
        r = await c.post("/generate", json={"inputs": [gguf_info.bos_id, 9690]})
        assert r.status_code == 422 and r.json()["param"] == "inputs[0]"


async def test_errors_are_tgis_shape_on_its_routes(make_app) -> None:  # type: ignore[no-untyped-def]
    async with serve_in_process(make_app(api_keys=["sk-test"])) as c:
        for path in ("/", "/generate", "/generate_stream"):
            r = await c.post(path, json={"inputs": "Hi"})
            assert r.status_code == 401
            assert r.json()["error_type"] == "invalid_api_key" and "error" in r.json()
        r = await c.get("/generate", headers={"Authorization": "Bearer sk-test"})
        assert r.status_code == 405 and r.json()["error_type"] == "method_not_allowed"
        r = await c.post("/generate", content=b"{", headers={"Authorization": "Bearer sk-test"})
        assert r.status_code == 422 and r.json()["error_type"] == "validation"
        # the other routes keep OpenAI's
        r = await c.post("/v1/completions", json={})
        assert r.json()["error"]["code"] == "invalid_api_key"


async def test_the_document_describes_the_routes(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    root = document["paths"]["/"]["post"]
    assert root["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/TGIErrorResponse"}
    event = root["responses"]["200"]["content"]["text/event-stream"]["schema"]
    assert "[DONE]" not in json.dumps(event["properties"]["data"].get("anyOf", []))
    schemas = document["components"]["schemas"]
    assert "inputs" in schemas["TGIGenerateRequest"]["properties"]
    assert schemas["TGICompatResponse"]["type"] == "array"
