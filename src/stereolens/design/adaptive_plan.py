"""The planner's adaptive mode (`stereolens plan --adaptive`): the stopping rule simulated on each
benchmark's planner world, its GPU-hours (median, 90th percentile) beside the fixed design's
(docs/planner.md, "How the planner simulates rounds")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from stereolens.design import adaptive as A
from stereolens.design import power as P

DRAWS = 4000
"""Simulated adaptive runs per world (normal draws: cheap; the Monte Carlo error of a share
of 0.05 is 0.003)."""


@dataclass
class WorldResult:
    world: str
    """``no effect``, ``effect = MDE`` or ``effect = 2 x MDE`` (the fixed design's MDE at the
    cap)."""
    effect: float
    stop_share: list[float]
    """Share of runs stopping after each round."""
    settled: float
    """Share of runs whose goal is settled (not stopped by the cap)."""
    rejects: float
    """Share whose RCI at the stop excludes the null (type-I error under no effect)."""
    coverage: float
    """Share whose RCI at the stop covers the population effect."""
    size_median: float
    size_p90: float
    gpu_hours_median: float | None
    gpu_hours_p90: float | None
    fixed_rejects: float
    """The fixed design at the cap: its 95% interval excludes the null."""
    fixed_coverage: float


@dataclass
class AdaptiveRow:
    name: str
    benchmark: str
    comparison: str
    unit: str
    goal: str
    knob: str
    sizes: list[int]
    critical: list[float]
    """c_k under no effect (the information ratios of the null world)."""
    mde: float | None
    fixed_gpu_hours: float | None
    worlds: list[WorldResult] = field(default_factory=list)
    note: str = ""


def goal_for(spec: P.EffectSpec, options: dict[str, Any], mde: float | None) -> A.Goal | None:
    """The goal of one headline effect from ``design.adaptive``: None where the config
    gives it no target (goal width without a width for it)."""
    kind = options["goal"]
    width = (options.get("width") or {}).get(spec.name)
    margin = (options.get("margin") or {}).get(spec.name)
    if kind == "width":
        return A.Goal("width", width=float(width), null=spec.null_value) if width else None
    if kind == "equivalence":
        margin = margin or mde
        if not margin:
            return None
        return A.Goal("equivalence", margin=float(margin), null=spec.null_value)
    return A.Goal("difference", margin=float(margin) if margin else None, null=spec.null_value)


def _describe(goal: A.Goal, unit: str) -> str:
    if goal.kind == "width":
        return f"RCI width <= {goal.width:g} {unit}"
    if goal.kind == "equivalence":
        return f"RCI within {goal.null:g} +- {goal.margin:g} {unit}"
    tail = f", or within +- {goal.margin:g}" if goal.margin else ""
    return f"RCI excludes {goal.null:g}{tail}"


def to_t(critical: np.ndarray, df: int | None) -> np.ndarray:
    """The critical values on t(df) (the pipeline's interval with few clusters: ContextBias's
    roles - 1) at the same two-sided tail probability; unchanged without df."""
    if not df:
        return np.asarray(critical, dtype=float)
    return stats.t.isf(stats.norm.sf(critical), df)


def plan_adaptive(
    design: P.Design,
    rule: A.Rule,
    options: dict[str, Any],
    cost: Callable[[int], float | None],
    *,
    cap: int | None = None,
    level: float = P.DEFAULT_LEVEL,
    power: float = P.DEFAULT_POWER,
    sims: int = P.DEFAULT_SIMULATIONS,
    seed: int = P.DEFAULT_SEED,
    draws: int = DRAWS,
    mde_rows: list[P.Row] | None = None,
    sizes: list[int] | None = None,
) -> list[AdaptiveRow]:
    """The rule on ``design``'s world for every effect with an interval test, at ``sizes``
    (default ``rule.sizes(cap)``), with no effect, the fixed design's MDE and twice it;
    ``cost(size)``: the benchmark's GPU-hours."""
    sizes = list(sizes) if sizes else rule.sizes(cap or design.knob_value)
    rows = mde_rows
    if rows is None:
        rows = P.mde_rows(design, level=level, power=power, sims=sims, seed=seed)
    mde = {r.name: r.mde for r in rows}
    specs = [s for s in design.specs() if s.test == "interval"]
    out: list[AdaptiveRow] = []
    plans: list[tuple[P.EffectSpec, A.Goal, list[tuple[str, float, float]]]] = []
    ws: set[float] = {0.0}

    def new_row(spec: P.EffectSpec, goal: str, m: float | None, gpu_hours=None, note=""):
        return AdaptiveRow(
            spec.name, spec.benchmark, spec.comparison, spec.unit, goal, design.knob_label,
            sizes, [], m, gpu_hours, note=note,
        )  # fmt: skip

    for spec in design.specs():
        if spec.test != "interval":
            note = f"runs fixed: its {spec.test} test (calibrated on the world's null) "
            out.append(
                new_row(spec, "-", mde.get(spec.name), note=note + "has no interval to repeat")
            )
    for spec in specs:
        m = mde.get(spec.name)
        goal = goal_for(spec, options, m)
        if goal is None:
            note = f"no {options['goal']} target in design.adaptive"
            out.append(new_row(spec, "-", m, note=note))
            continue
        worlds = [("no effect", 0.0, 0.0)]
        for label, k in (("effect = MDE", 1.0), ("effect = 2 x MDE", 2.0)):
            w = P.invert_effect(design, spec.name, k * m) if m else None
            if w is not None:
                worlds.append((label, float(k * m), float(w)))
                ws.add(float(w))
        plans.append((spec, goal, worlds))
    if not plans:
        return out
    grid = np.array(sorted(ws))
    rng = np.random.default_rng([seed, P._stream(design.benchmark), 23])
    mean = {s.name: np.empty((len(grid), len(sizes))) for s, _, _ in plans}
    var = {s.name: np.empty((len(grid), len(sizes))) for s, _, _ in plans}
    for k, n in enumerate(sizes):
        sim = design.simulate(n, grid, sims, rng)
        for spec, _, _ in plans:
            est = sim.estimates[spec.name]
            shift = sim.shift.get(spec.name)
            centre = est if shift is None else est + P._per_dataset(shift)
            with np.errstate(invalid="ignore"):
                mean[spec.name][:, k] = np.nanmean(centre, axis=1)
                # the variance of the estimate: an emulated bootstrap's se where the design
                # has one (BiasIG; ContextBias's bc-t rows below FEW_ROLES roles, its mean
                # se^2 over the datasets), else the spread over the datasets; the t(df) quantile of
                # the pipeline's interim interval is taken by to_t below (sim.t_df is for
                # power_curve: not multiplied in here, or t would count twice)
                sc = sim.scale.get(spec.name)
                var[spec.name][:, k] = (
                    np.nanvar(est, axis=1, ddof=1)
                    if sc is None
                    else np.nanmean(P._per_dataset(sc) ** 2, axis=1)
                )
    costs = np.array([cost(n) if cost else None for n in sizes], dtype=object)
    known = all(c is not None for c in costs)
    z = stats.norm.isf(level / 2)
    for spec, goal, worlds in plans:
        bad = ~(np.isfinite(var[spec.name]) & (var[spec.name] > 0) & np.isfinite(mean[spec.name]))
        if bad.any():
            note = "not simulated: the world's estimate is undefined or has no spread at "
            note += f"sizes {sizes} (too small a run)"
            out.append(new_row(spec, _describe(goal, spec.unit), mde[spec.name], note=note))
            continue
        gpu_hours = costs[-1] if known else None
        row = new_row(spec, _describe(goal, spec.unit), mde[spec.name], gpu_hours)
        for label, effect, w in worlds:
            i = int(np.flatnonzero(grid == w)[0])
            v = np.minimum.accumulate(var[spec.name][i])
            mu = mean[spec.name][i]
            crit = to_t(rule.critical(sizes, info=1.0 / v), spec.df)
            if label == "no effect":
                row.critical = [float(c) for c in crit]
            est = A.nested_estimates(mu, v, draws, rng)
            res = A.run_rule(est, np.sqrt(v), crit, goal)
            truth = effect + spec.null_value
            n_stop = np.asarray(sizes)[res.stop_round]
            gh = np.array([float(c) for c in costs])[res.stop_round] if known else None
            zf = float(to_t(np.array([z]), spec.df)[0])
            fixed_lo, fixed_hi = est[:, -1] - zf * np.sqrt(v[-1]), est[:, -1] + zf * np.sqrt(v[-1])
            row.worlds.append(
                WorldResult(
                    world=label,
                    effect=effect,
                    stop_share=np.bincount(res.stop_round, minlength=len(sizes)).tolist(),
                    settled=float(np.mean(res.reason != "cap reached")),
                    rejects=float(res.rejects(spec.null_value).mean()),
                    coverage=float(res.covers(truth).mean()),
                    size_median=float(np.median(n_stop)),
                    size_p90=float(np.quantile(n_stop, 0.9)),
                    gpu_hours_median=float(np.median(gh)) if gh is not None else None,
                    gpu_hours_p90=float(np.quantile(gh, 0.9)) if gh is not None else None,
                    fixed_rejects=float(
                        np.mean((fixed_lo > spec.null_value) | (fixed_hi < spec.null_value))
                    ),
                    fixed_coverage=float(np.mean((fixed_lo <= truth) & (truth <= fixed_hi))),
                )
            )
            row.worlds[-1].stop_share = [c / draws for c in row.worlds[-1].stop_share]
        out.append(row)
    return out


