"""Llama 3.1-3.3's JSON format: a call is `{"name": ..., "parameters": {...}}`, after
`<|python_tag|>` or alone, several `; ` apart (vLLM's `llama3_json` parser, which also reads
"arguments" for "parameters"; Meta's model card; xgrammar's `llama` structural tag)."""

from __future__ import annotations

import json

from .format import JSON_NAME, ToolFormat

__all__ = ["LLAMA3_JSON"]

LLAMA3_JSON = ToolFormat(
    name="llama3_json", sign='"parameters": ', triggers=("<|python_tag|>", '{"name"'),
    open_re=r"(?:<\|python_tag\|>)?\s*",
    head_re=r'\s*\{\s*"name"\s*:\s*' + JSON_NAME + r'\s*,\s*"(?:parameters|arguments)"\s*:\s*',
    tail_re=r"\s*\}", sep_re=r"\s*;\s*", close_re=None,
    begin=lambda name: f'{{"name": {json.dumps(name, ensure_ascii=False)}, "parameters": ',
    end="}", separator="; ")
