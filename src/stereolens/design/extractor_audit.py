"""The attribute extractor audited per demographic group (issue 15, item 4): does it err more
for one group, which the audit would read as the generator's bias?

ContextBias extraction validation (the explicit prompts, :mod:`stereolens.contextbias.validation`)
broken down by the demographic

- the prompt states (grouping ``stated``): items whose expected pair is a gender
  presentation, skin tone or age range, grouped by that expected label ("a photo of a
  female bartender" -> female): how well the extractor reads that demographic for each
  group;
- the generated person shows (grouping ``shown``): every item grouped by the label the
  extractor (or, with ``shown_by``, another extractor) reads for gender presentation, skin
  tone or age range in the same image (several labels: "several"; none: left out); items of
  the grouping dimension itself are left out (they would group by their own answer). With
  the same extractor the group is its own reading: an error in it moves the item between
  groups; another extractor's reading is independent of this one's errors.

Per (extractor, model, grouping, dimension, group): items, accuracy (= recall, the
validation's identity) with a Wilson interval, precision (exclusive dimensions' contradicting
labels) with a Wilson interval, F1 with a percentile bootstrap interval over items; model
``*`` pools the generators. Per grouping: the largest gap in error rate (1 - accuracy)
between two groups with a Newcombe interval, and a test of difference between the groups
(chi-squared on groups x correct, or Fisher's exact test for two groups with an expected
count below 5). The flag: the gap exceeds the bias the extractor is used to measure (the
absolute CA-U - CF BI shift of that extractor and model, bootstrap.parquet), in which case
extraction error alone could make or hide that bias.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
from scipy import stats

GROUP_DIMENSIONS = ("gender_presentation", "skin_tone", "age_range")
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
SEVERAL = "several"


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


def contextbias_items(
    details: pl.DataFrame,
    attributes: pl.DataFrame,
    *,
    shown_by: str | None = None,
    include_implied: bool = False,
) -> pl.DataFrame:
    """One row per (validation item, grouping): the details table's extracted items (``ok``)
    with grouping, group_dimension, group (see the module docstring)."""
    d = details.filter(pl.col("ok"))
    if not include_implied and "kind" in d.columns:
        d = d.filter(pl.col("kind") == "stated")
    if "extractor" not in d.columns:
        d = d.with_columns(pl.lit("*").alias("extractor"))
    keep = ["extractor", "model", "image_id", "dimension", "correct", "other_label"]
    d = d.select(keep)
    stated = (
        d.filter(pl.col("dimension").is_in(GROUP_DIMENSIONS))
        .join(
            details.select(
                "model", "image_id", "dimension", pl.col("expected").alias("group")
            ).unique(subset=["model", "image_id", "dimension"]),
            on=["model", "image_id", "dimension"],
            how="left",
        )
        .with_columns(
            pl.lit("stated").alias("grouping"), pl.col("dimension").alias("group_dimension")
        )
    )
    att = attributes
    if "extractor" not in att.columns:
        att = att.with_columns(pl.lit("*").alias("extractor"))
    reading = (
        att.filter(pl.col("dimension").is_in(GROUP_DIMENSIONS))
        .group_by("extractor", "model", "image_id", "dimension")
        .agg(pl.col("label").unique().alias("_labels"))
        .with_columns(
            pl.when(pl.col("_labels").list.len() == 1)
            .then(pl.col("_labels").list.first())
            .otherwise(pl.lit(SEVERAL))
            .alias("group")
        )
        .select(
            "extractor", "model", "image_id", pl.col("dimension").alias("group_dimension"), "group"
        )
    )
    if shown_by is not None:
        have = set(reading["extractor"].unique().to_list())
        if shown_by not in have:
            raise ValueError(
                f"shown_by {shown_by!r}: no validation attributes of that extractor "
                f"(extractors: {', '.join(sorted(have))})"
            )
        reading = reading.filter(pl.col("extractor") == shown_by).drop("extractor")
        shown = d.join(reading, on=["model", "image_id"], how="inner")
    else:
        shown = d.join(reading, on=["extractor", "model", "image_id"], how="inner")
    shown = shown.filter(pl.col("dimension") != pl.col("group_dimension")).with_columns(
        pl.lit("shown").alias("grouping")
    )
    cols = [*keep, "grouping", "group_dimension", "group"]
    return pl.concat(
        [stated.select(cols), shown.select(cols)], how="vertical_relaxed"
    ).with_columns(
        pl.col("other_label").fill_null(False).cast(pl.Int64).alias("false_positive"),
        pl.col("correct").cast(pl.Int64),
    )


def _with_pooled(items: pl.DataFrame) -> pl.DataFrame:
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


def contextbias_bias(bootstrap: pl.DataFrame | None) -> dict[tuple, float] | None:
    """(extractor, model) -> the CA-U - CF overall BI shift of bootstrap.parquet."""
    if bootstrap is None or bootstrap.height == 0:
        return None
    rows = bootstrap.filter(
        (pl.col("comparison") == "CA-U - CF")
        & (pl.col("cohort") == "*")
        & (pl.col("dimension") == "*")
    )
    ex = "extractor" in rows.columns
    return {
        (r["extractor"] if ex else "*", r["model"]): r["estimate"]
        for r in rows.iter_rows(named=True)
    }


def audit_contextbias(
    details: pl.DataFrame,
    attributes: pl.DataFrame,
    bootstrap: pl.DataFrame | None = None,
    *,
    shown_by: str | None = None,
    level: float = 0.95,
    replicates: int = 1000,
    seed: int = 0,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(by_group, group_gaps) of the ContextBias extraction validation (module docstring)."""
    items = _with_pooled(contextbias_items(details, attributes, shown_by=shown_by))
    rates = group_rates(items, level=level, replicates=replicates, seed=seed)
    if rates.height == 0:
        return rates, group_gaps(rates)
    shifts = contextbias_bias(bootstrap) or {}
    gaps = group_gaps(
        rates, level=level, bias=lambda kd: shifts.get((kd["extractor"], kd["model"])),
        bias_source="|CA-U - CF| overall BI shift (bootstrap.parquet)",
        measured="the CA-U - CF BI shift",
    )  # fmt: skip
    return rates.select(RATE_COLUMNS), gaps.select(GAP_COLUMNS)
