"""Model-vs-model comparisons of one headline statistic: pairwise Wald intervals and tests from
the bootstrap standard error, Holm over the family, ranks with rank intervals and groups of
models that cannot be told apart; each benchmark supplies the estimates and replicates."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations
from pathlib import Path

import numpy as np
import polars as pl
from scipy import stats

COMPARISON_COLUMNS = [
    "benchmark", "metric", "scope", "model_a", "model_b", "relation", "estimate_a",
    "estimate_b", "difference", "se", "ci_low", "ci_high", "p_value", "p_adjusted",
    "adjustment", "reject", "paired", "resampling", "replicates", "level", "interval_note",
]  # fmt: skip
"""``interval_note``: why a pair's interval and test are withheld (:func:`withhold`); null
when they are printed."""
RANK_COLUMNS = [
    "benchmark", "metric", "scope", "model", "estimate", "better", "rank", "rank_low",
    "rank_high", "group", "n_models",
]  # fmt: skip
_TEXT = ("benchmark", "metric", "scope", "model_a", "model_b", "relation", "adjustment")
_TEXT += ("resampling", "model", "better", "interval_note")
_INT = ("replicates", "rank", "rank_low", "rank_high", "group", "n_models")
_BOOL = ("reject", "paired")


def _dtype(name: str) -> pl.DataType:
    if name in _TEXT:
        return pl.String
    if name in _INT:
        return pl.Int64
    if name in _BOOL:
        return pl.Boolean
    return pl.Float64


def empty_frame(columns: list[str]) -> pl.DataFrame:
    return pl.DataFrame(schema={c: _dtype(c) for c in columns})


def _pairs(models: list[str], variants: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(model_a, model_b, relation): a variant as (base, variant), other pairs alphabetical."""
    out = []
    for a, b in combinations(sorted(models), 2):
        if variants.get(a) == b:
            out.append((b, a, "variant_vs_base"))
        elif variants.get(b) == a:
            out.append((a, b, "variant_vs_base"))
        else:
            out.append((a, b, "pair"))
    return out


