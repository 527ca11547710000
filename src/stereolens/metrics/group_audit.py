"""Error rates of a reader (an attribute extractor, the LVLM's story assistant) per
demographic group: per group, accuracy (= recall) and precision with Wilson intervals and F1
with a percentile bootstrap over items; per grouping, the largest error-rate gap between two
groups with a Newcombe interval, a test of difference (chi-squared, or Fisher's exact test
for two groups with an expected count below 5) and the flag against the bias the reader is
used to measure (issue 15, item 4). The benchmarks' audits build the item tables:
:mod:`stereolens.contextbias.extraction_audit`, :mod:`stereolens.lvlm.story_reading`."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
from scipy import stats

RATE_COLUMNS = [
    "extractor", "model", "grouping", "group_dimension", "group", "n_items", "n_correct",
    "n_false_positive", "accuracy", "accuracy_low", "accuracy_high", "recall", "precision",
    "precision_low", "precision_high", "f1", "f1_low", "f1_high",
]  # fmt: skip
GAP_COLUMNS = [
    "extractor", "model", "grouping", "group_dimension", "n_groups", "n_items", "worst_group",
    "best_group", "error_gap", "gap_low", "gap_high", "test", "p_value", "bias", "bias_source",
    "flag", "flag_text",
]  # fmt: skip


def wilson(k: np.ndarray, n: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of k / n (NaN where n = 0)."""
    from statsmodels.stats.proportion import proportion_confint

    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    lo = np.full(k.shape, np.nan)
    hi = np.full(k.shape, np.nan)
    ok = n > 0
    if ok.any():
        lo[ok], hi[ok] = proportion_confint(k[ok], n[ok], alpha=1 - level, method="wilson")
    return lo, hi


def f1_interval(
    correct: np.ndarray, false_pos: np.ndarray, replicates: int, seed: int, level: float = 0.95
) -> tuple[float, float, float]:
    """F1 = 2 P R / (P + R) of items (correct: TP per item, false_pos: FP per item) with a
    percentile bootstrap interval over items (seeded; vectorised)."""
    correct = np.asarray(correct, dtype=float)
    false_pos = np.asarray(false_pos, dtype=float)

    def f1(tp, fp, n):
        with np.errstate(invalid="ignore", divide="ignore"):
            p = tp / (tp + fp)
            r = tp / n
            out = np.where(p + r > 0, 2 * p * r / (p + r), 0.0)
        return np.where((n > 0) & np.isfinite(p), out, np.nan)

    n = correct.size
    point = float(f1(correct.sum(), false_pos.sum(), n))
    if n == 0 or replicates <= 0:
        return point, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(replicates, n))
    boot = f1(correct[idx].sum(1), false_pos[idx].sum(1), np.full(replicates, n))
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return point, float("nan"), float("nan")
    a = (1 - level) / 2
    lo, hi = np.quantile(boot, [a, 1 - a])
    return point, float(lo), float(hi)


def with_pooled(items: pl.DataFrame) -> pl.DataFrame:
    """Items plus model "*" (every generator pooled) when there are several models."""
    if items["model"].n_unique() < 2:
        return items
    return pl.concat([items, items.with_columns(pl.lit("*").alias("model"))])


def group_rates(
    items: pl.DataFrame,
    *,
    keys: tuple[str, ...] = ("extractor", "model", "grouping", "group_dimension"),
    level: float = 0.95,
    replicates: int = 1000,
    seed: int = 0,
) -> pl.DataFrame:
    """Per ``keys`` x group: items, accuracy and recall (Wilson), precision (Wilson), F1
    (bootstrap over items). ``items`` columns: keys, group, correct (0/1), false_positive
    (count per item)."""
    rows = []
    items = items.sort(pl.all())  # joins and group_by leave row order open: fix it (seeds)
    for key, sub in items.group_by([*keys, "group"], maintain_order=True):
        c = sub["correct"].to_numpy()
        fp = sub["false_positive"].to_numpy()
        f1, f1_lo, f1_hi = f1_interval(c, fp, replicates, seed, level)
        rows.append(dict(zip([*keys, "group"], key, strict=True)) | {
            "n_items": int(c.size), "n_correct": int(c.sum()), "n_false_positive": int(fp.sum()),
            "f1": f1, "f1_low": f1_lo, "f1_high": f1_hi,
        })  # fmt: skip
    out = pl.DataFrame(rows)
    if out.height == 0:
        return out
    n, k, fp = (out[c].to_numpy() for c in ("n_items", "n_correct", "n_false_positive"))
    a_lo, a_hi = wilson(k, n, level)
    p_lo, p_hi = wilson(k, k + fp, level)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(n > 0, k / np.maximum(n, 1), np.nan)
        prec = np.where(k + fp > 0, k / np.maximum(k + fp, 1), np.nan)
    out = out.with_columns(
        pl.Series("accuracy", acc), pl.Series("accuracy_low", a_lo),
        pl.Series("accuracy_high", a_hi), pl.Series("recall", acc),
        pl.Series("precision", prec), pl.Series("precision_low", p_lo),
        pl.Series("precision_high", p_hi),
    ).with_columns(pl.col(pl.Float64).fill_nan(None))  # fmt: skip
    return out.sort([*keys, "group"])


