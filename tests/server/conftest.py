from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.fakes import FakeEngine
from tokenwire.config import Settings
from tokenwire.server.app import create_app
from tokenwire.serving.models import ModelRegistry, ServedModel
from tokenwire.serving.template import ChatTemplate
from tokenwire.tokenizers.gguf import GGUFTokenizerInfo
from tokenwire.tokenizers.registry import TokenizerRegistry

MODEL = "fake-smollm2"


@pytest.fixture
def fake_engine(gguf_info: GGUFTokenizerInfo) -> FakeEngine:
    tok = gguf_info.tokenizer
    # "Bonjour à tous 🎉" then end-of-turn: multi-byte characters split across ids
    return FakeEngine(vocab_size=tok.vocab_size, eog_id=gguf_info.eos_id or 2,
                      script=tok.encode("Bonjour à tous 🎉 ça va?"))


@pytest.fixture
def registry(tmp_path: Path) -> TokenizerRegistry:
    return TokenizerRegistry(tmp_path / "store")


@pytest.fixture
def app(gguf_info: GGUFTokenizerInfo, fake_engine: FakeEngine, registry: TokenizerRegistry,
        tmp_path: Path):  # type: ignore[no-untyped-def]
    tok = gguf_info.tokenizer
    entry = registry.register(tok, aliases=[tok.family], chat_template=gguf_info.chat_template)
    assert gguf_info.chat_template is not None
    template = ChatTemplate(gguf_info.chat_template, tok, bos_id=gguf_info.bos_id,
                            eos_id=gguf_info.eos_id, add_bos=gguf_info.add_bos)
    models = ModelRegistry()
    models.add(ServedModel(id=MODEL, engine=fake_engine, tokenizer_entry=entry,
                           template=template))
    settings = Settings(tokenizer_store=tmp_path / "store")
    return create_app(settings, models=models, tokenizers=registry)


@pytest.fixture
async def client(app) -> AsyncIterator[httpx.AsyncClient]:  # type: ignore[no-untyped-def]
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            yield c
