"""bench/compare.py's results: each metric's per-round values summed up as medians and
median ratios to the baseline with their range, printed as a markdown table, written as
JSON, and drawn as a PNG (matplotlib, Agg).
"""

from __future__ import annotations

import json
import statistics
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["Metric", "plot", "summarize", "table", "write_json"]


@dataclass(frozen=True)
class Metric:
    phase: Literal["configured", "defaults"]
    workload: str  # the key of its workload's results in a round
    key: str  # the figure within them
    label: str  # the row of the table: workload and figure
    short: str  # the bar group of the plot
    unit: str
    better: Literal["higher", "lower"]


def _values(raw: dict[str, list[dict[str, Any]]], m: Metric, name: str) -> list[float | None]:
    out: list[float | None] = []
    for rnd in raw.get(name, []):
        v = (rnd.get(m.workload) or {}).get(m.key)
        out.append(float(v) if isinstance(v, int | float) else None)
    return out


def summarize(metrics: list[Metric], raw: dict[str, dict[str, list[dict[str, Any]]]],
              names: list[str], baseline: str) -> list[dict[str, Any]]:
    """One row per metric: each contender's median, and its ratio to the baseline taken round
    by round (the rounds alternate contenders, so a ratio compares neighbours in time)."""
    rows = []
    for m in metrics:
        phase = raw.get(m.phase, {})
        vals = {n: _values(phase, m, n) for n in names}
        base = vals.get(baseline, [])
        medians, ratios = {}, {}
        for n in names:
            got = [v for v in vals[n] if v is not None]
            medians[n] = statistics.median(got) if got else None
            per_round = [v / b for v, b in zip(vals[n], base, strict=False)
                         if v is not None and b]
            if n != baseline and per_round:
                ratios[n] = {"median": statistics.median(per_round), "min": min(per_round),
                             "max": max(per_round), "rounds": per_round}
        rows.append({"phase": m.phase, "workload": m.workload, "metric": m.key,
                     "label": m.label, "short": m.short, "unit": m.unit, "better": m.better,
                     "values": vals, "median": medians, "ratio_to_baseline": ratios})
    return rows


def _num(v: float) -> str:
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def table(rows: list[dict[str, Any]], names: list[str], baseline: str,
          down: dict[str, str]) -> str:
    """The markdown table; `down` names each contender that did not start, with why."""
    others = [n for n in names if n != baseline]
    head = ["workload", *names, *(f"{n} / {baseline}" for n in others)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        arrow = "↑" if row["better"] == "higher" else "↓"
        cells = [f"{row['label']} ({row['unit']}) {arrow}"]
        for n in names:
            v = row["median"][n]
            cells.append("did not start" if f"{row['phase']}:{n}" in down
                         else "failed" if v is None else _num(v))
        for n in others:
            r = row["ratio_to_baseline"].get(n)
            cells.append("n/a" if r is None else
                         f"{r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}]")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"\n↑ higher is better, ↓ lower is better. Ratios: contender / {baseline}, "
                 "median of the per-round ratios [min-max].")
    for key, why in down.items():
        phase, name = key.split(":", 1)
        lines.append(f"{name} ({phase}) did not start: {why.splitlines()[-1] if why else '?'}")
    return "\n".join(lines)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


def plot(path: Path, rows: list[dict[str, Any]], names: list[str], baseline: str,
         title: str) -> None:
    """Grouped bars: each contender against the baseline (the line at 1), turned so that
    above 1 is better (throughput: the ratio; time and memory: the baseline's over the
    contender's); whiskers span the rounds' range; log scale, so 2x and 0.5x look alike."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    others = [n for n in names if n != baseline]
    fig, ax = plt.subplots(figsize=(max(8.0, 1.25 * len(rows) + 2), 5.2))
    width = 0.8 / max(1, len(others))
    for j, n in enumerate(others):
        xs, tops, lo, hi = [], [], [], []
        for i, row in enumerate(rows):
            r = row["ratio_to_baseline"].get(n)
            if r is None:
                continue
            up = row["better"] == "higher"
            mid, a, b = ((r["median"], r["min"], r["max"]) if up else
                         (1 / r["median"], 1 / r["max"], 1 / r["min"]))
            xs.append(i + (j - (len(others) - 1) / 2) * width)
            tops.append(mid)
            lo.append(mid - a)
            hi.append(b - mid)
        bars = ax.bar(xs, [t - 1 for t in tops], width * 0.95, bottom=1, label=n,
                      yerr=[lo, hi], capsize=3)
        ax.bar_label(bars, labels=[f"{t:.2f}" for t in tops], fontsize=7, padding=2)
    ax.axhline(1.0, color="black", linewidth=1, label=f"{baseline} = 1")
    ax.set_yscale("log")
    lo_y, hi_y = ax.get_ylim()
    ax.set_ylim(min(lo_y, 0.5), max(hi_y, 2.0))
    lo_y, hi_y = ax.get_ylim()
    ax.set_yticks([t for t in (0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50)
                   if lo_y <= t <= hi_y])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(range(len(rows)), [textwrap.fill(r["short"], 16) for r in rows], fontsize=8)
    ax.set_ylabel(f"relative to {baseline}, above 1: better\n(tokens/s: the ratio; time, "
                  f"memory: {baseline}'s over the contender's)", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
