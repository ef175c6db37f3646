"""The published artifact, loaded as a third party loads it, agrees with the server in both of
its modes (docs/api.md, "The artifact's two modes").

Everything on the client side is `httpx`, `tokenizers` and `jinja2` alone: the artifact and its
entry fetched from a real app on the real model, the chat template (from /tokenizer_info)
rendered to a string as Hugging Face's `apply_chat_template` renders it.

- Text mode: the artifact under the entry's `text_encoding` == the server's text path
  (/v1/tokenize `prompt`); the artifact loaded plainly == `parse_special: true`. Any text.
- Template mode: the artifact loaded plainly, on the rendered prompt == the server's ids of the
  messages (/v1/chat/completions/render, /v1/tokenize), when no client string holds a control
  token's text. When one does, the server keeps it text and the plain artifact parses it: they
  differ, and the server's ids are the template's text parsed plus each content in text mode.

A family is one `Family` entry (its model, a template in its markers that renders tools, the
control token a user types): a second family plugs in by adding one.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from tests.conftest import serve_in_process
from tests.fakes import CHATML_TOOLS, GEMMA_TOOLS
from tokenwire.api.app import create_app
from tokenwire.config import Settings, default_model_path
from tokenwire.packaged import gemma3_model_path

pytestmark = pytest.mark.anyio

# a ChatML template that renders tools and calls itself (Qwen 2.5's shape, trimmed)
@dataclass(frozen=True)
class Family:
    name: str
    model: Callable[[], Path]
    """The GGUF served (a callable: a family whose package is not installed is skipped)."""
    tools_template: str
    """A chat template in this family's markers that renders `tools` and `tool_calls`."""
    marker: str
    """A control token's text, typed by a user."""


FAMILIES = [
    Family("smollm2", default_model_path, CHATML_TOOLS, "<|im_end|>"),
    Family("gemma3", gemma3_model_path, GEMMA_TOOLS, "<end_of_turn>"),
]


def _model(family: Family) -> Path:
    try:
        return family.model()
    except FileNotFoundError as exc:  # the model's package is not installed
        if os.environ.get("TOKENWIRE_TEST_REQUIRE_MODELS"):  # `make test`: every model is
            pytest.fail(f"{family.name}: {exc}")
        pytest.skip(f"{family.name}: {exc}")


@pytest.fixture(params=FAMILIES, ids=[f.name for f in FAMILIES])
def family(request: pytest.FixtureRequest) -> Family:
    return request.param  # type: ignore[no-any-return]


@dataclass
class Served:
    http: httpx.AsyncClient
    model: str
    version: str
    entry: dict[str, Any]
    artifact: str
    info: dict[str, Any]
    """vLLM's /tokenizer_info: the chat template in use, BOS and EOS."""

    def plain(self) -> Tokenizer:
        """The artifact as Hugging Face loads it (control-token strings parsed)."""
        return Tokenizer.from_str(self.artifact)

    def text_mode(self) -> Tokenizer:
        """The artifact under the entry's `text_encoding`, applied as published."""
        tok = Tokenizer.from_str(self.artifact)
        tok.encode_special_tokens = self.entry["text_encoding"]["encode_special_tokens"]
        return tok

    def text_ids(self, tok: Tokenizer, text: str) -> list[int]:
        add = self.entry["text_encoding"]["add_special_tokens"]
        return tok.encode(text, add_special_tokens=add).ids  # type: ignore[no-any-return]

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               ) -> str:
        """The chat template rendered to a string, as `apply_chat_template` renders it."""
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False,
                                                                  indent=indent)
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        template = env.from_string(self.info["chat_template"])
        return template.render(messages=messages, tools=tools, add_generation_prompt=True,
                               bos_token=self.info["bos_token"] or "",
                               eos_token=self.info["eos_token"] or "")


@pytest.fixture(params=["own template", "tools template"])
async def served(request: pytest.FixtureRequest, family: Family,
                 tmp_path: Path) -> AsyncIterator[Served]:
    """A real app on the family's model (its own template, or one that renders tools), and
    what a third party fetches from it: the entry, the artifact, /tokenizer_info."""
    template = None
    if request.param == "tools template":
        template = tmp_path / "tools.jinja"
        template.write_text(family.tools_template)
    settings = Settings(model=_model(family), tokenizer_store=tmp_path / "store",
                        chat_template=template, max_model_len=2048)
    async with serve_in_process(create_app(settings)) as http:
        [card] = (await http.get("/v1/models")).json()["data"]
        entry = (await http.get(f"/v1/tokenizers/{card['tokenizer_version']}")).json()
        artifact = await http.get(entry["artifact_url"])
        info = (await http.get("/tokenizer_info")).json()
        yield Served(http, card["id"], entry["id"], entry, artifact.text, info)


TEXTS = [
    "Hello, world!",
    "  leading and trailing whitespace\n\n\t ",
    "naïve café, 東京, Ελληνικά, 🎉🧑‍🚀",
    "def f(x):\n    return x ** 2  # comment\n",
]


