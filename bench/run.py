"""`make bench`: every benchmark, one after the other, each printing its own table.

    .venv/bin/python bench/run.py [NAME ...]     # canonical gateway affinity load
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
BENCHES = ["canonical", "gateway", "affinity", "load"]


def main() -> int:
    names = sys.argv[1:] or BENCHES
    unknown = sorted(set(names) - set(BENCHES))
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {' '.join(BENCHES)}", file=sys.stderr)
        return 2
    for name in names:
        print(f"\n## bench/{name}.py\n", flush=True)
        rc = subprocess.call([sys.executable, str(HERE / f"{name}.py")])
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
