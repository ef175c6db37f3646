"""LoRA adapters in llama.cpp's GGUF adapter format, from a trainer's matrices.

A trainer holds, for each adapted linear layer of a Hugging Face Llama-family model, `A` (rank x
in) and `B` (out x rank), as PEFT does; the layer computes `W x + (alpha / rank) B A x`. llama.cpp
reads the same pair per tensor as `<gguf tensor>.lora_a` / `.lora_b` (convert_lora_to_gguf.py's
layout), with two differences this module makes: tensors carry llama.cpp's names, and the query
and key projections' output rows are permuted as llama.cpp's converter permutes the weights
themselves (its rotary embedding pairs dimensions differently from transformers').

Needs `gguf` (llama.cpp's own writer; `pip install tokenwire[rl]`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["GGUF_NAMES", "UNEMBED", "untie_gguf", "write_lora_gguf"]

GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
"""A Llama-family layer's linear modules (transformers' names) -> llama.cpp's tensor names."""

UNEMBED = "lm_head"
"""The output projection (transformers' name): llama.cpp's `output.weight`."""

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")


def _permute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's row order for a query or key projection (`LlamaModel.permute`)."""
    return (rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


def write_lora_gguf(path: str | Path, pairs: Mapping[str, tuple[np.ndarray, np.ndarray]], *,
                    alpha: float, n_head: int, n_head_kv: int,
                    architecture: str = "llama") -> Path:
    """Write the adapter: `pairs` maps a module's name (`model.layers.3.self_attn.q_proj`,
    any prefix) to its (A, B); `alpha`: the LoRA alpha (scale alpha / rank); `n_head`,
    `n_head_kv`: the model's attention and key-value heads."""
    import gguf  # the rl extra: only a trainer needs it

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_string(gguf.Keys.General.TYPE, gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    for name, (a, b) in sorted(pairs.items()):
        m = _LAYER.search(name)
        unembed = name.rsplit(".", 1)[-1] == UNEMBED
        if not unembed and (m is None or m.group(2) not in GGUF_NAMES):
            raise ValueError(f"{name!r} is not a Llama-family layer's linear module "
                             f"({', '.join(GGUF_NAMES)}) nor {UNEMBED}")
        a = np.ascontiguousarray(a, dtype=np.float32)
        b = np.asarray(b, dtype=np.float32)
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise ValueError(f"{name}: A {a.shape} and B {b.shape} are not a LoRA pair "
                             "(A: rank x in, B: out x rank)")
        if unembed:  # needs an output tensor of its own in the base (untie_gguf)
            base = "output.weight"
        else:
            assert m is not None
            layer, module = int(m.group(1)), m.group(2)
            if module == "self_attn.q_proj":
                b = _permute(b, n_head)
            elif module == "self_attn.k_proj":
                b = _permute(b, n_head_kv)
            base = f"blk.{layer}.{GGUF_NAMES[module]}.weight"
        writer.add_tensor(f"{base}.lora_a", a)
        writer.add_tensor(f"{base}.lora_b", np.ascontiguousarray(b))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def untie_gguf(src: str | Path, dst: str | Path) -> Path:
    """A copy of a model whose output layer is its token embeddings (no `output.weight`: llama.cpp
    then reads `token_embd.weight` twice) with `output.weight` a tensor of its own, the same
    quantized bytes: the same logits, and an unembedding LoRA has a tensor to adapt. The
    metadata and tensors are copied as gguf's own `gguf_new_metadata` script copies them."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    names = [t.name for t in reader.tensors]
    if "output.weight" in names or "token_embd.weight" not in names:
        raise ValueError(f"{src}: not a model with tied embeddings")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    tmp = Path(dst).with_name(Path(dst).name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), arch=arch, endianess=reader.endianess)
    alignment = reader.fields.get(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:  # the tensors' padding follows it, as gguf_new_metadata's does
        writer.data_alignment = int(alignment.contents())
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    tensors = [*reader.tensors, embd]
    for i, t in enumerate(tensors):
        name = "output.weight" if i == len(reader.tensors) else t.name
        writer.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    tmp.replace(dst)
    return Path(dst)
