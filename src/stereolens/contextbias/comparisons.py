"""ContextBias comparisons between models: every pair of generators (and of extractors) on pooled
BI per condition and the CA-U - CF shift, from the role-level cluster bootstrap's replicates
(stereolens.metrics.compare; docs/statistics.md, "Model comparisons")."""

from __future__ import annotations

import numpy as np
import polars as pl

from stereolens.contextbias.bootstrap import LevelReplicates
from stereolens.contextbias.intervals import MIN_ROLES, withheld_note
from stereolens.contextbias.metrics import ALL, CONDITIONS, nanmean
from stereolens.metrics.compare import (
    COMPARISON_COLUMNS,
    RANK_COLUMNS,
    compare,
    concat,
    holm,
    pairwise,
    ranks,
    withhold,
)

BENCHMARK = "contextbias"
SHIFT = ("CA-U", "CF")
"""The headline shift, BI(CA-U) - BI(CF) (paper Tables 8-9)."""
METRICS = {
    "bi": "pooled BI (1 - H/log K) of one condition; lower = labels spread more evenly",
    "bi_shift": "BI(CA-U) - BI(CF); lower = the unrelated context concentrates labels less",
}
"""The compared metrics; lower is less biased for both."""
RANKS_WITHHELD = ("rank_low", "rank_high", "group")
"""The columns of ranks.parquet left null, with an interval_note, below the minimum number
of roles (comparisons.parquet: stereolens.metrics.compare.WITHHELD)."""


def resampling(draws: str, support: str = "own") -> str:
    """The ``resampling`` column: the role-level cluster bootstrap, its draws and (support
    "common") the label support and the bias correction of the compared values."""
    kind = "one role draw shared by all models" if draws == "paired" else "a draw per model"
    if support == "common":
        kind += "; K common to the compared models; bias-corrected; role jackknife se, t(R - 1)"
    return f"role cluster bootstrap ({kind})"


def _headline(lv: LevelReplicates) -> list[tuple[int, str]]:
    """(level index, scope name) of the headline levels: overall, then each cohort."""
    out = [(i, "overall") for i, (c, d) in enumerate(lv.levels) if c == ALL and d == ALL]
    out += [(i, c) for i, (c, d) in enumerate(lv.levels) if c != ALL and d == ALL]
    return out


def _statistic(lv: LevelReplicates, metric: str, level: int, condition: str):
    """(estimate (G,), replicates (G, B), leave-one-role-out values (G, R) or None) of one
    metric at one level; under support "common" the estimate is bias-corrected: 2 x the
    plug-in - the replicates' mean."""
    ci = {c: i for i, c in enumerate(CONDITIONS)}
    jk = lv.jackknife

    def pick(x: np.ndarray) -> np.ndarray:
        if metric == "bi":
            return x[..., level, ci[condition]]
        return x[..., level, ci[SHIFT[0]]] - x[..., level, ci[SHIFT[1]]]

    est, rep = pick(lv.estimate), pick(lv.replicates)
    if lv.support == "common":
        est = 2 * est - nanmean(rep, axis=1)
    return est, rep, None if jk is None else pick(jk)


