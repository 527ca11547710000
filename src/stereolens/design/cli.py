"""The planner's design options (`stereolens plan --power`, `--target-effect`): registered on
the plan subcommand by :func:`add_options`, run by :func:`report` after the plan itself."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stereolens.design import power as P


def add_options(p: argparse.ArgumentParser) -> None:
    """Add the design options to the `stereolens plan` parser."""
    g = p.add_argument_group(
        "design (power)",
        "what the planned run can detect, and what a target effect needs (docs/planner.md: "
        "Designing an audit); the level, power, simulations, seed and prior file are the "
        "config's design section",
    )
    g.add_argument(
        "--power",
        action="store_true",
        help="print, beside the cost, the minimum detectable effect of each benchmark's "
        "headline comparisons at the configured sample sizes",
    )
    g.add_argument(
        "--pilot",
        metavar="RESULTS_DIR",
        type=Path,
        default=None,
        help="the results folder of a pilot run (a small first run of the same config): "
        "its tables replace the documented prior",
    )
    g.add_argument(
        "--target-effect",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="the sample size that detects this population effect, and what that run costs "
        "(repeatable; names as --power prints them, e.g. contextbias.bi_shift=0.01, "
        "lvlm.tvd.story.gender=3)",
    )
    g.add_argument(
        "--adaptive",
        action="store_true",
        help="simulate the adaptive design's stopping rule (the config's design.adaptive) on "
        "each benchmark's planner world and print its expected GPU-hours beside the fixed "
        "design's (implied by design.mode: adaptive; docs/planner.md: Adaptive design)",
    )


def requested(args: argparse.Namespace, config: dict[str, Any] | None = None) -> bool:
    return bool(args.power or args.target_effect or args.pilot or adaptive(args, config))


def adaptive(args: argparse.Namespace, config: dict[str, Any] | None) -> bool:
    """--adaptive, or design.mode adaptive in the config."""
    mode = ((config or {}).get("design") or {}).get("mode", "fixed")
    return bool(getattr(args, "adaptive", False) or mode == "adaptive")


def designs(config: dict[str, Any], args: argparse.Namespace) -> list:
    """Every benchmark design of ``config`` (from the pilot or the prior)."""
    from stereolens.benchmark import benchmarks, resolve
    from stereolens.design.priors import load_priors
    from stereolens.validation import ConfigError

    priors = load_priors(config["design"]["priors"])
    pilot = args.pilot
    if pilot is not None and not pilot.is_dir():
        raise ConfigError(f"--pilot {pilot}: not a folder; give a run's results folder")
    out = []
    for plugin in benchmarks():  # each benchmark's planner world: one design, a list or None
        if plugin.planner:
            got = resolve(plugin.planner)(config, priors, pilot, config["design"]["seed"])
            out += got if isinstance(got, list) else [] if got is None else [got]
    return out


def compute(
    config: dict[str, Any],
    registry,
    throughput,
    plan_result: dict,
    args: argparse.Namespace,
    plan: Callable[..., dict],
) -> dict[str, Any]:
    """The power rows, and for each --target-effect the size it needs and that run's plan
    (``plan``: stereolens.plan.plan, passed in by the planner that calls this)."""
    from dataclasses import asdict

    opts = config["design"]
    P.check_options(opts["level"], opts["target_power"], opts["simulations"])
    targets = [P.parse_target(t) for t in args.target_effect]
    ds = designs(config, args)
    by_name = {s.name: d for d in ds for s in d.specs()}
    unknown = [n for n, _ in targets if n not in by_name]
    if unknown:
        raise ValueError(
            f"--target-effect: unknown effect {unknown[0]!r}; effects of this config: "
            + ", ".join(by_name)
        )
    kw = dict(
        level=opts["level"], power=opts["target_power"], sims=opts["simulations"], seed=opts["seed"]
    )
    rows = [r for d in ds for r in P.mde_rows(d, **kw)] if args.power or not targets else []
    needs = [P.required_size(by_name[n], n, v, **kw) for n, v in targets]
    cost = None
    if needs:
        new = config
        sizes: dict[tuple[str, ...], int] = {}
        for q in needs:
            if q.needed is not None:
                sizes[q.knob] = max(sizes.get(q.knob, 0), q.needed)
        owner = {d.knob: d for d in ds}
        for key, value in sizes.items():
            # a design may change what goes with its size (its resized); else the size alone
            resized = getattr(owner[key], "resized", None)
            new = resized(new, value) if resized else P.set_key(new, key, value)
        cost = {
            "sizes": {".".join(k): v for k, v in sizes.items()},
            "plan": plan(new, registry, throughput),
        }
    notes = [n for d in ds for n in d.notes]
    adaptive_part = None
    if adaptive(args, config):
        adaptive_part = _adaptive(config, registry, throughput, ds, rows, kw, plan)
    return {
        "adaptive": adaptive_part,
        "level": opts["level"],
        "power": opts["target_power"],
        "simulations": opts["simulations"],
        "seed": opts["seed"],
        "rows": [asdict(r) for r in rows],
        "targets": [asdict(q) for q in needs],
        "cost": cost,
        "configured": plan_result["totals"],
        "notes": notes,
    }


def workflow_sizes(as_run: dict[str, Any], d, at, rule) -> list[int] | None:
    """The cumulative sizes of design ``d``'s rounds as the workflow runs them at the cap
    ``at``, in the planner's knob; None where the benchmark has no rounds or one round."""
    from functools import reduce

    from stereolens.design import rounds

    plugins = {p.name: p for p in rounds.in_rounds(as_run)}
    bounds = rounds.sizes(as_run, plugins[d.benchmark], at) if d.benchmark in at.shards else []
    if len(bounds) > 1 or rule.rounds == 1:
        return [
            int(reduce(lambda c, k: c[k], d.knob, rounds.capped_config(as_run, {d.benchmark: b})))
            for b in bounds
        ]
    return None


