"""A `Grammar`'s tagged spans in xgrammar's `structural_tag` JSON: what vLLM and SGLang read
(both compile it with xgrammar), and what the render endpoint shows as the request's
`structured_outputs` (serving/chat_render.py)."""

from __future__ import annotations

import json
from typing import Any

from ..base import Grammar, StructuralTag

__all__ = ["structural_tag"]


def _tag(t: StructuralTag) -> dict[str, Any]:
    return {"type": "tag", "begin": t.begin, "end": t.end,
            "content": {"type": "json_schema", "json_schema": json.loads(t.schema)}}


def structural_tag(grammar: Grammar) -> str:
    """Tagged spans as vLLM's and SGLang's `structural_tag`. Hermes-shaped calls (a newline
    apart, no section) when lazy: the legacy shape both read (vllm/sampling_params.py
    StructuredOutputsParams, SGLang's sampling_params.py): free text until a trigger, then the
    structures. Otherwise xgrammar's `format` shape (xgrammar/structural_tag.py, as its builtin
    tags for each family spell them): tags `separator` apart, at least one (only one unless
    `parallel`), inside a `tag` for a section; lazy: `triggered_tags` around them."""
    if grammar.lazy and grammar.section == ("", "") and grammar.separator == "\n":
        return json.dumps({
            "type": "structural_tag",
            "structures": [{"begin": t.begin, "schema": json.loads(t.schema), "end": t.end}
                           for t in grammar.tags],
            "triggers": list(grammar.triggers),
        }, ensure_ascii=False)
    calls: dict[str, Any] = {
        "type": "tags_with_separator", "tags": [_tag(t) for t in grammar.tags],
        "separator": grammar.separator, "at_least_one": True,
        "stop_after_first": not grammar.parallel}
    opening, closing = grammar.section
    if opening or closing:
        calls = {"type": "tag", "begin": opening, "content": calls, "end": closing}
    if grammar.lazy:
        calls = {"type": "triggered_tags", "triggers": list(grammar.triggers),
                 "tags": [calls] if opening else calls["tags"],
                 "stop_after_first": not grammar.parallel}
    return json.dumps({"type": "structural_tag", "format": calls}, ensure_ascii=False)
