"""`make bench`: the side-by-side comparison (bench/compare.py); any other benchmark by name,
each printing its own table. Arguments after a name go to that benchmark.

    .venv/bin/python bench/run.py [NAME [ARGS ...] ...]   # compare canonical gateway gateways
                                                          # sweep serializers affinity
                                                          # load prefix_cache translate
                                                          # structured conversation vocab
                                                          # reasoning;
                                                          # `all`: every one
    .venv/bin/python bench/run.py compare --quick load --good 24
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
MAIN = "compare"
BENCHES = [MAIN, "canonical", "gateway", "gateways", "sweep", "serializers", "affinity", "load",
           "prefix_cache", "recovery", "translate", "deterministic", "structured", "conversation",
           "vocab", "reasoning", "compact_ids", "one_stream"]
# `all`: the ones that start their own servers (prefix_cache needs one running: `make serve`)
ALL = [MAIN, "canonical", "gateway", "gateways", "sweep", "affinity", "load", "recovery",
       "translate", "structured", "conversation", "vocab", "reasoning", "compact_ids",
       "one_stream"]


def parse(argv: list[str]) -> list[tuple[str, list[str]]]:
    """`compare --quick load --good 24`: [("compare", ["--quick"]), ("load", ["--good", "24"])]"""
    runs: list[tuple[str, list[str]]] = []
    for arg in argv:
        if arg == "all":
            runs += [(name, []) for name in ALL]
        elif arg in BENCHES:
            runs.append((arg, []))
        elif runs:
            runs[-1][1].append(arg)
        else:
            raise ValueError(f"{arg!r} comes before any benchmark name")
    return runs or [(MAIN, [])]


def main() -> int:
    try:
        runs = parse(sys.argv[1:])
    except ValueError as exc:
        print(f"{exc}; known: {' '.join(BENCHES)} (or all)", file=sys.stderr)
        return 2
    for name, args in runs:
        print(f"\n## bench/{name}.py {' '.join(args)}\n", flush=True)
        rc = subprocess.call([sys.executable, str(HERE / f"{name}.py"), *args])
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
