"""Load a GGUF chat model: its tokenizer version (registered and stored), engine and template."""

from __future__ import annotations

import logging
from pathlib import Path

from ..config import Settings
from ..engines.llamacpp import LlamaCppEngine
from ..tokenizers.gguf import tokenizer_from_gguf
from ..tokenizers.registry import TokenizerRegistry
from .models import ServedModel, default_model_name
from .template import ChatTemplate

__all__ = ["TokenizerParityError", "load_gguf_model"]

log = logging.getLogger(__name__)

#: A spot check run at every start; tests/tokenizers runs the full corpus.
_PARITY_SAMPLE = (
    "Hello, world! 1234567 tokens",
    "  leading spaces\n\n\ttabs and\r\nnewlines  ",
    "héllo wörld – ünïcödé, 日本語, עברית, русский",
    "emoji 🎉👨‍👩‍👧 and <|im_start|>marker strings<|im_end|> typed as text",
    "def f(x):\n    return x ** 2  # comment\n",
)


class TokenizerParityError(RuntimeError):
    """The portable tokenizer disagrees with the engine's own: serving would mislead clients."""


async def load_gguf_model(path: Path, settings: Settings,
                          tokenizers: TokenizerRegistry) -> ServedModel:
    info = tokenizer_from_gguf(path)
    tok = info.tokenizer
    entry = tokenizers.register(tok, aliases=[tok.family], chat_template=info.chat_template,
                                bos_id=info.bos_id, eos_id=info.eos_id, add_bos=info.add_bos)
    name = settings.served_model_name or default_model_name(path)
    engine = LlamaCppEngine(path, model_id=name, max_model_len=settings.max_model_len,
                            n_parallel=settings.n_parallel, n_batch=settings.n_batch,
                            n_threads=settings.n_threads, max_queued=settings.max_queued)
    await engine.start()
    for text in _PARITY_SAMPLE:
        if engine.llama.tokenize(text) != tok.encode(text):
            await engine.aclose()
            raise TokenizerParityError(
                f"the portable tokenizer of {path.name} does not match llama.cpp on {text!r}"
            )
    template = None
    if info.chat_template:
        template = ChatTemplate(info.chat_template, tok, bos_id=info.bos_id,
                                eos_id=info.eos_id, add_bos=info.add_bos)
    log.info("serving %s as %r with tokenizer %s", path.name, name, tok.version)
    return ServedModel(id=name, engine=engine, tokenizer_entry=entry, template=template)
