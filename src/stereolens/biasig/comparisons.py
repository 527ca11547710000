"""BiasIG model comparisons: every pair of models and every debiasing variant against its base on
the model-level S_imp, S_exp and eta (docs/statistics.md, "Model comparisons")."""

from __future__ import annotations

import polars as pl

from stereolens.metrics.compare import COMPARISON_COLUMNS, RANK_COLUMNS, compare, concat

BENCHMARK = "biasig"
RESAMPLING = "images within each subject, each model its own stream (subjects fixed)"
BETTER = {"S_imp": "higher", "S_exp": "higher", "eta": "higher"}
RANKED = ("S_imp", "S_exp")
ESTIMATE = {"S_imp": "estimate_bc", "S_exp": "estimate_bc", "eta": "estimate"}
"""The column of :func:`model_estimates` each metric's comparisons take (see above)."""
SCOPES = {"*": "overall", "gender": "gender", "race": "race", "age": "age"}
"""protected_attribute of the score tables -> scope of the comparison tables."""


def model_eta(eta: pl.DataFrame, columns: dict[str, str]) -> list[pl.DataFrame]:
    """The model-level rows of the eta table, one frame per protected attribute ("*" = the
    total): variant, model, metric "eta", protected_attribute, then each column of
    ``columns`` (its name -> the suffix of the eta column it holds: "" plug-in, "_bc")."""
    rows = eta.filter(pl.col("pair") == "*")
    return [
        rows.select(
            "variant",
            "model",
            pl.lit("eta").alias("metric"),
            pl.lit(attr).alias("protected_attribute"),
            *(pl.col(f"eta_{col}{suffix}").alias(name) for name, suffix in columns.items()),
        )
        for attr, col in (("*", "total"), ("gender", "gender"), ("race", "race"), ("age", "age"))
    ]


def model_estimates(tables: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Long table (variant, model, metric, protected_attribute, estimate, estimate_bc) of the
    model-level rows of the implicit, explicit and eta tables present in ``tables``."""
    parts = []
    if "implicit" in tables:
        parts.append(
            tables["implicit"]
            .filter(pl.col("level") == "model")
            .select("variant", "model", pl.lit("S_imp").alias("metric"), "protected_attribute",
                    pl.col("score").alias("estimate"), pl.col("score_bc").alias("estimate_bc"))
        )  # fmt: skip
    if "explicit" in tables:
        parts.append(
            tables["explicit"]
            .filter((pl.col("level") == "model") & (pl.col("protected_value") == "*"))
            .select("variant", "model", pl.lit("S_exp").alias("metric"), "protected_attribute",
                    pl.col("score").alias("estimate"), pl.col("score_bc").alias("estimate_bc"))
        )  # fmt: skip
    if "eta" in tables:
        parts += model_eta(tables["eta"], {"estimate": "", "estimate_bc": "_bc"})
    if not parts:
        return pl.DataFrame(
            schema={"variant": pl.String, "model": pl.String, "metric": pl.String,
                    "protected_attribute": pl.String, "estimate": pl.Float64,
                    "estimate_bc": pl.Float64}
        )  # fmt: skip
    return pl.concat(parts, how="vertical_relaxed")


def comparison_tables(
    tables: dict[str, pl.DataFrame],
    level: float = 0.95,
    attributes: tuple[str, ...] = tuple(SCOPES),
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(comparisons, ranks) (``COMPARISON_COLUMNS``, ``RANK_COLUMNS``) from compute_metrics'
    tables with "replicates" (empty without); a variant named otherwise than its model is
    compared with that base as "variant_vs_base". One Holm family per (metric, scope)."""
    reps = tables.get("replicates")
    est = model_estimates(tables).filter(pl.col("protected_attribute").is_in(attributes))
    if reps is None or reps.is_empty() or est.is_empty():
        return concat([], COMPARISON_COLUMNS), concat([], RANK_COLUMNS)
    notes = withheld_models(tables)
    variants = {v: m for v, m in est.select("variant", "model").unique().iter_rows() if v != m}
    cmp_frames, rank_frames = [], []
    for (metric, attr), rows in est.sort("metric", "protected_attribute").group_by(
        ["metric", "protected_attribute"], maintain_order=True
    ):
        column = ESTIMATE[metric]
        finite = rows.filter(pl.col(column).is_finite())
        if finite.is_empty():
            continue
        estimates = dict(zip(finite["variant"], finite[column], strict=True))
        sub = reps.filter((pl.col("metric") == metric) & (pl.col("protected_attribute") == attr))
        replicates = {
            v: sub.filter(pl.col("variant") == v).sort("replicate")["value"].to_numpy()
            for v in estimates
        }
        cmp, rk = compare(
            estimates,
            replicates,
            withheld=notes,
            benchmark=BENCHMARK,
            metric=metric,
            scope=SCOPES[attr],
            better=BETTER[metric],
            paired=False,
            resampling=RESAMPLING,
            variants={v: b for v, b in variants.items() if v in estimates and b in estimates},
            level=level,
        )
        cmp_frames.append(cmp)
        if metric in RANKED:
            rank_frames.append(rk)
    return concat(cmp_frames, COMPARISON_COLUMNS), concat(rank_frames, RANK_COLUMNS)


def withheld_models(tables: dict[str, pl.DataFrame]) -> dict[str, str]:
    """variant -> its model-level ``interval_note`` (:func:`stereolens.biasig.metrics.withhold`)."""
    notes: dict[str, str] = {}
    for name in ("implicit", "explicit", "eta"):
        t = tables.get(name)
        if t is None or "interval_note" not in t.columns:
            continue
        rows = t.filter(pl.col("interval_note").is_not_null())
        notes.update(zip(rows["variant"], rows["interval_note"], strict=True))
    return notes
