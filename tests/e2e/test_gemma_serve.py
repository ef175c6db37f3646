"""`tokenwire serve --model <Gemma 3 GGUF>`: the second family served by the embedded engine,
a real process reached over real HTTP with the official openai client."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import TEST_UPSTREAM
from tests.upstreams import Upstream, free_port
from tokenwire.tokenizers.hf import HFTokenizer

# Run once, in the main pass: `gemma_server` is a `tokenwire serve --model <Gemma>` process of
# its own, never the gateway the later passes put in `live_server`, so each gateway pass started
# and asked the same server again (16-17 s each).
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(TEST_UPSTREAM), reason="embedded engines only: run once")]


@pytest.fixture(scope="module")
def gemma_server(gemma_path: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Upstream]:
    tmp = tmp_path_factory.mktemp("gemma")
    port = free_port()
    server = Upstream("tokenwire-gemma",
                      [sys.executable, "-m", "tokenwire", "serve", "--model", str(gemma_path),
                       "--port", str(port), "--n-parallel", "2"], port, tmp / "serve.log",
                      env={"TOKENWIRE_TOKENIZER_STORE": str(tmp / "store")}).start()
    yield server
    server.stop()


def test_gemma_answers_a_chat_request(gemma_server: Upstream, gemma_tok: HFTokenizer) -> None:
    client = openai.OpenAI(base_url=f"{gemma_server.url}/v1", api_key="unused")
    (model,) = client.models.list().data
    r = client.chat.completions.create(
        model=model.id, messages=[{"role": "user", "content": "  Say hello.  "}], max_tokens=8,
        temperature=0, extra_body={"return_token_ids": True})
    extra = r.model_extra or {}
    assert extra["tokenizer_version"] == gemma_tok.version
    # the prompt the engine saw: Gemma's turns, the content trimmed, no dummy prefix
    assert gemma_tok.decode(extra["prompt_token_ids"]) == \
        "<bos><start_of_turn>user\nSay hello.<end_of_turn>\n<start_of_turn>model\n"
    choice = r.choices[0]
    ids = (choice.model_extra or {})["token_ids"]
    assert 0 < len(ids) <= 8
    assert choice.message.content == gemma_tok.decode(ids)


def test_gemma_tokenizer_is_published(gemma_server: Upstream, gemma_tok: HFTokenizer) -> None:
    listed = httpx.get(f"{gemma_server.url}/v1/tokenizers").json()
    assert gemma_tok.version in str(listed)
    body = httpx.post(f"{gemma_server.url}/v1/tokenize",
                      json={"tokenizer_version": gemma_tok.version, "prompt": "Hello world",
                            "add_special_tokens": False}).json()
    assert body["tokens"] == gemma_tok.encode("Hello world")
    assert body["tokenizer_version"] == gemma_tok.version
