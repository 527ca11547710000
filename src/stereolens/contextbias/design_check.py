"""ContextBias's power check: the planner's predicted power of a BI shift against
cluster_bootstrap's interval on attribute tables drawn from the planted world."""

from __future__ import annotations

from dataclasses import astuple

import numpy as np
import polars as pl

from stereolens.contextbias import design as C
from stereolens.contextbias import design_worlds as CW
from stereolens.design.check import CheckResult, CheckSize, check_result, predicted_power


def power_check(
    design: C.ContextBiasDesign, name: str, n: int, w: float, size: CheckSize
) -> CheckResult:
    """Predicted power of ``name`` against cluster_bootstrap's interval on ``datasets``
    attribute tables drawn directly from the planted world. At a level other than 0.05 the
    pipeline's 95% "bc-t" interval is widened about its centre to the 1 - level one
    (t_factor(R, 1 - level) / t_factor(R): the interval the same estimate and replicates
    give at that level); the basic and percentile intervals are checked at 0.05 only."""
    from stereolens.contextbias.bootstrap import cluster_bootstrap
    from stereolens.contextbias.intervals import t_factor

    datasets, sims, replicates, level, seed = astuple(size)
    stretch = 1.0
    if level != 0.05:
        if design.interval != "bc-t":
            raise ValueError(f"the {design.interval} interval is checked at level 0.05 only")
        roles = design.world.prompts.shape[0]
        stretch = t_factor(roles, 1.0 - level) / t_factor(roles)
    pred = predicted_power(design, name, n, w, sims, level, seed)
    rng = np.random.default_rng([seed, 202])
    _, by_role = C.draw_role_counts(design.world, n, datasets, rng, keep_roles=True, planted=w)
    level_name = {s.name: s for s in design.specs()}[name]
    model, cohort = _cb_row(level_name.name)
    out = []
    for d in range(datasets):
        table = CW.attributes_table(design.world, by_role, d)
        boot = cluster_bootstrap(
            table, replicates=replicates, seed=seed + d, k_definition=design.k_definition,
            overall=design.overall, single_label_bi=design.single_label_bi,
            interval=design.interval, min_roles=1,
        )  # fmt: skip
        # min_roles 1: the interval itself, also below the tables' minimum
        row = boot.filter(
            (pl.col("model") == model)
            & (pl.col("cohort") == cohort)
            & (pl.col("dimension") == "*")
            & (pl.col("comparison") == "CA-U - CF")
        )
        lo, hi = row["ci_low"][0], row["ci_high"][0]
        if lo is not None and stretch != 1.0:
            mid, half = (lo + hi) / 2, (hi - lo) / 2 * stretch
            lo, hi = mid - half, mid + half
        out.append(bool(lo is not None and (lo > 0 or hi < 0)))
    return check_result(design, name, n, w, pred, sims, out)


def _cb_row(name: str) -> tuple[str, str]:
    """(model, cohort) of the bootstrap row an effect name refers to."""
    if ":" in name:
        return name.split(":", 1)[1], "*"
    parts = name.split(".")
    cohort = parts[2] if len(parts) > 2 else "*"
    return "*", cohort