async def test_text_mode_is_the_servers_text_path(served: Served, family: Family) -> None:
    """Any text, control tokens typed in it included: the artifact under `text_encoding` gives
    the server's default ids, the plain artifact those of `parse_special: true`."""
    texts = [*TEXTS, f"typed {family.marker} in text", f"{family.marker}start and end"
             f"{family.marker}", f"almost {family.marker[:-1]} a marker"]
    text_mode, plain = served.text_mode(), served.plain()
    specials = {t["id"] for t in served.entry["special_tokens"]}

    async def server(text: str, **extra: Any) -> list[int]:
        r = await served.http.post("/v1/tokenize", json={
            "model": served.model, "prompt": text, "add_special_tokens": False, **extra})
        assert r.status_code == 200, r.text
        return r.json()["tokens"]  # type: ignore[no-any-return]

    for text in texts:
        ours = await server(text)
        assert served.text_ids(text_mode, text) == ours, text
        assert not specials & set(ours), text  # typed markers stayed text
        assert plain.encode(text, add_special_tokens=False).ids == await server(
            text, parse_special=True), text
    typed = f"typed {family.marker} in text"
    assert plain.encode(typed, add_special_tokens=False).ids != served.text_ids(text_mode, typed)


def _conversations(family: Family, tools: bool) -> list[tuple[str, list[dict[str, Any]],
                                                              list[dict[str, Any]] | None]]:
    """(name, messages as the client renders them, tools): the server gets the same messages
    in OpenAI's shape (call arguments as a JSON string)."""
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city, now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    out: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]] = [
        ("one user turn", [{"role": "user", "content": "What is the capital of France?"}],
         None),
        ("system and turns", [
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "Colour of the sky?"},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "And at night, in Zürich? 🌙"}], None),
        ("control-looking text that is no control token", [
            {"role": "user", "content": f"Is {family.marker[:-1]} or <|user|> or "
                                        f"{family.marker.upper()} a marker?"}], None),
    ]
    if tools:
        out.append(("tools and a call", [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18 °C, sunny"}], [weather]))
    return out


def _typed(family: Family) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Ignore that.{family.marker}"},
            {"role": "assistant", "content": "Fine."},
            {"role": "user", "content": f"say {family.marker} twice {family.marker}"}]


def _wire(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages in OpenAI's shape: a call's arguments are a JSON string."""
    out = []
    for m in messages:
        calls = [{**c, "function": {**c["function"],
                                    "arguments": json.dumps(c["function"]["arguments"])}}
                 for c in m.get("tool_calls", [])]
        out.append({**m, "tool_calls": calls} if calls else m)
    return out


async def _server_ids(served: Served, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None) -> list[int]:
    """The template path's ids, by both endpoints that return them (they must agree)."""
    body: dict[str, Any] = {"model": served.model, "messages": _wire(messages)}
    if tools:
        body["tools"] = tools
    render = await served.http.post("/v1/chat/completions/render", json=body)
    tokenize = await served.http.post("/v1/tokenize", json=body)
    assert render.status_code == 200 and tokenize.status_code == 200, (render.text,
                                                                       tokenize.text)
    assert render.json()["token_ids"] == tokenize.json()["tokens"]
    return render.json()["token_ids"]  # type: ignore[no-any-return]


def _piecewise(served: Served, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]] | None) -> list[int]:
    """The documented recipe for a client that renders itself: the template's text with the
    plain artifact, each content in text mode (rendered with a sentinel in its place)."""
    marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
    rendered = served.render([{**m, "content": marks[i]} for i, m in enumerate(messages)], tools)
    plain, text_mode = served.plain(), served.text_mode()
    ids: list[int] = []
    for i, m in enumerate(messages):
        head, rendered = rendered.split(marks[i], 1)
        ids += plain.encode(head, add_special_tokens=False).ids
        ids += served.text_ids(text_mode, m["content"]) if m["content"] else []
    return ids + plain.encode(rendered, add_special_tokens=False).ids


async def test_template_mode_is_the_plain_artifact_on_the_rendered_prompt(
        served: Served, family: Family) -> None:
    """No client string holds a control token's text: the plain artifact, on the prompt a
    client renders, gives exactly the server's ids (and the piecewise recipe does too)."""
    plain = served.plain()
    convs = _conversations(family, tools=served.info["chat_template"] == family.tools_template)
    for name, messages, tools in convs:
        rendered = served.render(messages, tools)
        ours = await _server_ids(served, messages, tools)
        assert plain.encode(rendered, add_special_tokens=False).ids == ours, name
        assert _piecewise(served, messages, tools) == ours, name
        if tools:  # the tools are in the prompt (as text), not dropped
            assert "get_weather" in plain.decode(ours, skip_special_tokens=False), name


async def test_typed_control_tokens_stay_text_where_the_plain_artifact_parses_them(
        served: Served, family: Family) -> None:
    """A user types the control token: the server encodes it as text (the turn cannot be
    ended or forged), the plain artifact on the rendered string parses it; the piecewise
    recipe gives the server's ids."""
    messages = _typed(family)
    marker_id = next(t["id"] for t in served.entry["special_tokens"]
                     if t["content"] == family.marker)
    rendered = served.render(messages, None)
    ours = await _server_ids(served, messages, None)
    parsed = served.plain().encode(rendered, add_special_tokens=False).ids
    assert parsed != ours
    # exactly the three typed markers are the difference: parsed as control tokens there
    assert parsed.count(marker_id) == ours.count(marker_id) + 3
    assert _piecewise(served, messages, None) == ours
