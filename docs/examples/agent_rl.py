"""Asynchronous agent RL through tokenwire, on a CPU: a tool-using, multi-turn GRPO loop that
trains a LoRA adapter while the fleet keeps generating.

The task: "What is 47 * 86?" (two-digit numbers, beyond a 135M model's arithmetic), with a
`calculator` tool. A rollout is two assistant turns: a call (`tool_choice: "required"`: the call
is well-formed, its expression is the model's), the tool's result, and the answer. The reward is
0.5 when the call's expression computes the product and 1 more when the answer's last number is
the product: tool use earns it. Every turn goes through the gateway as ids: the first turn's
sampled ids (its tool-call markup and its end of turn included) are fed back verbatim with the
tool's result, and the render of the whole conversation gives the loss mask over both
assistant turns, in line with the sampler's logprobs (each turn's end-of-turn id and its
logprob included).

Asynchronous: a rollout thread keeps generating groups while the trainer trains on the last
one and pushes the new adapter (`/v1/load_lora_adapter` in place from a new directory, which is
its version: the gateway drains each replica in turn, so no sample mixes adapters). Rollouts
ask for `max_staleness` (default 1): the gateway routes them only to replicas whose adapter is
at most that many versions behind the newest. The trainer measures the staleness it sees (its
version against the version that sampled each turn) and corrects for the sampler/trainer gap
with a truncated importance weight.
The call is sampled under the tool-call grammar, and vLLM's logprobs are then of the
distribution its grammar left (a forced id has logprob 0): the truncated importance weight
(the trainer's probability over the sampler's, capped) all but zeroes a forced id's term, and
the reported mismatch is the answer turn's (free sampling).

    python docs/examples/agent_rl.py --url http://gateway:8000 --api-key $ADMIN --steps 30 \\
        --report run.jsonl --plot reward.png

Needs a gateway in front of vLLM replicas that load adapters at run time (`--enable-lora
--max-lora-rank 8`, `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`: docs/rl.md), an admin key that may
send raw prompts (a model samples a control id now and then), the rl extra (torch,
transformers, safetensors) and SmolLM2 as a Hugging Face directory (`make` builds it).
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import queue
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rl_loop  # noqa: E402
from rl_loop import MODEL_DIR, LoRALinear, load_policy, train_step  # noqa: E402

from tokenwire.client import Client  # noqa: E402

ADAPTER = "policy"
SYSTEM = ("You are a careful assistant. For arithmetic, call the calculator tool with the "
          "expression, then answer with the number it returns.")
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"], "additionalProperties": False}}}]
NUMBER = re.compile(r"-?\d+")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}


def calculate(expression: str) -> float | None:
    """+ - * / over numbers, nothing else (the tool the policy calls)."""
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))  # type: ignore[no-any-return]
        raise ValueError(expression)
    try:
        return ev(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


@dataclass
class Sample(rl_loop.Sample):
    """One trajectory: rl_loop.py's sample (what its trainer reads), and its turns."""

    tool_ok: bool
    versions: tuple[str, ...]
    """The adapter version that sampled each assistant turn."""
    free_from: int
    """Masked ids before this one (the call) were sampled under the tool-call grammar."""


def _turn(c: Any) -> tuple[list[int], list[float]]:
    """A choice's sampled ids and their logprobs, its end of turn included where sampled."""
    ids = list(c.token_ids or [])
    lps = [t.logprob for t in c.logprobs.content] if c.logprobs and c.logprobs.content else []
    if isinstance(c.stop_reason, int):
        if c.stop_logprob is None:
            raise RuntimeError("a sampled end of turn came without its logprob")
        ids.append(c.stop_reason)
        lps.append(c.stop_logprob)
    return ids, lps


def _version(c: Any) -> str:
    """The adapter version (its path) that sampled a turn: "<base>+lora:policy@<path>"."""
    labels = {s.version.partition(f"+lora:{ADAPTER}@")[2] for s in c.weight_versions or []}
    if len(labels) != 1:
        raise RuntimeError(f"a turn names {sorted(labels) or 'no'} adapter versions, not one")
    return labels.pop()


