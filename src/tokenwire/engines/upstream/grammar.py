"""Grammars in the upstreams' spelling: a lazy grammar as a `structural_tag` (vLLM, SGLang)."""

from __future__ import annotations

import json

from ...errors import UnsupportedParameterError
from ..base import Grammar

__all__ = ["structural_tag"]


def structural_tag(grammar: Grammar) -> str:
    """A lazy grammar as vLLM's and SGLang's `structural_tag` (the legacy shape both read:
    `vllm/sampling_params.py` StructuredOutputsParams, SGLang's sampling_params.py): free text
    until a trigger, then one of the structures (`begin`, a value of `schema`, `end`)."""
    if not grammar.tags:
        raise UnsupportedParameterError(
            "this upstream takes lazy grammars only as structural tags", param="tool_choice")
    return json.dumps({
        "type": "structural_tag",
        "structures": [{"begin": t.begin, "schema": json.loads(t.schema), "end": t.end}
                       for t in grammar.tags],
        "triggers": list(grammar.triggers),
    }, ensure_ascii=False)
