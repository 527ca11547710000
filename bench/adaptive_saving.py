"""The adaptive design's saving (issue 23, item 4): GPU-hours an adaptive run spends to settle
a comparison against the fixed design that settles the same one, on the planner's worlds of
config/config.yaml (prior), per benchmark and headline comparison, in the worlds with no
effect, with the fixed design's MDE and with twice it.

For each rule (rounds, first fraction, spending) the stopping rule is simulated as
`stereolens plan --adaptive` does (stereolens.design.adaptive_plan: the canonical joint
distribution of nested rounds with the world's mean and variance at each round's size), at
the rounds' sizes the workflow runs (stereolens.design.cli.workflow_sizes: ContextBias in
whole seed shards, config/config.yaml with docs/planner.md's recipe
contextbias.seeds.per_shard 2; BiasIG, which runs fixed in the workflow, at the rule's
sizes), with the plan's own cost model for the benchmark's GPU-hours at each size. Two fixed designs
beside it: the configured one (the cap: what a run of config/config.yaml spends whatever the
answer) and the smallest fixed size with the adaptive rule's power at that effect
(stereolens.design.power.required_size), the design one would run if the effect were known
in advance.

Usage: PYTHONPATH=src .venv/bin/python bench/adaptive_saving.py [--sims 200]
       [--markdown bench/ADAPTIVE.md] [--benchmarks contextbias,biasig]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RULES = [
    {"rounds": r, "first_fraction": f, "spending": s, "timing": t, "gamma": -4}
    for t in ("size", "information")
    for s in ("obrien_fleming", "pocock")
    for r, f in ((3, 0.25), (4, 0.125))
]
EFFECTS = ("contextbias.bi_shift", "biasig.s_imp_diff", "biasig.s_exp_diff")


class Cached:
    """A design whose simulate() is cached by size (the rules share their round sizes)."""

    def __init__(self, design):
        self._d = design
        self._cache: dict[int, object] = {}

    def __getattr__(self, name):
        return getattr(self._d, name)

    def simulate(self, n, w, sims, rng):
        if n not in self._cache:
            self._cache[n] = self._d.simulate(n, w, sims, rng)
        return self._cache[n]


def main() -> int:
    from contextlib import chdir

    from stereolens.config import load_config
    from stereolens.design import adaptive_plan as AP
    from stereolens.design import power as P
    from stereolens.design import rounds
    from stereolens.design.cli import workflow_sizes
    from stereolens.design.priors import load_priors
    from stereolens.plan import default_throughput, plan

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=200)
    ap.add_argument("--markdown", default=None)
    ap.add_argument(
        "--benchmarks", default="contextbias,biasig", help="comma-separated (default both)"
    )
    args = ap.parse_args()
    with chdir(ROOT):
        config, registry = load_config("config/config.yaml")
        config["contextbias"]["seeds"]["per_shard"] = 2  # the recipe: 5 shards of 2 seeds
        throughput = default_throughput()
        from stereolens.benchmark import benchmarks, resolve

        designs = []
        for plugin in benchmarks():
            if plugin.planner and plugin.name in args.benchmarks.split(","):
                designs.append(resolve(plugin.planner)(config, load_priors(), None, 0))
    lines = [
        "| comparison | rule | world | effect | adaptive GPU-h median | p90 | fixed (configured) "
        "GPU-h | saving (median) | fixed sized for the effect: size, GPU-h | power adaptive / "
        "fixed configured | coverage adaptive / fixed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in designs:
        cached = Cached(d)
        costs: dict[int, float] = {}

        def cost(n, d=d, costs=costs):
            if n not in costs:
                resized = getattr(d, "resized", None)
                new = resized(config, n) if resized else P.set_key(config, d.knob, n)
                with chdir(ROOT):
                    rows = plan(new, registry, throughput)["rows"]
                costs[n] = sum(r["gpu_hours"] or 0.0 for r in rows if r["benchmark"] == d.benchmark)
            return costs[n]

        t0 = time.process_time()
        mde = P.mde_rows(d, sims=args.sims)
        print(f"{d.benchmark}: MDE rows {time.process_time() - t0:.1f} s CPU", flush=True)
        results = []
        for rule in RULES:
            t0 = time.process_time()
            options = {**rule, "goal": "difference", "width": {}, "margin": {}}
            adaptive = {**config["design"]["adaptive"], **options}
            as_run = {**config, "design": {**config["design"], "mode": "adaptive",
                                           "adaptive": adaptive}}  # fmt: skip
            with chdir(ROOT):
                at = rounds.budget(as_run, registry, throughput)
            rule_ = AP.rule_from(options, 0.05)
            sizes = workflow_sizes(as_run, d, at, rule_)
            rows = AP.plan_adaptive(
                cached, rule_, options, cost, sizes=sizes, sims=args.sims, mde_rows=mde
            )
            label = (
                f"{rule['rounds']} rounds from {rule['first_fraction']:g}, {rule['spending']}, "
                f"{rule['timing']} time"
            )
            print(f"{d.benchmark} {label}: {time.process_time() - t0:.1f} s CPU", flush=True)
            results += [(label, r) for r in rows if r.name in EFFECTS and not r.note]
        # the fixed design sized for the effect (known in advance): at 2 x MDE, the smallest
        # size with the best rule's power (at most 0.99); at the MDE it is the configured one
        sized = {}
        for name in {r.name for _, r in results}:
            two = [w for _, r in results if r.name == name for w in r.worlds if "2 x" in w.world]
            power = min(max(w.rejects for w in two), 0.99)
            t0 = time.process_time()
            q = P.required_size(d, name, two[0].effect, power=power, sims=args.sims)
            print(f"{name}: sized fixed design {q.needed} ({time.process_time() - t0:.1f} s CPU)")
            if q.needed is not None:
                sized[name] = f"{q.needed} (power {power:.2f}): {cost(q.needed):,.1f}"
        for label, r in results:
            for w in r.worlds:
                fixed_sized = (
                    sized.get(r.name, "-")
                    if "2 x" in w.world
                    else "the configured"
                    if w.effect > 0
                    else "-"
                )
                saving = r.fixed_gpu_hours / w.gpu_hours_median
                lines.append(
                    f"| {r.name} | {label} (sizes {', '.join(map(str, r.sizes))}) | "
                    f"{w.world} | {w.effect:.4g} | {w.gpu_hours_median:,.1f} | "
                    f"{w.gpu_hours_p90:,.1f} | {r.fixed_gpu_hours:,.1f} | {saving:.2f}x | "
                    f"{fixed_sized} | {w.rejects:.3f} / {w.fixed_rejects:.3f} | "
                    f"{w.coverage:.3f} / {w.fixed_coverage:.3f} |"
                )
                print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    raise SystemExit(main())
