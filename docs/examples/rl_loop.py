"""GRPO on SmolLM2-135M through tokenwire, on a CPU: both halves of an RL loop.

Rollouts come through tokenwire (n samples per prompt, the sampled ids with their logprobs, the
end of turn included, the render's loss mask, the version of the weights that sampled each
choice); the trainer (torch, on this machine's CPU) trains a LoRA adapter on them, and each step
pushes the new weights through tokenwire's control plane: pause (draining what runs), new
weights, a version label, a prefix-cache reset, resume. Samples of another version than the
trainer's are refused (`--allow-stale` keeps them).

    python docs/examples/rl_loop.py --url http://127.0.0.1:8000 --steps 20 --push lora

`--push lora` is for the embedded engine (the adapter as a GGUF LoRA, llama.cpp's adapter API);
`--push reload` for vLLM upstreams behind a tokenwire gateway (the merged weights saved as
safetensors, loaded by vLLM's `reload_weights` through `collective_rpc`: what its CPU build can
do; NCCL and CUDA IPC transfers need GPUs). The task has a programmatic reward: "What is a + b?"
(one-digit numbers) earns 1 when the last number of the answer is the sum, and 0.2 more when
the answer stops (a sampled end of turn, which the loop trains on) with a number in it; an
answer that never stops earns half. Each step prints the mean reward, the share of correct
answers and the trainer/sampler logprob mismatch on the sampled ids (mean and max |Δ|: the
trainer runs fp32 weights dequantized from the Q4_1 GGUF llama.cpp samples with).

Needs the rl extra (`pip install tokenwire[rl]`: torch, transformers, gguf) and SmolLM2 as a
Hugging Face directory (`make` builds it: scripts/hf-model-from-gguf.py).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from tokenwire.client import Client
from tokenwire.rl.lora import write_lora_gguf

MODEL = "SmolLM2-135M-Instruct"
MODEL_DIR = Path.home() / ".cache" / "tokenwire" / "SmolLM2-135M-Instruct-hf"
TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
NUMBER = re.compile(r"-?\d+")


# -- the policy: SmolLM2 with a LoRA adapter -------------------------------------------------

class LoRALinear(torch.nn.Module):
    """`base(x) + (alpha / rank) B A x`, A and B trained, `base` frozen (PEFT's layout)."""

    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.A = torch.nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(rank * 64))
        self.B = torch.nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.A.T @ self.B.T) * self.scale

    def merged(self) -> torch.Tensor:
        return self.base.weight + self.scale * (self.B @ self.A)