def jackknife_se(values: np.ndarray) -> float:
    """The role jackknife's standard error, sqrt((R - 1) / R x sum (v_i - mean v)^2), of R
    leave-one-role-out values (NaN ones left out; NaN below 2)."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    r = v.size
    return float(np.sqrt((r - 1) / r * ((v - v.mean()) ** 2).sum())) if r > 1 else float("nan")


def _families():
    """(metric, scope prefix, condition) of every family, conditions first then the shift."""
    for cond in CONDITIONS:
        yield "bi", cond, cond
    yield "bi_shift", f"{SHIFT[0]} - {SHIFT[1]}", None


def _t_wald(
    cmp: pl.DataFrame, n_roles: int, level: float, jack: dict[str, np.ndarray]
) -> pl.DataFrame:
    """One family's Wald rows on t(R - 1) (R = the roles, the units resampled): se = the
    role jackknife's standard error of the difference (:func:`jackknife_se` of jack_b -
    jack_a; the bootstrap sd undercovered at 10-60 roles, bench/COVERAGE.md), ci =
    difference +- t(R - 1) quantile x se, p = 2 P(T > |d| / se), Holm and reject
    recomputed."""
    from scipy import stats

    if not cmp.height:
        return cmp
    pairs = zip(cmp["model_a"], cmp["model_b"], strict=True)
    se = np.array([jackknife_se(jack[b] - jack[a]) for a, b in pairs])
    d = cmp["difference"].to_numpy()
    df = max(n_roles - 1, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(se > 0, 2 * stats.t.sf(np.abs(d) / se, df), np.nan)
    p = np.where(se == 0, np.where(d == 0, 1.0, 0.0), p)
    p = np.where(np.isfinite(d) & np.isfinite(se) & (n_roles > 1), p, np.nan)
    half = (stats.t.ppf(0.5 + level / 2, df) if n_roles > 1 else np.nan) * se
    adjusted = holm(p)
    return cmp.with_columns(
        pl.Series("se", se),
        pl.Series("ci_low", d - half),
        pl.Series("ci_high", d + half),
        pl.Series("p_value", p),
        pl.Series("p_adjusted", adjusted),
        pl.Series("reject", np.nan_to_num(adjusted, nan=1.0) < 1 - level),
    )


def model_comparisons(
    lv: LevelReplicates, level: float = 0.95, min_roles: int = MIN_ROLES
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """comparisons.parquet and ranks.parquet of ContextBias from the bootstrap's level
    replicates (the CLI passes those of support "common"; see contextbias.bootstrap.SUPPORTS).
    Families, estimates and intervals: docs/outputs.md. Models whose estimate is undefined
    are left out of the family; with fewer than ``min_roles`` roles every pair is withheld
    (:func:`stereolens.metrics.compare.withhold`) and ``interval_note`` says why."""
    cmp_frames: list[pl.DataFrame] = []
    rank_frames: list[pl.DataFrame] = []
    paired = lv.draws == "paired"
    how = resampling(lv.draws, lv.support)
    note = withheld_note(lv.n_roles, min_roles)
    by_extractor: dict[tuple, list[int]] = {}
    by_generator: dict[str, list[int]] = {}
    for g, key in enumerate(lv.keys):
        by_extractor.setdefault(key[:-1], []).append(g)
        by_generator.setdefault(key[-1], []).append(g)
    groupings = [("", by_extractor, -1)]
    if len(by_extractor) > 1:
        groupings.append(("_extractor", {(m,): gs for m, gs in by_generator.items()}, 0))
    for suffix, groups, name_at in groupings:
        for outer, members in sorted(groups.items()):
            prefix = "".join(f"{v} / " for v in outer)
            for metric, head, cond in _families():
                for li, scope in _headline(lv):
                    est, rep, jk = _statistic(lv, metric, li, cond)
                    ok = [g for g in members if np.isfinite(est[g])]
                    if not ok:
                        continue
                    names = {g: lv.keys[g][name_at] for g in ok}
                    estimates = {names[g]: float(est[g]) for g in ok}
                    notes = dict.fromkeys(estimates, note)
                    family = {
                        "benchmark": BENCHMARK,
                        "metric": metric + suffix,
                        "scope": f"{prefix}{head} / {scope}",
                        "better": "lower",
                        "paired": paired,
                        "resampling": how,
                        "level": level,
                    }
                    if lv.support == "common":
                        cmp = pairwise(estimates, {names[g]: rep[g] for g in ok}, **family)
                        jack = {names[g]: jk[g] for g in ok}
                        cmp = withhold(_t_wald(cmp, lv.n_roles, level, jack), notes)
                        rk = ranks(cmp, estimates, "lower").with_columns(
                            pl.lit(family[c]).alias(c) for c in ("benchmark", "metric", "scope")
                        )
                    else:
                        reps = {names[g]: rep[g] for g in ok}
                        cmp, rk = compare(estimates, reps, withheld=notes, **family)
                    cmp_frames.append(cmp)
                    rank_frames.append(rk)
    rk = concat(rank_frames, RANK_COLUMNS)
    if note is not None:
        rk = rk.with_columns(pl.lit(None, rk.schema[c]).alias(c) for c in RANKS_WITHHELD)
    rk = rk.with_columns(pl.lit(note, pl.String).alias("interval_note"))
    return concat(cmp_frames, COMPARISON_COLUMNS), rk