def holm(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values (as statsmodels'); NaN stays NaN, outside the family."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if ok.size:
        order = ok[np.argsort(p[ok], kind="stable")]
        m = order.size
        steps = p[order] * (m - np.arange(m))
        out[order] = np.minimum(np.maximum.accumulate(steps), 1.0)
    return out


def pairwise(
    estimates: Mapping[str, float],
    replicates: Mapping[str, np.ndarray],
    *,
    benchmark: str,
    metric: str,
    scope: str,
    better: str,
    paired: bool,
    resampling: str,
    variants: Mapping[str, str] | None = None,
    level: float = 0.95,
) -> pl.DataFrame:
    """One row per unordered pair of the models in ``estimates``: difference = b - a, se =
    sd over replicates of rep_b - rep_a, the interval +- z se, the Wald p-value, Holm's
    adjustment over this family and ``reject`` at 1 - ``level``. ``variants`` maps a variant
    to its base model (relation "variant_vs_base", base as model_a)."""
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', not {better!r}")
    models = sorted(estimates)
    missing = [m for m in models if m not in replicates]
    if missing:
        raise ValueError(f"{benchmark} {metric} {scope}: no replicates for model(s) {missing}")
    lengths = {len(np.asarray(replicates[m])) for m in models}
    if len(lengths) > 1:
        raise ValueError(
            f"{benchmark} {metric} {scope}: replicate counts differ between models {lengths}"
        )
    pairs = _pairs(models, variants or {})
    if not pairs:
        return empty_frame(COMPARISON_COLUMNS)
    z = stats.norm.ppf(0.5 + level / 2)
    rows = []
    for a, b, relation in pairs:
        ea, eb = float(estimates[a]), float(estimates[b])
        diff_reps = np.asarray(replicates[b], float) - np.asarray(replicates[a], float)
        diff_reps = diff_reps[np.isfinite(diff_reps)]
        d = eb - ea
        se = float(np.std(diff_reps, ddof=1)) if diff_reps.size > 1 else np.nan
        if np.isfinite(d) and np.isfinite(se) and se > 0:
            p = float(2 * stats.norm.sf(abs(d) / se))
        elif np.isfinite(d) and se == 0:
            p = 1.0 if d == 0 else 0.0
        else:
            p = np.nan
        rows.append(
            {
                "model_a": a,
                "model_b": b,
                "relation": relation,
                "estimate_a": ea,
                "estimate_b": eb,
                "difference": d,
                "se": se,
                "ci_low": d - z * se,
                "ci_high": d + z * se,
                "p_value": p,
            }
        )
    frame = pl.DataFrame(rows)
    adjusted = holm(frame["p_value"].to_numpy())
    return frame.with_columns(
        pl.lit(benchmark).alias("benchmark"),
        pl.lit(metric).alias("metric"),
        pl.lit(scope).alias("scope"),
        pl.Series("p_adjusted", adjusted),
        pl.lit("holm").alias("adjustment"),
        pl.Series("reject", np.nan_to_num(adjusted, nan=1.0) < 1 - level),
        pl.lit(paired).alias("paired"),
        pl.lit(resampling).alias("resampling"),
        pl.lit(len(next(iter(replicates.values()))), dtype=pl.Int64).alias("replicates"),
        pl.lit(level).alias("level"),
        pl.lit(None, pl.String).alias("interval_note"),
    ).select([pl.col(c).cast(_dtype(c)) for c in COMPARISON_COLUMNS])


WITHHELD = ("ci_low", "ci_high", "p_value", "p_adjusted", "reject")
"""The columns of a withheld pair left null (its ``interval_note`` says why)."""


def withhold(comparisons: pl.DataFrame, notes: Mapping[str, str | None]) -> pl.DataFrame:
    """A :func:`pairwise` family with the pairs of a model noted in ``notes`` withheld
    (WITHHELD columns null), Holm and ``reject`` recomputed over the pairs still tested."""
    row_notes = [
        notes.get(a) or notes.get(b)
        for a, b in zip(comparisons["model_a"], comparisons["model_b"], strict=True)
    ]
    note = pl.Series("interval_note", row_notes, dtype=pl.String)
    if not note.is_not_null().any():
        return comparisons
    kept = note.is_null().to_numpy()
    out = comparisons.with_columns(note).with_columns(
        pl.when(pl.col("interval_note").is_null()).then(pl.col(c)).otherwise(None).alias(c)
        for c in WITHHELD
    )
    adjusted = holm(np.where(kept, comparisons["p_value"].to_numpy().astype(float), np.nan))
    level = float(comparisons["level"][0])
    reject = np.nan_to_num(adjusted, nan=1.0) < 1 - level
    return out.with_columns(
        pl.Series("p_adjusted", adjusted).fill_nan(None),
        pl.Series("reject", [bool(r) if k else None for k, r in zip(kept, reject, strict=True)],
                  dtype=pl.Boolean),
    )  # fmt: skip


def ranks(comparisons: pl.DataFrame, estimates: Mapping[str, float], better: str) -> pl.DataFrame:
    """Each model's rank (1 = least biased, ties share the best) among the models with a
    finite estimate, its rank interval from the Holm decisions of ``comparisons`` (one
    :func:`pairwise` family), and groups: a model starts a new group where it differs
    significantly from the current group's first."""
    models = sorted(m for m, v in estimates.items() if np.isfinite(v))
    if not models:
        return empty_frame(RANK_COLUMNS)
    sign = 1.0 if better == "lower" else -1.0
    badness = {m: sign * float(estimates[m]) for m in models}
    k = len(models)
    order = sorted(models, key=lambda m: (badness[m], m))
    rank = dict(
        zip(models, stats.rankdata([badness[m] for m in models], method="min"), strict=True)
    )
    differs: dict[tuple[str, str], bool] = {}
    for r in comparisons.iter_rows(named=True):
        differs[(r["model_a"], r["model_b"])] = differs[(r["model_b"], r["model_a"])] = bool(
            r["reject"]
        )
    better_than = {m: 0 for m in models}
    worse_than = {m: 0 for m in models}
    for a, b in combinations(models, 2):
        if differs.get((a, b), False):
            lo, hi = (a, b) if badness[a] < badness[b] else (b, a)
            better_than[hi] += 1  # lo is significantly less biased than hi
            worse_than[lo] += 1
    group, leader, groups = 1, order[0], {}
    for m in order:
        if m != leader and differs.get((leader, m), False):
            group, leader = group + 1, m
        groups[m] = group
    first = comparisons.row(0, named=True) if comparisons.height else {}
    rows = [
        {
            "benchmark": first.get("benchmark", ""),
            "metric": first.get("metric", ""),
            "scope": first.get("scope", ""),
            "model": m,
            "estimate": float(estimates[m]),
            "better": better,
            "rank": int(rank[m]),
            "rank_low": 1 + better_than[m],
            "rank_high": k - worse_than[m],
            "group": groups[m],
            "n_models": k,
        }
        for m in order
    ]
    return pl.DataFrame(rows).select([pl.col(c).cast(_dtype(c)) for c in RANK_COLUMNS])


def compare(
    estimates: Mapping[str, float],
    replicates: Mapping[str, np.ndarray],
    withheld: Mapping[str, str | None] | None = None,
    **kwargs,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """pairwise with ``withheld``'s pairs withheld (withhold), and the ranks of the rest."""
    cmp = withhold(pairwise(estimates, replicates, **kwargs), withheld or {})
    rk = ranks(cmp, estimates, kwargs["better"])
    return cmp, rk.with_columns(
        pl.lit(kwargs["benchmark"]).alias("benchmark"),
        pl.lit(kwargs["metric"]).alias("metric"),
        pl.lit(kwargs["scope"]).alias("scope"),
    )


def concat(frames: list[pl.DataFrame], columns: list[str]) -> pl.DataFrame:
    frames = [f for f in frames if f.height]
    return pl.concat(frames, how="vertical") if frames else empty_frame(columns)


def write_comparison_tables(
    comparisons: list[pl.DataFrame], rank_frames: list[pl.DataFrame], out_dir: str | Path
) -> None:
    """out_dir/comparisons.parquet and ranks.parquet (atomic; written also when empty)."""
    from stereolens.tables import write_tables

    write_tables(
        out_dir,
        {
            "comparisons.parquet": concat(comparisons, COMPARISON_COLUMNS),
            "ranks.parquet": concat(rank_frames, RANK_COLUMNS),
        },
    )
