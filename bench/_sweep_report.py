"""bench/sweep.py's results as docs/hot-path.md carries them: each figure's median over the rounds
in markdown tables (tests/test_docs_claims.py reads them against docs/sweep.json), and the figure
(matplotlib, Agg)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

__all__ = ["figure", "med", "table"]


def med(rows: list[dict[str, Any]], key: str) -> float | None:
    got = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(got) if got else None


def table(results: dict[str, Any]) -> str:
    """The markdown tables docs/hot-path.md carries (tests/test_docs_claims.py reads them)."""
    out = []
    for kind, title in (("whole", "whole rollouts"), ("stream", "streams")):
        levels = results[kind]
        if not levels:
            continue
        names = list(next(iter(levels.values())))
        out.append(f"| {title}: CPU ms / token | " + " | ".join(names) + " |")
        out.append("|---" * (len(names) + 1) + "|")
        for level, per in levels.items():
            cells = [_fmt(med(per[nm], "cpu_ms_per_token"), 4) for nm in names]
            out.append(f"| {level} | " + " | ".join(cells) + " |")
        out.append("")
        out.append(f"| {title}: tokens/s, B/token in flight, p99 "
                   f"{'gap' if kind == 'stream' else 'latency'} ms, failed | "
                   + " | ".join(names) + " |")
        out.append("|---" * (len(names) + 1) + "|")
        late = "gap_p99_ms" if kind == "stream" else "ttft_p99_ms"
        for level, per in levels.items():
            cells = [f"{_fmt(med(per[nm], 'tokens_per_s'), 0)}, "
                     f"{_fmt(med(per[nm], 'rss_bytes_per_token_in_flight'), 0)}, "
                     f"{_fmt(med(per[nm], late), 0)}, "
                     f"{sum(r['failed'] for r in per[nm])}" if per[nm] else "not run"
                     for nm in names]
            out.append(f"| {level} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _fmt(v: float | None, places: int) -> str:
    return "-" if v is None else f"{v:.{places}f}"


def figure(results: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for col, kind in enumerate(("whole", "stream")):
        levels = results[kind]
        if not levels:
            continue
        names = [nm for nm in next(iter(levels.values())) if nm != "stub direct"]
        xs = [int(lv) for lv in levels]
        for nm in names:
            cpu = [med(levels[lv][nm], "cpu_ms_per_token") for lv in levels]
            mem = [med(levels[lv][nm], "rss_bytes_per_token_in_flight") for lv in levels]
            axes[0][col].plot(xs, [c if c is not None else float("nan") for c in cpu], "o-",
                              label=nm)
            axes[1][col].plot(xs, [m if m is not None else float("nan") for m in mem], "o-",
                              label=nm)
        for row, what in enumerate(("CPU ms per relayed token", "RSS bytes per token in flight")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("symlog", linthresh=0.001 if row == 0 else 10)
            ax.set_title(f"{'whole rollouts (n 8, logprobs)' if kind == 'whole' else 'streams'}: "
                         f"{what}", fontsize=9)
            ax.set_xlabel("requests in flight", fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"one gateway box, 2 cores ({results['setup']['cpu']}); bench/sweep.py",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