def _adaptive(config, registry, throughput, ds, rows, kw, plan) -> dict[str, Any]:
    """The stopping rule on every design's world (stereolens.design.adaptive_plan), with
    the benchmark's GPU-hours at each round's size from the plan's own cost model."""
    from dataclasses import asdict

    from stereolens.design import adaptive_plan as AP
    from stereolens.design import rounds

    options = config["design"]["adaptive"]
    rule = AP.rule_from(options, kw["level"])
    # the workflow's cap (stereolens.design.rounds.budget): the benchmarks in rounds at the
    # shards the cap affords, the others at their configured size
    as_run = P.set_key(config, ("design", "mode"), "adaptive")
    at = rounds.budget(as_run, registry, throughput)
    plugins = {p.name: p for p in rounds.in_rounds(as_run)}
    out = []
    for d in ds:
        cache: dict[int, float | None] = {}

        def cost(n: int, d=d, cache=cache) -> float | None:
            if n not in cache:
                resized = getattr(d, "resized", None)
                new = resized(config, n) if resized else P.set_key(config, d.knob, n)
                got = [r for r in plan(new, registry, throughput)["rows"]
                       if r["benchmark"] == d.benchmark]  # fmt: skip
                hours = [r["gpu_hours"] for r in got]
                cache[n] = None if any(h is None for h in hours) else float(sum(hours))
            return cache[n]

        sizes = workflow_sizes(as_run, d, at, rule)
        mine = [r for r in rows if r.benchmark == d.benchmark] or None
        out += [asdict(r) for r in AP.plan_adaptive(d, rule, options, cost, sizes=sizes,
                                                   mde_rows=mine, **kw)]  # fmt: skip
    titles = {p.name: p.title for p in plugins.values()}
    text = rounds.describe_budget(at, titles)
    for p in plugins.values():
        if rule.rounds > 1 and len(rounds.sizes(as_run, p, at)) < 2:
            text += (
                f"; {p.title}'s shards allow one round, which the workflow refuses (make "
                f"{p.rounds.shard_key} smaller); the rounds above are the rule's sizes, not "
                "whole shards"
            )
    return {
        "rule": {**options, "draws": AP.DRAWS},
        "rows": out,
        "budget": asdict(at),
        "budget_text": text,
    }


def _count(n: int, label: str) -> str:
    """ "1 seed per prompt", "10 seeds per prompt"."""
    if n == 1:
        head, _, tail = label.partition(" ")
        label = (head[:-1] if head.endswith("s") else head) + (" " + tail if tail else "")
    return f"{n:,} {label}"


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    digits = 2 if unit.startswith("TVD") else 4
    return f"{v:.{digits}f}"


