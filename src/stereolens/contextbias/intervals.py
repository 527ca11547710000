"""The 95% intervals of the ContextBias role bootstrap (bootstrap.parquet's and the model
comparisons') and the minimum design below which none is printed."""

from __future__ import annotations

import numpy as np

from stereolens.metrics.withheld import withheld_note as note

BOOTSTRAP_INTERVALS = ("bc-t", "basic", "percentile")
"""The 95% interval of bootstrap.parquet: "bc-t" (default) = estimate_bc +- t(R - 1) x the
replicates' sd x sqrt(R / (R - 1)), R = the roles; "basic" = 2 x estimate - the 97.5 and 2.5
percentiles of the replicates; "percentile" = the 2.5 and 97.5 percentiles, as the released
code (coverage of each: bench/COVERAGE.md)."""
MIN_ROLES = 10
"""The smallest number of roles from which the role bootstrap's intervals cover as at paper
scale on the planner's prior world (bench/COVERAGE.md, ContextBias); below it
bootstrap.parquet and comparisons.parquet print no interval (config
contextbias.metrics.interval_min_roles)."""
WHY = "the smallest number of roles at which the role bootstrap's intervals cover as at paper scale"
"""Why MIN_ROLES, in the ``interval_note``."""


def withheld_note(n_roles: int, min_roles: int) -> str | None:
    """The ``interval_note`` of a design with ``n_roles`` roles: None when it has at least
    ``min_roles``, else why its interval is withheld
    (:func:`stereolens.metrics.withheld.withheld_note`)."""
    unit = "role" if n_roles == 1 else "roles"
    return note(n_roles, min_roles, unit, WHY)


def t_factor(n_roles: int, level: float = 0.95) -> float:
    """t(R - 1) quantile x sqrt(R / (R - 1)): what multiplies the replicates' sd in the
    "bc-t" interval (R = the roles; NaN below 2 roles)."""
    from scipy import stats

    if n_roles < 2:
        return float("nan")
    return float(stats.t.ppf(0.5 + level / 2, n_roles - 1) * np.sqrt(n_roles / (n_roles - 1)))


def interval(
    estimate: np.ndarray, replicates: np.ndarray, kind: str, n_roles: int, axis: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """(ci_low, ci_high) of ``kind`` (BOOTSTRAP_INTERVALS) from the estimate and the
    replicates along ``axis`` (NaN replicates ignored)."""
    if kind not in BOOTSTRAP_INTERVALS:
        raise ValueError(f"interval {kind!r}; allowed: {', '.join(BOOTSTRAP_INTERVALS)}")
    if kind == "bc-t":
        centre = 2 * estimate - np.nanmean(replicates, axis=axis)
        half = t_factor(n_roles) * np.nanstd(replicates, axis=axis, ddof=1)
        return centre - half, centre + half
    lo, hi = np.nanpercentile(replicates, [2.5, 97.5], axis=axis)
    if kind == "basic":
        return 2 * estimate - hi, 2 * estimate - lo
    return lo, hi
