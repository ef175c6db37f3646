"""Where a pinned tokenizer comes from: a GGUF file, or a Hugging Face tokenizer directory.

A model served by an upstream (vLLM, SGLang, ...) is described by the files it was served from:
`tokenizer.json` (the id <-> bytes mapping, whose fingerprint is the version),
`tokenizer_config.json` (its chat template, BOS/EOS) or `chat_template.jinja`, and
`generation_config.json` (the end-of-generation ids the upstream stops on, as vLLM reads them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import TokenizerSourceError
from ._source import TokenizerSource, legacy_family
from .base import make_version
from .gguf import tokenizer_from_gguf
from .hf import HFTokenizer, canonical_json

__all__ = ["TokenizerSource", "TokenizerSourceError", "load_hf_dir", "load_tokenizer"]


def load_tokenizer(path: Path) -> TokenizerSource:
    """A GGUF file, a Hugging Face tokenizer directory, or a bare tokenizer.json."""
    if path.is_dir():
        return load_hf_dir(path)
    if path.suffix == ".gguf":
        return tokenizer_from_gguf(path)
    if path.suffix == ".json":
        return load_hf_dir(path.parent, tokenizer_json=path)
    raise TokenizerSourceError(f"{path}: expected a GGUF file, a tokenizer.json or a Hugging "
                               "Face tokenizer directory")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerSourceError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise TokenizerSourceError(f"{path}: expected a JSON object")
    return data


def _token_text(value: Any) -> str | None:
    """`"</s>"` or `{"content": "</s>", ...}` (both spellings occur in tokenizer_config.json)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(d: Path, config: dict[str, Any]) -> str | None:
    jinja = d / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    tmpl = config.get("chat_template")
    if isinstance(tmpl, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
        tmpl = named.get("default")
    return tmpl if isinstance(tmpl, str) else None


def _adds_bos(spec: dict[str, Any], bos: str | None) -> bool:
    """Does encoding with special tokens put BOS first (the post-processor's template)? That
    is what `add_special_tokens=True` does upstream, and what our text prompts mirror."""
    procs = [spec.get("post_processor") or {}]
    while procs:
        p = procs.pop()
        if p.get("type") == "Sequence":
            procs += p.get("processors", [])
        elif p.get("type") == "TemplateProcessing":
            first = (p.get("single") or [{}])[0]
            special = first.get("SpecialToken", {}).get("id") if isinstance(first, dict) else None
            return special is not None and special == bos
    return False


def load_hf_dir(d: Path, *, tokenizer_json: Path | None = None) -> TokenizerSource:
    art_path = tokenizer_json or d / "tokenizer.json"
    if not art_path.is_file():
        raise TokenizerSourceError(f"{d}: no tokenizer.json (tokenwire pins the fast-tokenizer "
                                   "file; convert a slow tokenizer with transformers first)")
    try:
        spec = json.loads(art_path.read_bytes())
    except ValueError as exc:
        raise TokenizerSourceError(f"{art_path}: not valid JSON ({exc})") from exc
    config = _read_json(d / "tokenizer_config.json")
    generation = _read_json(d / "generation_config.json")
    model_config = _read_json(d / "config.json")
    # the version (family included) comes from the tokenizer alone, never from the folder's
    # name: the same tokenizer as a GGUF's has the GGUF's version
    tok = HFTokenizer(canonical_json(spec))
    n_vocab = len(spec.get("model", {}).get("vocab", {})) + len(spec.get("added_tokens", []))
    base = d.name if tokenizer_json is None else art_path.stem

    def token_id(key: str) -> int | None:
        text = _token_text(config.get(key))
        return tok.special_id(text) if text is not None else None

    bos_id, eos_id = token_id("bos_token"), token_id("eos_token")
    eog: set[int] = set()
    gen_eos = generation.get("eos_token_id", model_config.get("eos_token_id"))
    for v in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
        if isinstance(v, int) and not isinstance(v, bool):
            eog.add(v)
    if eos_id is not None:
        eog.add(eos_id)
    context = model_config.get("max_position_embeddings")
    return TokenizerSource(
        tokenizer=tok,
        chat_template=_chat_template(d, config),
        bos_id=bos_id,
        eos_id=eos_id,
        add_bos=bool(config.get("add_bos_token", _adds_bos(spec, _token_text(
            config.get("bos_token"))))),
        context_length=context if isinstance(context, int) else None,
        name=d.name,
        eog_ids=frozenset(eog),
        legacy_version=make_version(legacy_family(base, n_vocab), tok.sha256),
    )
