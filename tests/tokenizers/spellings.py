"""Other spellings of SmolLM2's tokenizer.json: what `transformers` writes for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["DIGITS_THEN_BYTE_LEVEL", "TRANSFORMERS_PRE", "respell", "respelled"]

#: how `transformers` writes SmolLM2's tokenizer.json when it converts the GGUF
#: (`AutoTokenizer.from_pretrained(..., gguf_file=...).save_pretrained(...)`, copied verbatim)
TRANSFORMERS_PRE = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True}
TRANSFORMERS_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True}
TRANSFORMERS_POST = {"type": "TemplateProcessing",
                     "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                     "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                              {"Sequence": {"id": "B", "type_id": 1}}],
                     "special_tokens": {}}
#: SmolLM2's own pre-tokenizer as a Hugging Face file spells it: single digits, then GPT-2's
#: byte-level split (llama.cpp's `smollm`, which our GGUF-built file spells with two `Split`s)
DIGITS_THEN_BYTE_LEVEL = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True}, TRANSFORMERS_PRE]}


def respell(spec: dict[str, Any], pre_tokenizer: dict[str, Any]) -> dict[str, Any]:
    """A tokenizer.json (parsed) as `transformers` spells it (decoder, post-processor, "" for
    null), with `pre_tokenizer`: `DIGITS_THEN_BYTE_LEVEL` keeps the tokenizer SmolLM2's,
    `TRANSFORMERS_PRE` makes it what `transformers` converts the GGUF into."""
    spec = json.loads(json.dumps(spec))
    spec.update(pre_tokenizer=pre_tokenizer, decoder=TRANSFORMERS_DECODER,
                post_processor=TRANSFORMERS_POST)
    spec["model"].update(continuing_subword_prefix="", end_of_word_suffix="")
    return spec


def respelled(d: Path, pre_tokenizer: dict[str, Any]) -> Path:
    """`respell` on a directory's tokenizer.json (written indented, as transformers does)."""
    spec = respell(json.loads((d / "tokenizer.json").read_text()), pre_tokenizer)
    (d / "tokenizer.json").write_text(json.dumps(spec, indent=2))
    return d