def format_report(result: dict[str, Any]) -> str:
    """Plain text: the MDE table, how each effect was computed, targets and their cost."""
    out: list[str] = []
    lv, pw, sims = result["level"], result["power"], result["simulations"]
    rows = result["rows"]
    if rows:
        out.append("")
        out.append(
            f"Minimum detectable effects ({pw:.0%} power, level {lv:g}) at the configured sizes"
        )
        head = ("effect", "compares", "size", "MDE", "MDE (Holm)", "unit", "no-effect rate",
                "basis")  # fmt: skip
        lines = []
        for r in rows:
            mde = (
                _fmt(r["mde"], r["unit"])
                if r["mde"] is not None
                else "n/a"
                if r["status"] == "invalid"
                else f"> {_fmt(r['max_effect'], r['unit'])}"
            )
            comp = r["comparison"]
            if r["floor"] is not None:
                comp += f" (floor {r['floor']:.2f})"
            holm = "-"
            if r.get("family", 1) > 1:
                holm = _fmt(r["mde_holm"], r["unit"]) if r["mde_holm"] is not None else "n/a"
                holm += f" ({r['family']} pairs)"
            lines.append(
                (r["name"], comp, _count(r["size"], r["knob"]), mde, holm, r["unit"],
                 f"{r['size_rate']:.3f}", r["basis"].split(" ")[0])
            )  # fmt: skip
        widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(len(head))]

        def fmt(cells):
            return "  ".join(
                str(c).rjust(w) if i in (3, 4, 6) else str(c).ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ).rstrip()

        out += [fmt(head), fmt(["-" * w for w in widths]), *[fmt(x) for x in lines]]
        out.append("")
        out.append("How each effect was computed:")
        seen = set()
        for r in rows:
            key = (r["benchmark"], r["method"], r["definition"], r.get("estimand", ""))
            if key in seen:
                continue
            seen.add(key)
            names = [
                x["name"]
                for x in rows
                if (x["benchmark"], x["method"], x["definition"], x.get("estimand", "")) == key
            ]
            about = f"; estimand: {r['estimand']}" if r.get("estimand") else ""
            out.append(f"- {', '.join(names)}: {r['definition']}{about}; {r['method']}.")
        out.append(
            "- MDE: the population effect at which the test rejects in "
            f"{pw:.0%} of simulated datasets (linear between grid points); '> x': not reached "
            "up to the largest effect the world can plant. no-effect rate: how often the test "
            "rejects with no effect (the level if the estimator is unbiased; more means the "
            "run can report an effect that is not there); n/a: it rejects at least as often as "
            "the target power with no effect. MDE (Holm): the same at level / pairs, Holm's "
            "first step over the family of all model pairs of the metric, which the report's "
            "comparisons table adjusts over (stereolens.metrics.compare)."
        )
        loose = [r["name"] for r in rows if r["size_rate"] > 2 * lv]
        if loose:
            out.append(
                f"- At these sizes the test rejects in more than {2 * lv:g} of datasets with no "
                "effect for: " + ", ".join(loose) + ". Its intervals are not to be trusted "
                "there; a larger run (or more roles) is needed before any MDE means much."
            )
    if result["targets"]:
        out.append("")
        out.append(
            f"Sample size for a target effect ({pw:.0%} power, level {lv:g}, "
            f"{sims} simulated datasets):"
        )
        for q in result["targets"]:
            label = q["knob_label"]
            if q["needed"] is None:
                out.append(f"- {q['name']}={q['target']:g}: not reachable: {q['note']}")
            else:
                out.append(
                    f"- {q['name']}={q['target']:g}: {_count(q['needed'], label)} (configured "
                    f"{q['configured']:,}); simulated power {q['power_at_needed']:.2f}"
                )
        cost = result["cost"]
        if cost and cost["sizes"]:
            t, c = cost["plan"]["totals"], result["configured"]
            sizes = ", ".join(f"{k} = {v:,}" for k, v in cost["sizes"].items())
            gh = f"{t['gpu_hours']:,.1f}" + ("" if t["gpu_hours_complete"] else "+?")
            cgh = f"{c['gpu_hours']:,.1f}" + ("" if c["gpu_hours_complete"] else "+?")
            out.append(
                f"That run ({sizes}): {t['jobs']:,} jobs, {t['model_calls']:,} model calls, "
                f"{gh} GPU-hours (configured: {c['jobs']:,} jobs, {cgh} GPU-hours)."
            )
    if result.get("adaptive"):
        from stereolens.design.adaptive_plan import format_rows

        out.append(format_rows(result["adaptive"]["rows"], result["adaptive"]["rule"]))
        out.append(f"- In the workflow: {result['adaptive']['budget_text']}.")
    if result["notes"]:
        out.append("")
        out += [f"Note: {n}" for n in result["notes"]]
    return "\n".join(out)
