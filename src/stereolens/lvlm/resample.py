"""Resampling of the LVLM scores: the paired bootstrap's weights, the permutation null's shuffled
labels, and the noise-floor bracket interval drawn from the bootstrap replicates
(docs/statistics.md, "LVLM intervals")."""

from __future__ import annotations

import numpy as np

from stereolens.ids import stable_id
from stereolens.metrics.withheld import withheld_note as note

MIN_IMAGES_PER_GROUP = 30
"""The default of ``lvlm.metrics.interval_min_images_per_group``: below this many user images
per group (term: image pairs) a score, comparison or refusal difference prints no interval
(``interval_note`` says why); measured in bench/COVERAGE.md, "LVLM, minimum size"."""
WHY = "the smallest size at which the LVLM intervals cover >= 93%"
"""Why MIN_IMAGES_PER_GROUP, in the ``interval_note``."""


def images_per_group(codes: np.ndarray, n_groups: int, boot_strata: bool, n_units: int) -> int:
    """User images per group of one score's units: the pairs (term: the k-th image of every
    group), else the fewest units of any group."""
    if boot_strata:
        return int(n_units)
    return int(np.bincount(codes, minlength=n_groups).min()) if n_groups else 0


def withheld_note(n: int, minimum: int) -> str | None:
    """The ``interval_note`` of a design with ``n`` images per group: None at or above
    ``minimum``, else why the interval is withheld
    (:func:`stereolens.metrics.withheld.withheld_note`)."""
    return note(n, minimum, "images per group", WHY)


INTERVAL = (
    "noise-floor bracket [score - null_mean + q_lo - m, score + q_hi - m] (q: quantiles, m: "
    "mean of the paired bootstrap over user images; term: image pairs), clipped to [0, 100]"
)
INTERVAL_NO_NULL = (
    "percentile interval of the paired bootstrap moved onto the score, [score + q_lo - m, "
    "score + q_hi - m] (no permutation null: the bias is not bracketed)"
)


def resample_weights(codes: np.ndarray | None, n: int, n_boot: int, rng) -> np.ndarray:
    """[n_boot, n] resampling counts; units are resampled within their group when codes given
    (group sizes fixed), else over all units."""
    w = np.zeros((n_boot, n))
    groups = (
        [np.arange(n)] if codes is None else [np.flatnonzero(codes == g) for g in np.unique(codes)]
    )
    for idx in groups:
        k = len(idx)
        draws = rng.integers(0, k, size=(n_boot, k)) + (np.arange(n_boot) * k)[:, None]
        w[:, idx] = np.bincount(draws.ravel(), minlength=n_boot * k).reshape(n_boot, k)
    return w


def permuted_codes(codes: np.ndarray, strata: np.ndarray, n: int, rng) -> np.ndarray:
    """[n, U] group codes shuffled within each stratum (group sizes per stratum kept)."""
    out = np.empty((n, codes.size), dtype=np.int64)
    order = np.argsort(strata, kind="stable")
    bounds = np.flatnonzero(np.diff(strata[order])) + 1
    for idx in np.split(order, bounds):
        out[:, idx] = rng.permuted(np.broadcast_to(codes[idx], (n, idx.size)), axis=1)
    return out


def stream(kind: str, seed: int, *key: str) -> np.random.Generator:
    """A random stream of its own per ``key`` (the permutation null: per model, task and axis;
    the paired bootstrap: per task and axis)."""
    return np.random.default_rng([seed, int(stable_id(kind, *key, length=15), 16)])


def shared_units(keys: list[np.ndarray], codes: list[np.ndarray | None]):
    """The union of the resampled units of several models: (union keys (V,), union group
    codes (V,) or None, per model the index of each of its units in the union)."""
    allk = np.concatenate([np.asarray(k, dtype=str) for k in keys]) if keys else np.zeros(0, str)
    union, first = np.unique(allk, return_index=True)
    ucodes = None
    if codes and codes[0] is not None:
        ucodes = np.concatenate(codes)[first]
    return union, ucodes, [np.searchsorted(union, np.asarray(k, dtype=str)) for k in keys]


def bracket_interval(
    score: float, reps: np.ndarray, level: float, null_mean: float
) -> tuple[float, float, float]:
    """(score_bc, ci_low, ci_high) from the bootstrap replicates and the permutation null's
    mean (see the module docstring); NaNs when no replicate is finite."""
    reps = reps[np.isfinite(reps)]
    floor = null_mean if np.isfinite(null_mean) else 0.0
    bc = float(score - floor) if np.isfinite(null_mean) else float("nan")
    if not reps.size or not np.isfinite(score):
        return bc, float("nan"), float("nan")
    a = (1 - level) / 2
    q_lo, q_hi = np.quantile(reps, [a, 1 - a]) - reps.mean()
    lo = float(np.clip(score - floor + q_lo, 0.0, 100.0))
    hi = float(np.clip(score + q_hi, 0.0, 100.0))
    return bc, lo, hi