def load_policy(model_dir: Path, rank: int, alpha: float) -> tuple[Any, dict[str, LoRALinear]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.requires_grad_(False)
    adapters: dict[str, LoRALinear] = {}
    for i, layer in enumerate(model.model.layers):
        for target in TARGETS:
            parent_name, name = target.split(".")
            parent = getattr(layer, parent_name)
            lora = LoRALinear(getattr(parent, name), rank, alpha)
            setattr(parent, name, lora)
            adapters[f"model.layers.{i}.{target}"] = lora
    return model, adapters


# -- rollouts through tokenwire ------------------------------------------------------------

@dataclass
class Sample:
    question: str
    correct: bool
    ids: list[int]
    """The conversation the trainer reads (the render of the question and the answer)."""
    mask: list[int]
    """1 where the model sampled the id (the answer's ids, its end of turn where it stopped)."""
    sampler_logprobs: list[float]
    """The sampler's logprob of each masked id, in order."""
    reward: float
    version: str


def score(text: str, stopped: bool, answer: int) -> tuple[float, bool]:
    """(reward, correct): 1 when the answer's last number is `answer`, 0.2 more for stopping
    with a number in it; half of that when it never stopped."""
    numbers = NUMBER.findall(text)
    correct = bool(numbers) and int(numbers[-1]) == answer
    r = float(correct) + (0.2 if stopped and numbers else 0.0)
    return (r if stopped else r / 2), correct


def rollouts(client: Client, questions: list[tuple[str, int]], group: int, max_tokens: int,
             seed: int) -> list[list[Sample]]:
    groups = []
    for k, (q, answer) in enumerate(questions):
        user = [{"role": "user", "content": q}]
        r = client.chat(MODEL, user, n=group, temperature=1.0, max_tokens=max_tokens,
                        logprobs=True, seed=seed + k)
        samples = []
        for c in r.choices:
            ids = list(c.token_ids or [])
            lps = [t.logprob for t in c.logprobs.content] if c.logprobs and \
                c.logprobs.content else []
            stopped = isinstance(c.stop_reason, int)
            if stopped:  # the end of turn the model sampled is part of the sample
                ids.append(c.stop_reason)  # type: ignore[arg-type]
                lps.append(c.stop_logprob if c.stop_logprob is not None else float("nan"))
            spans = c.weight_versions or []
            versions = {s.version for s in spans}
            rendered = client.render(MODEL, [*user, {"role": "assistant",
                                                     "content": c.message.content or "",
                                                     "token_ids": ids}],
                                     add_generation_prompt=False)
            if sum(rendered.sampled_mask) != len(lps):
                raise RuntimeError(f"the mask marks {sum(rendered.sampled_mask)} ids, the "
                                   f"sample has {len(lps)} logprobs")
            r, correct = score(c.message.content or "", stopped, answer)
            samples.append(Sample(q, correct, rendered.token_ids, rendered.sampled_mask, lps,
                                  r, versions.pop() if len(versions) == 1 else
                                  "mixed:" + ",".join(sorted(versions))))
        groups.append(samples)
    return groups


# -- the trainer's half --------------------------------------------------------------------

def trainer_logprobs(model: Any, s: Sample) -> torch.Tensor:
    """The policy's logprob of each masked id (teacher forcing on the whole conversation)."""
    ids = torch.tensor([s.ids])
    logits = model(ids).logits[0, :-1].float()
    lp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor(s.mask[1:], dtype=torch.bool)
    return lp[mask]


def train_step(model: Any, optimizer: torch.optim.Optimizer, groups: list[list[Sample]],
               clip: float) -> dict[str, float]:
    """One GRPO update: group-normalised advantages, token-level loss, truncated importance
    weights (trainer vs sampler: they run other numerics) capped at `clip`."""
    optimizer.zero_grad()
    deltas: list[float] = []
    n_tokens = sum(sum(s.mask) for g in groups for s in g)
    for g in groups:
        rewards = [s.reward for s in g]
        mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
        for s in g:
            lp = trainer_logprobs(model, s)
            sampler = torch.tensor(s.sampler_logprobs)
            # ids sampled under a grammar (agent_rl.py's tool call) come with the logprobs of
            # the distribution the grammar left (vLLM's): their gap to the trainer's is the
            # grammar, not the numerics; the capped weight below keeps them out of the step
            free = getattr(s, "free_from", 0)
            deltas += (lp.detach() - sampler)[free:].abs().tolist()
            if std < 1e-6:
                continue  # the group agrees: no signal
            advantage = (s.reward - mean) / (std + 1e-4)
            weight = torch.exp(lp.detach() - sampler).clamp(max=clip)
            loss = -(weight * advantage * lp).sum() / n_tokens
            loss.backward()
    optimizer.step()
    return {"mismatch_mean": statistics.fmean(deltas), "mismatch_max": max(deltas)}


# -- weight sync through the control plane ---------------------------------------------------

def push_lora(client: Client, adapters: dict[str, LoRALinear], config: Any, alpha: float,
              out: Path, version: str) -> None:
    """The embedded engine: the adapter as a GGUF LoRA."""
    path = write_lora_gguf(out / f"{version}.gguf",
                           {name: (m.A.detach().numpy(), m.B.detach().numpy())
                            for name, m in adapters.items()},
                           alpha=alpha, n_head=config.num_attention_heads,
                           n_head_kv=config.num_key_value_heads)
    sync(client, version, {"update_info": {"lora_path": str(path)}}, "update_weights")


def push_merged(client: Client, model: Any, adapters: dict[str, LoRALinear], model_dir: Path,
                out: Path, version: str) -> None:
    """vLLM: the merged weights as a Hugging Face directory, read by `reload_weights`."""
    from safetensors.torch import save_file

    merged = {f"{name}.weight": m.merged().detach().to(torch.bfloat16)
              for name, m in adapters.items()}
    state = {}
    for name, tensor in model.state_dict().items():
        if ".base." in name or name.endswith((".A", ".B")) or name == "lm_head.weight":
            continue  # the adapted layers are merged; the head is tied to the embedding
        state[name] = tensor.to(torch.bfloat16).contiguous()
    state.update(merged)
    target = out / version
    target.mkdir(parents=True, exist_ok=True)
    save_file(state, str(target / "model.safetensors"))
    (target / "config.json").write_text((model_dir / "config.json").read_text())
    sync(client, version, {"method": "reload_weights",
                           "kwargs": {"weights_path": str(target)}}, "collective_rpc")


def sync(client: Client, version: str, body: dict[str, Any], op: str) -> None:
    """Pause (running samples finish), new weights, their version, no stale cache, resume."""
    client.control("pause", mode="wait")
    try:
        client.control(op, body)
        client.control("update_weight_version", {"new_version": version})
        client.control("reset_prefix_cache")
    finally:
        client.control("resume")


# -- the loop ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None, help="an admin key (TOKENWIRE_ADMIN_KEYS)")
    ap.add_argument("--push", choices=["lora", "reload"], default="lora")
    ap.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=4, help="questions per step")
    ap.add_argument("--group", type=int, default=8, help="samples per question")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=2.0, help="truncated importance weight cap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--allow-stale", action="store_true")
    ap.add_argument("--report", type=Path, help="write each step's numbers here (JSON lines)")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, adapters = load_policy(args.model_dir, args.rank, args.alpha)
    optimizer = torch.optim.Adam([p for m in adapters.values() for p in (m.A, m.B)],
                                 lr=args.lr)
    out = Path(tempfile.mkdtemp(prefix="tokenwire-rl-"))
    report = args.report.open("w") if args.report else None
    with Client(f"{args.url}/v1", api_key=args.api_key) as client:
        version = "step-0"  # B = 0: the adapter changes nothing yet; label the weights so
        if args.push == "lora":
            push_lora(client, adapters, model.config, args.alpha, out, version)
        else:
            push_merged(client, model, adapters, args.model_dir, out, version)
        print("step  reward  correct  stale  |Δlogprob| mean  max   rollout_s  train_s  sync_s",
              flush=True)
        for step in range(1, args.steps + 1):
            t0 = time.monotonic()
            pairs = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(args.prompts)]
            questions = [(f"What is {a} + {b}?", a + b) for a, b in pairs]
            groups = rollouts(client, questions, args.group, args.max_tokens,
                              seed=args.seed * 1000 + step * 10)
            stale = sum(s.version != version for g in groups for s in g)
            if stale and not args.allow_stale:
                raise SystemExit(f"step {step}: {stale} samples were made by other weights "
                                 f"than {version!r} (--allow-stale keeps them)")
            t1 = time.monotonic()
            stats = train_step(model, optimizer, groups, args.clip)
            t2 = time.monotonic()
            version = f"step-{step}"
            if args.push == "lora":
                push_lora(client, adapters, model.config, args.alpha, out, version)
            else:
                push_merged(client, model, adapters, args.model_dir, out, version)
            t3 = time.monotonic()
            mean_reward = statistics.fmean(s.reward for g in groups for s in g)
            correct = statistics.fmean(s.correct for g in groups for s in g)
            row = {"step": step, "reward": mean_reward, "correct": correct, "stale": stale,
                   **stats,
                   "rollout_s": t1 - t0, "train_s": t2 - t1, "sync_s": t3 - t2}
            print(f"{step:4d}  {mean_reward:6.3f}  {correct:7.3f}  {stale:5d}"
                  f"  {stats['mismatch_mean']:15.3f}"
                  f"  {stats['mismatch_max']:5.2f}  {t1 - t0:9.1f}  {t2 - t1:7.1f}"
                  f"  {t3 - t2:6.1f}", flush=True)
            if report is not None:
                report.write(json.dumps(row) + "\n")
                report.flush()
    if report is not None:
        report.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
