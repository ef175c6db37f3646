"""Serving needs no more of a tokenizer than the `Tokenizer` protocol declares: the in-process
app serves a tokenizer that has exactly the protocol's members (the real one behind them)."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest

from tests.conftest import serve_in_process
from tests.fakes import MODEL, FakeEngine
from tokenwire.api.app import create_app
from tokenwire.config import Settings
from tokenwire.serving.models import ModelRegistry, ServedModel
from tokenwire.serving.template import ChatTemplate
from tokenwire.tokenizers.base import Tokenizer
from tokenwire.tokenizers.registry import TokenizerRegistry
from tokenwire.tokenizers.source import TokenizerSource

pytestmark = pytest.mark.anyio

MEMBERS = frozenset(n for n in vars(Tokenizer) if not n.startswith("_"))


class ProtocolOnly:
    """The protocol's members, delegated; any other member is missing, as on a tokenizer
    that implements the protocol and nothing else."""

    def __init__(self, inner: Tokenizer):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name not in MEMBERS:
            raise AttributeError(f"{name!r} is not a member of the Tokenizer protocol")
        return getattr(self._inner, name)


async def test_serving_needs_only_the_protocol(gguf_info: TokenizerSource, tmp_path: Any,
                                               fake_engine: FakeEngine) -> None:
    real = gguf_info.tokenizer
    tok: Any = ProtocolOnly(real)
    assert isinstance(tok, Tokenizer)
    registry = TokenizerRegistry(tmp_path / "store")
    entry = registry.register(tok, aliases=[real.family], chat_template=gguf_info.chat_template,
                              bos_id=gguf_info.bos_id, eos_id=gguf_info.eos_id,
                              add_bos=gguf_info.add_bos)
    assert gguf_info.chat_template is not None
    template = ChatTemplate(gguf_info.chat_template, tok, bos_id=gguf_info.bos_id,
                            eos_id=gguf_info.eos_id, add_bos=gguf_info.add_bos)
    models = ModelRegistry()
    models.add(ServedModel(id=MODEL, engine=fake_engine, tokenizer_entry=entry,
                           template=template))
    app = create_app(Settings(tokenizer_store=tmp_path / "store"), models=models,
                     tokenizers=registry)
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "Hi"},
        {"type": "input_tokens", "token_ids": real.encode(" there")}]}]
    async with serve_in_process(app) as c:
        info = (await c.get(f"/v1/tokenizers/{real.version}")).json()
        assert info["sha256"] == hashlib.sha256(real.artifact).hexdigest()
        assert {t["content"]: t["id"] for t in info["special_tokens"]} == real.special_tokens
        art = await c.get(f"/v1/tokenizers/{real.version}/tokenizer.json")
        assert art.content == real.artifact
        r = await c.post("/v1/tokenize", json={"model": MODEL, "messages": messages,
                                               "tokenizer_version": real.version})
        assert r.status_code == 200, r.text
        r2: httpx.Response = await c.post("/v1/chat/completions", json={
            "model": MODEL, "messages": messages, "tokenizer_version": real.version,
            "return_token_ids": True, "logprobs": True})
        assert r2.status_code == 200, r2.text
        data = r2.json()
        assert data["prompt_token_ids"] == r.json()["tokens"]
        assert data["choices"][0]["token_ids"] == fake_engine.script
        assert data["choices"][0]["message"]["content"] == real.decode(fake_engine.script)
        comp = await c.post("/v1/completions", json={
            "model": MODEL, "prompt": real.encode("Hello"), "tokenizer_version": real.version,
            "logprobs": 1, "echo": True})
        assert comp.status_code == 200, comp.text