def trajectories(client: Client, a: int, b: int, group: int, staleness: int,
                 seed: int) -> list[Sample]:
    """`group` two-turn rollouts of one question."""
    question = f"What is {a} * {b}?"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": question}]
    first = client.chat(ADAPTER, messages, n=group, temperature=1.0, max_tokens=40, seed=seed,
                        logprobs=True, tools=TOOLS, tool_choice="required",
                        parallel_tool_calls=False, max_staleness=staleness)
    with ThreadPoolExecutor(max_workers=group) as pool:  # the answers, side by side
        return list(pool.map(lambda kc: _answer(client, messages, question, a * b, kc[1],
                                                staleness, seed * 100 + kc[0]),
                             enumerate(first.choices)))


def _answer(client: Client, messages: list[dict[str, Any]], question: str, product: int,
            c: Any, staleness: int, seed: int) -> Sample:
    """The tool's result for a first turn's call, then the answer: the trajectory."""
    ids1, lps1 = _turn(c)
    call = (c.message.tool_calls or [None])[0]
    try:
        expression = json.loads(call.function.arguments)["expression"] if call else ""
    except (ValueError, KeyError, TypeError):
        expression = ""
    value = calculate(str(expression))
    result = "error" if value is None else f"{value:g}"
    history = [*messages,
               {"role": "assistant", "content": c.message.content, "token_ids": ids1,
                "tool_calls": [t.model_dump() for t in c.message.tool_calls or []]},
               {"role": "tool", "tool_call_id": call.id if call else "none",
                "content": result}]
    second = client.chat(ADAPTER, history, temperature=1.0, max_tokens=16, logprobs=True,
                         seed=seed, tools=TOOLS, tool_choice="none",
                         max_staleness=staleness)
    c2 = second.choices[0]
    ids2, lps2 = _turn(c2)
    rendered = client.render(ADAPTER, [*history, {"role": "assistant",
                                                  "content": c2.message.content or "",
                                                  "token_ids": ids2}],
                             tools=TOOLS, add_generation_prompt=False)
    lps = lps1 + lps2
    if sum(rendered.sampled_mask) != len(lps):
        raise RuntimeError(f"the mask marks {sum(rendered.sampled_mask)} ids, the turns "
                           f"have {len(lps)} logprobs")
    numbers = NUMBER.findall(c2.message.content or "")
    correct = bool(numbers) and int(numbers[-1]) == product
    tool_ok = value is not None and value == product
    versions = (_version(c), _version(c2))
    return Sample(question, correct, rendered.token_ids, rendered.sampled_mask, lps,
                  0.5 * tool_ok + float(correct), versions[0], tool_ok, versions,
                  len(lps1))


