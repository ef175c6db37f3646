"""Mistral's formats (vLLM's `mistral` parser), both after the control token `[TOOL_CALLS]`:
- a JSON list, `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]` (Mistral 7B
  v0.3, Nemo: tokenizers before v11);
- each call its own, `[TOOL_CALLS]name[ARGS]{...}` (Mistral Small 3.2, Ministral 3, Magistral:
  v11 on; Small 3.2's template writes the call's id as `[CALL_ID]id` before `[ARGS]`).
Mistral's templates refuse call ids that are not 9 letters and digits: its calls get those."""

from __future__ import annotations

import json

from .format import JSON_NAME, ToolFormat, nine_char_id

__all__ = ["MISTRAL", "MISTRAL_ARGS"]

MISTRAL = ToolFormat(
    name="mistral", sign="[TOOL_CALLS]", triggers=("[TOOL_CALLS]",),
    open_re=r"\[TOOL_CALLS\]\s*\[",
    head_re=r'\s*\{\s*"name"\s*:\s*' + JSON_NAME + r'\s*,\s*"arguments"\s*:\s*',
    tail_re=r'\s*(?:,\s*"id"\s*:\s*"[^"]*"\s*)?\}', sep_re=r"\s*,", close_re=r"\s*\]",
    begin=lambda name: f'{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": ',
    end="}", separator=", ", section=("[TOOL_CALLS][", "]"), call_id=nine_char_id)

MISTRAL_ARGS = ToolFormat(
    name="mistral", sign="[ARGS]", triggers=("[TOOL_CALLS]",), open_re="",
    head_re=r"\[TOOL_CALLS\]\s*(?P<name>[^\[\]\s]+)(?:\[CALL_ID\]\s*[^\[\]\s]*)?\[ARGS\]",
    tail_re="", sep_re="",
    close_re=None, begin=lambda name: f"[TOOL_CALLS]{name}[ARGS]", end="", separator="",
    json_name=False, json_wrapped=False, call_id=nine_char_id)
