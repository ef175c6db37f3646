"""A served model's LoRA policy in torch, as Tinker's `create_lora_training_client` makes it:
the base weights frozen (a Hugging Face directory of the same model the engine serves), a
LoRA pair on each attention and/or MLP projection, trained with AdamW.

The adapter leaves as llama.cpp's GGUF LoRA (`lora.write_lora_gguf`) for the embedded engine.
An unembedding LoRA (`train_unembed`, the SDK's default) adapts the output projection alone,
also where the model ties it to its token embeddings (SmolLM2): the embeddings stay as they
are, and the engine then serves a copy of the model with an output tensor of its own
(`lora.untie_gguf`) for the adapter to apply to.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .lora import UNEMBED, write_lora_gguf

__all__ = ["ALPHA", "LoraLinear", "LoraSpec", "Policy"]

ALPHA = 32.0
"""The LoRA alpha (scale alpha / rank); Tinker's API has no field for it."""

_ATTN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@dataclass(frozen=True)
class LoraSpec:
    """Tinker's `LoraConfig`."""

    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


class LoraLinear(torch.nn.Module):
    """`W x + (alpha / rank) B A x`, W frozen; B starts at zero, so a new adapter is the base."""

    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float, gen: torch.Generator):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        a = torch.empty(rank, base.in_features)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=gen)
        self.lora_a = torch.nn.Parameter(a)
        self.lora_b = torch.nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scale
        return out


class Policy:
    """The base model with its adapters, and the optimizer over them."""

    def __init__(self, model_dir: Path, spec: LoraSpec):
        from transformers import AutoModelForCausalLM  # the rl extra

        self.spec = spec
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.requires_grad_(False)
        self.model.eval()  # type: ignore[no-untyped-call]  # no dropout: the same ids give the same logprobs
        gen = torch.Generator().manual_seed(spec.seed if spec.seed is not None else
                                            int(torch.seed() % 2**31))
        targets = (_ATTN if spec.train_attn else ()) + (_MLP if spec.train_mlp else ())
        self.adapters: dict[str, LoraLinear] = {}
        for i, layer in enumerate(self.model.model.layers):
            for target in targets:
                parent_name, name = target.split(".")
                parent = getattr(layer, parent_name)
                lora = LoraLinear(getattr(parent, name), spec.rank, ALPHA, gen)
                setattr(parent, name, lora)
                self.adapters[f"model.layers.{i}.{target}"] = lora
        if spec.train_unembed:
            self.model.lm_head = LoraLinear(self.model.lm_head, spec.rank, ALPHA, gen)
            self.adapters[UNEMBED] = self.model.lm_head
        self.max_len = int(self.model.config.max_position_embeddings)
        self.vocab_size = int(self.model.config.vocab_size)
        self.params = [p for a in self.adapters.values() for p in (a.lora_a, a.lora_b)]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, betas=(0.9, 0.95),
                                           eps=1e-12, weight_decay=0.0)

    def target_logprobs(self, batch: list[tuple[torch.Tensor, torch.Tensor]]
                        ) -> list[torch.Tensor]:
        """For each (tokens, targets): log p(targets[i] | tokens[:i + 1]) at each position.
        One forward pass for the batch, padded on the right: a causal model's real positions
        never see the padding after them."""
        width = max(len(t) for t, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, (tokens, _) in enumerate(batch):
            ids[row, :len(tokens)], mask[row, :len(tokens)] = tokens, 1
        logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
        return [torch.log_softmax(logits[row, :len(t)], dim=-1).gather(1, y[:, None])[:, 0]
                for row, (t, y) in enumerate(batch)]

    def grads(self) -> list[torch.Tensor | None]:
        return [None if p.grad is None else p.grad.clone() for p in self.params]

    def set_grads(self, grads: list[torch.Tensor | None]) -> None:
        for p, g in zip(self.params, grads, strict=True):
            p.grad = g

    def step(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
             grad_clip_norm: float) -> dict[str, float]:
        """One AdamW step on the gradients summed since the last one, then cleared."""
        if all(p.grad is None for p in self.params):
            return {"grad_norm:mean": 0.0}
        norm = float(torch.nn.utils.clip_grad_norm_(
            self.params, grad_clip_norm if grad_clip_norm > 0 else float("inf")))
        for group in self.optimizer.param_groups:
            group.update(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm:mean": norm}

    def state(self, optimizer: bool = True) -> dict[str, Any]:
        state: dict[str, Any] = {"spec": asdict(self.spec), "alpha": ALPHA,
                                 "adapters": {name: (a.lora_a.detach().clone(),
                                                     a.lora_b.detach().clone())
                                              for name, a in self.adapters.items()}}
        if optimizer:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load(self, state: dict[str, Any], optimizer: bool) -> None:
        """The checkpoint's adapter (and AdamW's moments, or fresh ones): checked whole before
        anything is copied, so a checkpoint that does not fit changes nothing."""
        saved = state["adapters"]
        if set(saved) != set(self.adapters):
            raise ValueError("it adapts other layers than this model")
        for name, (a, b) in saved.items():
            mine = self.adapters[name]
            if a.shape != mine.lora_a.shape or b.shape != mine.lora_b.shape:
                raise ValueError(f"{name}: rank {a.shape[0]}, this model's {mine.lora_a.shape[0]}")
        if optimizer and "optimizer" not in state:
            raise ValueError("it holds no optimizer state")
        fresh = torch.optim.AdamW(self.params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12,
                                  weight_decay=0.0)
        if optimizer:
            fresh.load_state_dict(state["optimizer"])
        with torch.no_grad():
            for name, (a, b) in saved.items():
                self.adapters[name].lora_a.copy_(a)
                self.adapters[name].lora_b.copy_(b)
        self.optimizer = fresh

    @property
    def unembeds(self) -> bool:
        return UNEMBED in self.adapters

    def write_gguf(self, path: Path) -> Path:
        """The adapter as llama.cpp's GGUF LoRA, for the embedded engine (with an unembedding
        pair, for a base with an output tensor of its own)."""
        config = self.model.config
        pairs = {name: (a.lora_a.detach().numpy(), a.lora_b.detach().numpy())
                 for name, a in self.adapters.items()}
        return write_lora_gguf(path, pairs, alpha=ALPHA, n_head=config.num_attention_heads,
                               n_head_kv=config.num_key_value_heads)
