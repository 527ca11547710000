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

import polars as pl

from stereolens.metrics.group_audit import (
    GAP_COLUMNS,
    RATE_COLUMNS,
    group_gaps,
    group_rates,
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
    items = with_pooled(contextbias_items(details, attributes, shown_by=shown_by))
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
