"""The sweep behind biasig.formulas.ETA_MIN_HUMAN_RELIABLE (bench/cover/reader.py ETA_SWEEP):
the corrected eta row (reader.eta_sweep_row, the joint draw) at each size, every dataset logged
as it is done, and the table of bench/COVERAGE.md "Reader correction, BiasIG eta" from the log;
``--world pairs``: the 36-pair world (reader.eta_pairs_row), the naive interval logged too.

Usage: PYTHONPATH=src:bench python bench/eta_sweep.py --items 4000 --human 400 600
       [--datasets 1000] [--replicates 200] [--world pair|pairs] --log FILE
       PYTHONPATH=src:bench python bench/eta_sweep.py --from-log FILE [FILE ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from cover import reader  # noqa: E402

HEADER = (
    "| images a side | human labels a side | datasets | coverage | MC error | mean width | "
    "mean bias | sd of estimate | interval se | below / above |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def summary(est, lo, hi, truth: float, z: float = 1.959964) -> dict:
    """Coverage of [lo, hi] over the datasets (an undefined interval counts as a miss, as in
    cover.run_row), its Monte Carlo error, the mean width, the mean bias and the sd (ddof 1)
    of the estimate, the interval's mean half-width / z, and the shares wholly below / above
    the truth."""
    est, lo, hi = (np.asarray(a, dtype=float) for a in (est, lo, hi))
    covered = np.isfinite(lo) & np.isfinite(hi) & (lo <= truth) & (truth <= hi)
    c = float(covered.mean())
    return {
        "datasets": int(est.size),
        "coverage": c,
        "mc_error": float(np.sqrt(c * (1 - c) / est.size)),
        "width": float(np.nanmean(hi - lo)),
        "bias": float(np.nanmean(est - truth)),
        "sd": float(np.nanstd(est, ddof=1)),
        "se": float(np.nanmean(hi - lo) / 2 / z),
        "below": float(np.mean(hi < truth)),
        "above": float(np.mean(lo > truth)),
    }


def markdown_row(items: int, human: int, s: dict) -> str:
    return (
        f"| {items:,} | {human:,} | {s['datasets']:,} | {s['coverage']:.1%} | "
        f"{s['mc_error']:.1%} | {s['width']:.5f} | {s['bias']:+.5f} | {s['sd']:.5f} | "
        f"{s['se']:.5f} | {s['below']:.1%} / {s['above']:.1%} |"
    )


def run(items: int, human: int, datasets: int, replicates: int, log: Path, world="pair"):
    """eta_sweep_row(items, human, replicates)'s datasets (world "pairs": eta_pairs_row's;
    those cover.run_row draws), each appended to ``log`` as a JSON line, then a line with
    the run's CPU seconds."""
    if world == "pairs":
        reader.eta_pairs_row(items, human, replicates)  # registers the scale
    else:
        reader.eta_sweep_row(items, human, replicates)
    scale = f"{'pairs' if world == 'pairs' else 'sweep'}{items}_{human}"
    head = {"world": world, "items": items, "human": human}
    t0 = time.process_time()
    with log.open("a") as f:
        for i, d in enumerate(reader.eta_datasets(scale, datasets, world=world)):
            line = head | {"replicates": replicates, "i": i, "eta": list(map(float, d["eta"]))}
            if world == "pairs":
                line["naive eta"] = list(map(float, d["naive eta"]))
            f.write(json.dumps(line) + "\n")
            f.flush()
        cpu = time.process_time() - t0
        f.write(json.dumps(head | {"cpu_s": cpu}) + "\n")
    print(f"{world} {items} {human}: {datasets} datasets, {cpu:.0f} s CPU", flush=True)


def from_logs(paths: list[Path]) -> str:
    """The table of the logged datasets, one per world, interval (eta, naive eta) and
    (items, human), and each size's CPU seconds."""
    got: dict[tuple, list] = {}
    cpu: dict[tuple, float] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            e = json.loads(line)
            world = e.get("world", "pair")
            if "cpu_s" in e:
                key = (world, e["items"], e["human"])
                cpu[key] = cpu.get(key, 0.0) + e["cpu_s"]
            for kind in ("eta", "naive eta"):
                if kind in e:
                    got.setdefault((world, kind, e["items"], e["human"]), []).append(e[kind])
    lines, table = [], None
    for world, kind, items, human in sorted(got):
        if table != (world, kind):
            table = (world, kind)
            lines += ["", f"world {world}, {kind}:", HEADER]
        truth = reader._eta_pairs.truth() if world == "pairs" else reader.eta_truth()
        est, lo, hi = np.array(got[world, kind, items, human]).T
        lines.append(markdown_row(items, human, summary(est, lo, hi, truth)))
    lines.append("")
    lines += [f"CPU {w} {i:,} / {h:,}: {s:.0f} s" for (w, i, h), s in sorted(cpu.items())]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int)
    ap.add_argument("--human", type=int, nargs="*", default=[])
    ap.add_argument("--datasets", type=int, default=1_000)
    ap.add_argument("--replicates", type=int, default=200)
    ap.add_argument("--world", choices=("pair", "pairs"), default="pair")
    ap.add_argument("--log", type=Path)
    ap.add_argument("--from-log", type=Path, nargs="*")
    args = ap.parse_args()
    if args.from_log:
        print(from_logs(args.from_log))
        return 0
    for human in args.human:
        run(args.items, human, args.datasets, args.replicates, args.log, args.world)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