def rule_from(options: dict[str, Any], level: float) -> A.Rule:
    """The Rule of a config's ``design.adaptive`` section."""
    return A.Rule(
        rounds=int(options["rounds"]),
        first_fraction=float(options["first_fraction"]),
        spending=options["spending"],
        gamma=float(options["gamma"]),
        alpha=level,
        timing=options.get("timing", "information"),
    )


def _gh(v: float | None) -> str:
    return "?" if v is None else f"{v:,.1f}"


def format_rows(rows: list[dict[str, Any]], rule: dict[str, Any]) -> str:
    """Plain text: per effect its rounds, boundaries, stopping sizes and GPU-hours per world."""
    out = [
        "",
        f"Adaptive design ({rule['rounds']} rounds from {rule['first_fraction']:g} of the cap, "
        f"{rule['spending']} spending on {rule.get('timing', 'size')} time; repeated 95% "
        "confidence intervals, "
        f"{rule['draws']:,} simulated runs per world; GPU-hours of the benchmark):",
    ]
    for r in rows:
        if r["note"]:
            out.append(f"- {r['name']}: {r['note']}")
            continue
        sizes = ", ".join(str(n) for n in r["sizes"])
        crit = ", ".join(f"{c:.3f}" for c in r["critical"])
        out.append(
            f"- {r['name']} ({r['comparison']}); goal: {r['goal']}; rounds at {sizes} "
            f"{r['knob']} (c_k {crit}); fixed design at the cap: {_gh(r['fixed_gpu_hours'])} "
            "GPU-hours"
        )
        for w in r["worlds"]:
            stops = "/".join(f"{s:.2f}" for s in w["stop_share"])
            out.append(
                f"    {w['world']:<17} ({w['effect']:.4g} {r['unit']}): GPU-hours median "
                f"{_gh(w['gpu_hours_median'])}, p90 {_gh(w['gpu_hours_p90'])} (size median "
                f"{w['size_median']:g}, p90 {w['size_p90']:g}); stops per round {stops}; "
                f"settled {w['settled']:.2f}; RCI excludes the null {w['rejects']:.3f} (fixed "
                f"{w['fixed_rejects']:.3f}), covers {w['coverage']:.3f} (fixed "
                f"{w['fixed_coverage']:.3f})"
            )
    return "\n".join(out)
