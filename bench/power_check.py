"""The planner's predicted power against the real metric pipeline at a larger scale than the
test (issue 15, item 3; tests/test_design_check.py pins a small one), and the planner's own
run time on config/config.yaml.

For each case a world, a sample size and a planted effect strength w: the planner's
prediction (its vectorised simulation, ``--sims`` datasets) and the rejection rate of the real
pipeline on ``--datasets`` independently drawn datasets written as its input tables
(ContextBias cluster_bootstrap, BiasIG compute_metrics, LVLM overall_scores with the
permutation null), each with its Monte Carlo standard error, and z = the two-proportion z
of the two rates (their difference over the error both would have at their pooled rate).
Then the goodness of fit over all rows (stereolens.design.check.goodness_of_fit: chi2 = sum
z^2 on as many degrees of freedom as rows, its p-value, and the mean z, whose sign says
whether the planner is optimistic), and
`stereolens plan --power` on config/config.yaml, timed (target: well under a minute on 2
cores). Exit status 1 when the fit's p-value is below 0.01 or the planner fails.

Usage: PYTHONPATH=src .venv/bin/python bench/power_check.py [--datasets 300] [--sims 1000]
       [--quick] [--only TEXT]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.chdir(ROOT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=300)
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="100 datasets, 400 simulations")
    ap.add_argument(
        "--only", metavar="TEXT", help="only the cases whose label contains TEXT (no plan timing)"
    )
    args = ap.parse_args()
    if args.quick:
        args.datasets, args.sims = 100, 400

    from design_worlds import cb_design, small_biasig

    from stereolens.config import load_config
    from stereolens.design import check as K
    from stereolens.design.priors import load_priors
    from stereolens.lvlm import design as L

    n_d, n_s = args.datasets, args.sims
    config, _ = load_config("config/demo.yaml")
    config["lvlm"]["axes"] = ["gender", "race"]
    lvlm = {d.task: d for d in L.build(config, load_priors(), None)}

    def size(draws, datasets=n_d):
        return K.CheckSize(datasets=datasets, sims=n_s, draws=draws)

    def biasig(metric):  # the BiasIG cases: 10 images
        return lambda w: K.check("biasig", small_biasig(), metric, 10, w, size(200, n_d // 2))

    cases = [
        ("ContextBias 40 roles, 4 seeds", lambda w: K.check(
            "contextbias", cb_design(40), "contextbias.bi_shift", 4, w, size(500)),
            (0.0, 0.06, 0.1)),
        ("ContextBias 40 roles, one generator", lambda w: K.check(
            "contextbias", cb_design(40), "contextbias.bi_shift:g1", 4, w, size(500)), (0.08,)),
        ("ContextBias 12 roles, 4 seeds", lambda w: K.check(
            "contextbias", cb_design(12), "contextbias.bi_shift", 4, w, size(500)), (0.17,)),
        ("ContextBias 6 roles, 4 seeds", lambda w: K.check(
            "contextbias", cb_design(6), "contextbias.bi_shift", 4, w, size(500)), (0.0, 0.27)),
        ("BiasIG S_exp B - A, 10 images", biasig("biasig.s_exp_diff"), (0.0, 0.08)),
        ("BiasIG S_imp B - A, 10 images", biasig("biasig.s_imp_diff"), (0.0, 0.6)),
        ("BiasIG eta - 0.5, 10 images", biasig("biasig.eta"), (0.0, 0.3)),
        ("BiasIG eta, the report's interval", biasig("biasig.eta_interval"), (0.0, 0.3)),
        ("LVLM story, race, 60 per group", lambda w: K.check(
            "lvlm", lvlm["story"], "lvlm.tvd.story.race", 60, w, size(200)), (0.0, 0.08)),
        ("LVLM term, gender, 40 per group", lambda w: K.check(
            "lvlm", lvlm["term"], "lvlm.tvd.term.gender", 40, w, size(200)), (0.06,)),
        ("LVLM exam, race, 30 per group", lambda w: K.check(
            "lvlm", lvlm["exam"], "lvlm.tvd.exam.race", 30, w, size(200)), (0.1,)),
    ]  # fmt: skip
    print(
        f"{'case':36} {'w':>5} {'effect':>8} {'predicted':>15} {'pipeline':>15} {'z':>6} {'s':>6}"
    )
    results = []
    for label, run, ws in cases:
        if args.only and args.only not in label:
            continue
        for w in ws:
            t0 = time.perf_counter()
            r = run(w)
            results.append(r)
            took = time.perf_counter() - t0
            print(
                f"{label:36} {w:5.2f} {r.effect:8.4f} {r.predicted:7.3f} +- {r.predicted_se:.3f}"
                f" {r.observed:7.3f} +- {r.observed_se:.3f} {r.z:6.2f} {took:6.1f}",
                flush=True,
            )
    fit = K.goodness_of_fit(results)
    worst = max(abs(r.z) for r in results)
    print(
        f"goodness of fit: sum z^2 = {fit['chi2']:.1f} over {fit['rows']} rows, p = "
        f"{fit['p_value']:.3g} (chi2, {fit['rows']} df); mean z {fit['mean_z']:+.2f}; "
        f"largest |z| {worst:.2f}"
    )
    if args.only:
        return 0 if fit["p_value"] >= 0.01 else 1
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "stereolens.cli", "plan", "--configfile", "config/config.yaml",
         "--power"], env=env, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    print(f"stereolens plan --power on config/config.yaml: {wall:.1f} s (exit {out.returncode})")
    return 0 if out.returncode == 0 and fit["p_value"] >= 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