def push(client: Client, adapters: dict[str, LoRALinear], alpha: float, rank: int, out: Path,
         version: str) -> str:
    """The adapter as PEFT writes it, loaded in place on every replica (each drained first);
    its version, which is its path."""
    target = out / version
    target.mkdir(parents=True, exist_ok=True)
    save_file({f"base_model.model.{name}.lora_{ab}.weight": t.detach().contiguous()
               for name, m in adapters.items() for ab, t in (("A", m.A), ("B", m.B))},
              str(target / "adapter_model.safetensors"))
    (target / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "bias": "none", "target_modules": sorted({n.rsplit(".", 1)[1] for n in adapters})}))
    client.control("load_lora_adapter", {"lora_name": ADAPTER, "lora_path": str(target),
                                         "load_inplace": True})
    return str(target)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None, help="an admin key (TOKENWIRE_ADMIN_KEYS)")
    ap.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=2, help="questions per step")
    ap.add_argument("--group", type=int, default=6, help="rollouts per question")
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--clip", type=float, default=2.0, help="truncated importance weight cap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report", type=Path, help="each step's numbers (JSON lines)")
    ap.add_argument("--plot", type=Path, help="the reward curve, drawn here (matplotlib)")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # the other core samples
    model, adapters = load_policy(args.model_dir, args.rank, args.alpha)
    optimizer = torch.optim.Adam([p for m in adapters.values() for p in (m.A, m.B)],
                                 lr=args.lr)
    out = Path(tempfile.mkdtemp(prefix="tokenwire-agent-rl-"))
    run = uuid.uuid4().hex[:6]  # versions of this run never repeat an earlier run's
    batches: queue.Queue[tuple[list[list[Sample]], float]] = queue.Queue(maxsize=1)
    stop = threading.Event()
    failed: list[BaseException] = []

    def generate() -> None:  # the rollout side: never waits for the trainer
        rng = random.Random(args.seed)
        try:
            with Client(f"{args.url}/v1", api_key=args.api_key, timeout=600) as c:
                for n in range(10**9):
                    if stop.is_set():
                        return
                    t0 = time.monotonic()
                    groups = [trajectories(c, rng.randint(11, 99), rng.randint(11, 99),
                                           args.group, args.max_staleness, n * 10 + k)
                              for k in range(args.prompts)]
                    while not stop.is_set():
                        try:
                            batches.put((groups, time.monotonic() - t0), timeout=0.5)
                            break
                        except queue.Full:
                            continue
        except BaseException as exc:  # noqa: BLE001 - reported by the trainer's thread
            failed.append(exc)

    rows: list[dict[str, Any]] = []
    report = args.report.open("w") if args.report else None
    started = time.monotonic()
    with Client(f"{args.url}/v1", api_key=args.api_key, timeout=600) as client:
        # B = 0: the adapter changes nothing yet
        order = [push(client, adapters, args.alpha, args.rank, out, f"{run}-0")]
        producer = threading.Thread(target=generate, daemon=True)
        producer.start()
        print("step  reward  correct  tool_ok  stale mean/max  rollouts/s  |Δlogprob|  train_s"
              "  push_s")
        try:
            for step in range(1, args.steps + 1):
                while True:
                    if failed:
                        raise failed[0]
                    try:
                        groups, gen_s = batches.get(timeout=1.0)
                        break
                    except queue.Empty:
                        continue
                samples = [s for g in groups for s in g]
                stale = [len(order) - 1 - order.index(v) if v in order else -1
                         for s in samples for v in s.versions]
                if any(x < 0 or x > args.max_staleness + 1 for x in stale):
                    raise SystemExit(f"step {step}: a turn sampled by unknown or too old "
                                     f"weights: {sorted({v for s in samples for v in s.versions})}")
                t1 = time.monotonic()
                stats = train_step(model, optimizer, groups, args.clip)
                t2 = time.monotonic()
                order.append(push(client, adapters, args.alpha, args.rank, out,
                                  f"{run}-{step}"))
                t3 = time.monotonic()
                row = {"step": step, "reward": statistics.fmean(s.reward for s in samples),
                       "correct": statistics.fmean(s.correct for s in samples),
                       "tool_ok": statistics.fmean(s.tool_ok for s in samples),
                       "stale_mean": statistics.fmean(stale), "stale_max": max(stale),
                       "rollouts": len(samples), "rollouts_per_s": len(samples) / gen_s,
                       **stats, "train_s": t2 - t1, "push_s": t3 - t2,
                       "elapsed_s": t3 - started}
                rows.append(row)
                print(f"{step:4d}  {row['reward']:6.3f}  {row['correct']:7.3f}  "
                      f"{row['tool_ok']:7.3f}  {row['stale_mean']:6.2f}/{row['stale_max']:<3d}  "
                      f"{row['rollouts_per_s']:10.2f}  {row['mismatch_mean']:10.3f}  "
                      f"{t2 - t1:7.1f}  {t3 - t2:6.1f}",
                      flush=True)
                if report is not None:
                    report.write(json.dumps(row) + "\n")
                    report.flush()
        finally:
            stop.set()
            producer.join(timeout=600)
            if report is not None:
                report.close()
    total = time.monotonic() - started
    n = sum(r["rollouts"] for r in rows)
    print(f"{len(rows)} steps, {n} rollouts in {total:.0f} s ({n / total:.2f} rollouts/s), "
          f"staleness seen: mean {statistics.fmean(r['stale_mean'] for r in rows):.2f}, "
          f"max {max(r['stale_max'] for r in rows)}")
    if args.plot:
        _plot(rows, args.plot)
    return 0


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for key, label in (("reward", "mean reward"), ("correct", "answer correct"),
                       ("tool_ok", "tool called right")):
        ax.plot(steps, [r[key] for r in rows], marker="o", markersize=3, label=label)
    ax.set_xlabel("step")
    ax.set_ylim(0, 1.55)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title("agent RL through tokenwire: two vLLM replicas, LoRA, max_staleness 1")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