def difference_test(correct: np.ndarray, total: np.ndarray) -> tuple[str, float]:
    """(test, p) of equal accuracy across groups from per-group correct and total counts:
    Fisher's exact test for two groups with an expected count below 5, else Pearson's
    chi-squared on the groups x (correct, wrong) table; p = 1 when accuracy is the same
    everywhere (a constant column)."""
    table = np.stack([correct, total - correct], axis=1).astype(float)
    if table.shape[0] < 2 or (table.sum(0) == 0).any():
        return "none (one outcome only)", 1.0
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    if table.shape[0] == 2 and (expected < 5).any():
        return "fisher exact", float(stats.fisher_exact(table.astype(int))[1])
    chi2, p, _, _ = stats.chi2_contingency(table, correction=False)
    return "chi-squared", float(p)


def group_gaps(
    rates: pl.DataFrame,
    *,
    keys: tuple[str, ...] = ("extractor", "model", "grouping", "group_dimension"),
    level: float = 0.95,
    bias: Any = None,
    bias_source: str = "",
    test: Any = None,
    min_items: int = 1,
    measured: str = "the bias",
) -> pl.DataFrame:
    """Per ``keys``: the largest error-rate gap between two groups (Newcombe interval), the
    difference test (``test(sub) -> (name, p)``, default :func:`difference_test` on the
    rates), and the flag against ``bias(key dict) -> float | None`` (absolute value)."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    rows = []
    for key, sub in rates.filter(pl.col("n_items") >= min_items).group_by(
        list(keys), maintain_order=True
    ):
        if sub.height < 2:
            continue
        err = 1 - sub["accuracy"].to_numpy()
        worst, best = int(np.argmax(err)), int(np.argmin(err))
        n = sub["n_items"].to_numpy()
        k = sub["n_correct"].to_numpy()
        gap = float(err[worst] - err[best])
        # error of worst minus error of best = accuracy of best minus accuracy of worst
        lo, hi = confint_proportions_2indep(
            k[best], n[best], k[worst], n[worst], method="newcomb", compare="diff",
            alpha=1 - level,
        )  # fmt: skip
        name, p = test(sub) if test is not None else difference_test(k, n)
        kd = dict(zip(keys, key, strict=True))
        b = None if bias is None else bias(kd)
        flag = b is not None and np.isfinite(b) and gap > abs(b)
        groups = sub["group"].to_list()
        text = ""
        if flag:
            text = (
                f"error differs between {groups[worst]} and {groups[best]} by {gap:.3f} "
                f"(p = {p:.3g}), more than {measured} it is used to measure ({abs(b):.3f})"
            )
        rows.append(kd | {
            "n_groups": sub.height, "n_items": int(n.sum()), "worst_group": groups[worst],
            "best_group": groups[best], "error_gap": gap, "gap_low": float(lo),
            "gap_high": float(hi), "test": name, "p_value": p,
            "bias": None if b is None else abs(float(b)),
            "bias_source": None if b is None else bias_source,
            "flag": bool(flag), "flag_text": text,
        })  # fmt: skip
    schema = {c: pl.String for c in keys} | {
        "n_groups": pl.Int64, "n_items": pl.Int64, "worst_group": pl.String,
        "best_group": pl.String, "error_gap": pl.Float64, "gap_low": pl.Float64,
        "gap_high": pl.Float64, "test": pl.String, "p_value": pl.Float64, "bias": pl.Float64,
        "bias_source": pl.String, "flag": pl.Boolean, "flag_text": pl.String,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema)
