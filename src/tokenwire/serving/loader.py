"""Load the served models: each its pinned tokenizer version, its engine (chosen by name), its
chat template. The one place where an engine is chosen and started.

The tokenizer comes from the model's own files (the GGUF, or the upstream model's Hugging Face
directory); the engine checks its ids against that tokenizer when it starts, and refuses to
serve on any difference (a gateway's clients would get ids that mean something else).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from ..config import Settings
from ..engines.factories import create_engine
from ..engines.spec import EngineSpec
from ..tokenizers.base import Tokenizer
from ..tokenizers.hf import HFTokenizer
from ..tokenizers.registry import TokenizerRegistry
from ..tokenizers.source import TokenizerSource, load_tokenizer
from .models import ServedModel
from .reasoning import ReasoningFormat, reasoning_format
from .template import ChatTemplate
from .toolcalls import HERMES, ToolFormat, tool_format

__all__ = ["load_model", "load_models", "load_template"]

log = logging.getLogger(__name__)


async def _eog_ids(source: TokenizerSource, settings: Settings) -> frozenset[int]:
    if source.eog_ids is not None:
        return source.eog_ids
    if settings.engine == "embedded":  # its engine process says (`EngineInfo.eog_ids`)
        return frozenset()
    # a GGUF: llama.cpp's own rules decide which ids end generation (also for llama-server)
    from ..engines.llamacpp.model import vocab_eog_ids

    return await asyncio.to_thread(vocab_eog_ids, settings.tokenizer_path())


def load_template(settings: Settings, source: TokenizerSource) -> ChatTemplate | None:
    """The model's own chat template, or the file `settings.chat_template` names instead."""
    text = source.chat_template
    if settings.chat_template is not None:
        text = settings.chat_template.read_text()
    if not text:
        return None
    return ChatTemplate(text, source.tokenizer, bos_id=source.bos_id, eos_id=source.eos_id,
                        add_bos=source.add_bos)


async def load_model(settings: Settings, tokenizers: TokenizerRegistry) -> ServedModel:
    path = settings.tokenizer_path()
    source = await asyncio.to_thread(load_tokenizer, path)
    tok = source.tokenizer
    # (the id an earlier release gave it stays addressable: data stored then names it)
    entry = tokenizers.register(tok, aliases=[tok.family], chat_template=source.chat_template,
                                bos_id=source.bos_id, eos_id=source.eos_id,
                                add_bos=source.add_bos,
                                legacy=[source.legacy_version] if source.legacy_version else [])
    stored = entry.tokenizer
    # the store had this version: one copy (~40 MB), not two (the engines take the concrete
    # tokenizer, whose pre-tokenizer they read; the store holds only those)
    if stored is not tok and isinstance(stored, HFTokenizer):
        source = dataclasses.replace(source, tokenizer=stored)
    engine = create_engine(settings.engine,
                           EngineSpec(settings, source, await _eog_ids(source, settings)))
    try:
        await engine.start()
    except BaseException:
        await engine.aclose()
        raise
    template = load_template(settings, source)
    name = settings.served_model_name or engine.info.model
    log.info("serving %r on the %s engine with tokenizer %s (from %s)", name, settings.engine,
             tok.version, path.name)
    return ServedModel(id=name, engine=engine, tokenizer_entry=entry, template=template,
                       reasoning=_reasoning(settings, template, stored),
                       tools=_tools(settings, template))


def _reasoning(settings: Settings, template: ChatTemplate | None,
               tokenizer: Tokenizer) -> ReasoningFormat | None:
    if settings.reasoning_parser == "none":
        return None
    name = None if settings.reasoning_parser == "auto" else settings.reasoning_parser
    fmt = reasoning_format(template.source if template is not None else None, tokenizer, name)
    if fmt is not None:
        log.info("reasoning parser %s: %r ... %r, as %s", fmt.name, fmt.start, fmt.end,
                 "ids" if fmt.end_id is not None else "text")
    return fmt


def _tools(settings: Settings, template: ChatTemplate | None) -> ToolFormat | None:
    name = None if settings.tool_call_parser == "auto" else settings.tool_call_parser
    source = template.source if template is not None else None
    fmt = tool_format(source, name)
    if fmt is None and not (template is not None and template.renders_tools):
        fmt = HERMES  # the default format, which tokenwire renders itself
    log.info("tool calls: %s", fmt.name if fmt is not None else
             "refused (the chat template writes them in a format not parsed here)")
    return fmt


async def load_models(settings: Settings, tokenizers: TokenizerRegistry) -> list[ServedModel]:
    """Every configured model, each on its own engine with its own settings (in order: a
    model that cannot start closes those already started)."""
    loaded: list[ServedModel] = []
    try:
        for model_settings in settings.model_settings():
            loaded.append(await load_model(model_settings, tokenizers))
    except BaseException:
        for m in loaded:
            await m.engine.aclose()
        raise
    return loaded
