"""Tinker's built-in losses, token by token, as its docs define them (tinker-docs
"Loss Functions", and its PPO page): each returns the datum's loss (a sum over its tokens) and
the per-token outputs the SDK reads back (`logprobs`: the trainer's log-probability of each
target token; `elementwise_loss`).

`target` are the trainer's log-probabilities of `target_tokens`; the other tensors are the
datum's `loss_fn_inputs`, all of one length. The losses the SDK names that are not here
(`cispo`, `dro`, `gspo`, `stable_reinforce`, `custom`) are refused by name (`LOSSES`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

__all__ = ["CONFIG", "LOSSES", "Loss", "READS", "REQUIRED"]

Loss = Callable[[torch.Tensor, Mapping[str, torch.Tensor], Mapping[str, float]], torch.Tensor]
"""(target logprobs, loss_fn_inputs, loss_fn_config) -> the elementwise loss."""

PPO_CLIP = (0.8, 1.2)
"""Tinker's ratio bounds (1 - 0.2, 1 + 0.2), `clip_low_threshold` / `clip_high_threshold` in
loss_fn_config (or per token in loss_fn_inputs) to set others."""


def cross_entropy(target: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                  config: Mapping[str, float]) -> torch.Tensor:
    """Supervised: -(weights * logp). `weights` is 0 on the prompt, 1 on what is learnt."""
    return -(inputs["weights"] * target)


def _ratio(target: torch.Tensor, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """p_theta(x) / q(x): the trainer's probability over the sampler's (`logprobs`)."""
    return torch.exp(target - inputs["logprobs"])


def importance_sampling(target: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                        config: Mapping[str, float]) -> torch.Tensor:
    """REINFORCE corrected for the sampler: -(ratio * advantages)."""
    return -(_ratio(target, inputs) * inputs["advantages"])


def _bound(name: str, default: float, inputs: Mapping[str, torch.Tensor],
           config: Mapping[str, float]) -> torch.Tensor | float:
    if name in inputs:
        return inputs[name]
    return float(config.get(name, default))


def ppo(target: torch.Tensor, inputs: Mapping[str, torch.Tensor],
        config: Mapping[str, float]) -> torch.Tensor:
    """Clipped: -min(ratio * A, clip(ratio, low, high) * A), token by token."""
    ratio = _ratio(target, inputs)
    low = _bound("clip_low_threshold", PPO_CLIP[0], inputs, config)
    high = _bound("clip_high_threshold", PPO_CLIP[1], inputs, config)
    clipped = torch.clamp(ratio, low, high)  # type: ignore[arg-type]
    adv = inputs["advantages"]
    return -torch.minimum(ratio * adv, clipped * adv)


LOSSES: dict[str, Loss] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
}

REQUIRED: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
}
"""The loss_fn_inputs each loss reads (every one as long as the datum's model_input)."""

_CLIP = ("clip_low_threshold", "clip_high_threshold")

READS: dict[str, tuple[str, ...]] = {**REQUIRED, "ppo": (*REQUIRED["ppo"], *_CLIP)}
"""Every loss_fn_inputs name each loss reads (any other is refused by name)."""

CONFIG: dict[str, tuple[str, ...]] = {"cross_entropy": (), "importance_sampling": (),
                                      "ppo": _CLIP}
"""The loss_fn_config keys each loss reads."""
