"""Coverage of every kind of interval the tables and the report print (issue 20, item 1):
each row of bench/cover/<benchmark>.py draws datasets from a world of known truth through the
project's own interval code; this prints coverage of the nominal 95% interval with its Monte
Carlo error, the mean width and the mean bias of the estimate (target: 93-97%).

Usage: PYTHONPATH=src .venv/bin/python bench/coverage.py [--scale demo|paper|test]
       [--datasets 200] [--only biasig contextbias ...] [--match TEXT] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

import cover  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=cover.SCALES, default="demo")
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", help=f"row modules (of {cover.modules()})")
    ap.add_argument("--match", help="only the rows whose name contains this text")
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args()
    results = []
    t_cpu = time.process_time()
    for row in cover.rows(args.scale, args.only):
        if args.match and args.match not in row.name:
            continue
        t0 = time.perf_counter()
        res = cover.run_row(row, args.datasets, args.seed)
        results.append(res)
        cov = "withheld" if res.is_withheld else f"{res.coverage:.1%} +- {res.mc_error:.1%}"
        print(
            f"{row.name}: {cov} "
            f"({args.datasets} datasets, {time.perf_counter() - t0:.1f} s) {res.status}",
            flush=True,
        )
    cpu = time.process_time() - t_cpu
    head = f"Scale {args.scale}, {args.datasets} datasets, seed {args.seed}; {cpu:.0f} s CPU."
    text = head + "\n\n" + cover.table(results)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
