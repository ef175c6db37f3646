"""The engine tests' shared fixtures."""

from __future__ import annotations

import pytest

from tokenwire.serving.template import ChatTemplate, TemplateMessage
from tokenwire.tokenizers.source import TokenizerSource


@pytest.fixture(scope="session")
def prompt_of(gguf_info: TokenizerSource):  # type: ignore[no-untyped-def]
    tok = gguf_info.tokenizer
    assert gguf_info.chat_template
    tmpl = ChatTemplate(gguf_info.chat_template, tok, bos_id=gguf_info.bos_id,
                        eos_id=gguf_info.eos_id, add_bos=gguf_info.add_bos)

    def prompt(question: str) -> list[int]:
        return tmpl.render([TemplateMessage("user", tok.encode(question))]).ids

    return prompt
