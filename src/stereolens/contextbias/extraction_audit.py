"""The attribute extractor audited per demographic group: the extraction validation broken down
by the group a prompt states or an image shows, and the induced-bias flag (docs/planner.md,
docs/methods.md, "The extractor audited per group")."""

from __future__ import annotations

import numpy as np
import polars as pl

from stereolens.metrics.group_audit import (
    GAP_COLUMNS,
    MIN_TEST_CLUSTERS,
    RATE_COLUMNS,
    group_gaps,
    group_rates,
    induced_shares,
    with_pooled,
)

GROUP_DIMENSIONS = ("gender_presentation", "skin_tone", "age_range")
SEVERAL = "several"


def contextbias_items(
    details: pl.DataFrame,
    attributes: pl.DataFrame,
    *,
    shown_by: str | None = None,
    include_implied: bool = False,
) -> pl.DataFrame:
    """One row per (validation item, grouping): the details table's extracted items (``ok``)
    with grouping, group_dimension, group and cluster (the prompt_id, else the image_id; see
    docs/methods.md)."""
    d = details.filter(pl.col("ok"))
    if not include_implied and "kind" in d.columns:
        d = d.filter(pl.col("kind") == "stated")
    if "extractor" not in d.columns:
        d = d.with_columns(pl.lit("*").alias("extractor"))
    unit = "prompt_id" if "prompt_id" in d.columns else "image_id"
    d = d.with_columns(pl.col(unit).cast(pl.String).alias("cluster"))
    keep = ["extractor", "model", "image_id", "dimension", "correct", "other_label", "cluster"]
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


def contextbias_bias(bootstrap: pl.DataFrame | None) -> dict[tuple, float] | None:
    """(extractor, model, dimension) -> the CA-U - CF BI shift of bootstrap.parquet, dimension
    "*" = the overall shift."""
    if bootstrap is None or bootstrap.height == 0:
        return None
    rows = bootstrap.filter(pl.col("comparison") == "CA-U - CF")
    rows = rows.filter((pl.col("dimension") != "*") | (pl.col("cohort") == "*"))
    ex = "extractor" in rows.columns
    return {
        (r["extractor"] if ex else "*", r["model"], r["dimension"]): r["estimate"]
        for r in rows.iter_rows(named=True)
    }


INDUCED_FORMULA = (
    "BI = 1 - H(q) / log K, q_g = a_g / sum_h a_h (group accuracies a_g, every group equally "
    "common, misreads lost)"
)


def induced_bi(accuracy: np.ndarray) -> float:
    """The BI the per-group accuracies alone give the group dimension (INDUCED_FORMULA)."""
    q = induced_shares(accuracy)
    if q is None:
        return float("nan")
    h = -np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0))
    return float(1 - h / np.log(q.size))


def audit_items(
    items: pl.DataFrame,
    shifts: dict[tuple, float] | None = None,
    *,
    level: float = 0.95,
    replicates: int = 1000,
    seed: int = 0,
    min_test_clusters: int = MIN_TEST_CLUSTERS,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(by_group, group_gaps) of an item table of :func:`contextbias_items` (the coverage
    benchmark draws simulated tables through it); the Rao-Scott p-value of fewer than
    ``min_test_clusters`` prompts is withheld."""
    rates = group_rates(items, level=level, replicates=replicates, seed=seed, cluster_name="prompt")
    if rates.height == 0:
        return rates, group_gaps(rates)
    shifts = shifts or {}

    def bias(kd):
        ex, m = kd["extractor"], kd["model"]
        if kd["grouping"] == "stated" and (ex, m, kd["group_dimension"]) in shifts:
            return shifts[(ex, m, kd["group_dimension"])]
        return shifts.get((ex, m, "*"))

    gaps = group_gaps(
        rates, level=level, bias=bias, items=items, cluster_name="prompt",
        min_test_clusters=min_test_clusters,
        bias_source="|CA-U - CF| BI shift of the group dimension (stated; else overall; "
        "bootstrap.parquet)",
        measured="the CA-U - CF BI shift", induced=induced_bi, induced_formula=INDUCED_FORMULA,
    )  # fmt: skip
    return rates.select(RATE_COLUMNS), gaps.select(GAP_COLUMNS)


def audit_contextbias(
    details: pl.DataFrame,
    attributes: pl.DataFrame,
    bootstrap: pl.DataFrame | None = None,
    *,
    shown_by: str | None = None,
    level: float = 0.95,
    replicates: int = 1000,
    seed: int = 0,
    min_test_clusters: int = MIN_TEST_CLUSTERS,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(by_group, group_gaps) of the ContextBias extraction validation (docs/methods.md)."""
    items = with_pooled(contextbias_items(details, attributes, shown_by=shown_by))
    return audit_items(
        items, contextbias_bias(bootstrap), level=level, replicates=replicates, seed=seed,
        min_test_clusters=min_test_clusters,
    )  # fmt: skip
