"""The agreement report of the annotation study: raw agreement, pairwise Cohen's kappa,
Fleiss' kappa with a bootstrap CI, the human consensus and its agreement with the
pipeline, written as parquet tables."""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import combinations
from pathlib import Path

import numpy as np
import polars as pl

from stereolens.annotation_form import UNKNOWN, human_consensus, key_dimensions, read_key
from stereolens.atomic import write_parquet
from stereolens.contextbias.annotation.answers import read_answers
from stereolens.contextbias.annotation.columns import (
    ALL,
    ANNOTATOR_COLUMNS,
    CONSENSUS,
    CONSENSUS_COLUMNS,
    PAIR_COLUMNS,
    PIPELINE,
    SUMMARY_COLUMNS,
    TABLE_FILES,
)
from stereolens.contextbias.annotation.kappa import (
    bootstrap_fleiss,
    cohen_kappa,
    fleiss_kappa,
    fleiss_table,
)
from stereolens.contextbias.annotation.pipeline import pipeline_set_labels
from stereolens.contextbias.schema import AttributeSchema
from stereolens.ids import stable_id


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def agreement_report(
    answer_csvs: Iterable[str | os.PathLike],
    key: pl.DataFrame | str | os.PathLike,
    attributes: pl.DataFrame,
    replicates: int = 1000,
    seed: int = 0,
    *,
    extractor: str | None = None,
    schema: AttributeSchema | None = None,
    ci_level: float = 0.95,
) -> dict[str, pl.DataFrame]:
    """Inter-annotator agreement and human consensus vs pipeline (paper Sec. 4.3).

    Returns {"agreement_pairs", "agreement_summary", "consensus_vs_pipeline",
    "agreement_annotators"} with the columns of PAIR_COLUMNS, SUMMARY_COLUMNS,
    CONSENSUS_COLUMNS and ANNOTATOR_COLUMNS. Per dimension and overall ("*", items of all
    dimensions pooled, labels kept apart by dimension).

    Items answered by only some annotators count for the pairs that answered them; raw
    agreement, Fleiss' kappa (needs equal raters per item) and the pipeline comparison use
    the complete items. The Fleiss CI is a percentile bootstrap over items with
    ``replicates`` draws, seeded per dimension from ``seed`` (the CI of one dimension does
    not depend on which others are present). With several extractors in the attributes
    table, name the one to compare with ``extractor``.

    Open-vocabulary answers are compared as normalised text (lower case, single spaces):
    free descriptors rarely match canonical labels word for word, so their agreement is a
    lower bound."""
    if not 0 < ci_level < 1:
        raise ValueError(f"ci_level must be between 0 and 1, got {ci_level}")
    key = read_key(key)
    answers = read_answers(answer_csvs, key, schema)
    annotators = sorted(answers["annotator"].unique().to_list())
    if len(annotators) < 2:
        raise ValueError(f"agreement needs at least two annotators, got {annotators}")
    if "extractor" in attributes.columns:
        present = sorted(attributes["extractor"].unique().to_list())
        if extractor is None:
            if len(present) > 1:
                raise ValueError(f"the attributes table has extractors {present}; pass extractor=")
            extractor = present[0] if present else None
        elif extractor not in present:
            raise ValueError(f"extractor {extractor!r} is not in the attributes table {present}")
        attributes = attributes.filter(pl.col("extractor") == extractor).drop("extractor")
    pipeline = pipeline_set_labels(key, attributes)
    dims = key_dimensions(key)
    item = ["set_id", "dimension"]

    # one column per annotator, named "@name" so that no name collides with other columns
    col = {a: f"@{a}" for a in annotators}
    wide = (
        answers.with_columns(("@" + pl.col("annotator")).alias("annotator"))
        .pivot(on="annotator", index=item, values="label")
        .sort(item)
    )
    consensus = human_consensus(answers)
    merged = (
        consensus.join(pipeline, on=item, how="left")
        .join(
            key.select(
                "set_id",
                *(c for c in ("position", "role", "condition", "model") if c in key.columns),
            ),
            on="set_id",
            how="left",
        )
        .with_columns(
            (pl.col("n_annotators") == len(annotators)).alias("complete"),
            (pl.col("consensus_label") == pl.col("pipeline_label")).alias("match"),
            pl.lit(extractor, pl.String).alias("extractor"),
        )
    )
    for c in ("position", "role", "condition", "model"):
        if c not in merged.columns:
            merged = merged.with_columns(pl.lit(None, CONSENSUS_COLUMNS[c]).alias(c))
    merged = merged.select([pl.col(c).cast(t) for c, t in CONSENSUS_COLUMNS.items()]).sort(
        ["position", "set_id", "dimension"]
    )
    wide = wide.join(merged.select(*item, "pipeline_label", "consensus_label"), on=item)

    pair_rows, summary_rows = [], []
    for dim in [*dims, ALL]:
        sub = wide if dim == ALL else wide.filter(pl.col("dimension") == dim)

        # labels kept apart by dimension, so pooled categories never mix dimensions
        def coded(column: str, sub: pl.DataFrame = sub) -> np.ndarray:
            return np.array(
                [
                    None if v is None else f"{d}\x1f{v}"
                    for d, v in zip(sub["dimension"], sub[column], strict=True)
                ],
                dtype=object,
            )

        labels = {a: coded(col[a]) for a in annotators}
        pipe = coded("pipeline_label")
        cons = coded("consensus_label")
        human_pairs = []
        for a, b in combinations(annotators, 2):
            both = np.array(
                [x is not None and y is not None for x, y in zip(labels[a], labels[b], strict=True)]
            )
            agreement, kappa = (
                cohen_kappa(labels[a][both], labels[b][both]) if both.any() else (None, None)
            )
            human_pairs.append((agreement, kappa))
            pair_rows.append((dim, "human-human", a, b, int(both.sum()), agreement, kappa))
        for a in annotators:
            has = np.array([x is not None for x in labels[a]])
            agreement, kappa = cohen_kappa(labels[a][has], pipe[has]) if has.any() else (None, None)
            pair_rows.append((dim, "human-pipeline", a, PIPELINE, int(has.sum()), agreement, kappa))

        matrix = np.column_stack([labels[a] for a in annotators])
        complete = np.array([all(x is not None for x in row) for row in matrix], dtype=bool)
        n_complete = int(complete.sum())
        raw = fleiss = low = high = None
        valid = 0
        p_agree = p_kappa = mae = None
        if n_complete:
            full = matrix[complete]
            raw = float(np.mean([len(set(row)) == 1 for row in full]))
            counts = fleiss_table(full)
            fleiss = fleiss_kappa(counts)
            rng = np.random.default_rng([seed, int(stable_id("fleiss", dim), 16) & 0xFFFFFFFF])
            low, high, valid = bootstrap_fleiss(counts, replicates, rng, ci_level)
            p_agree, p_kappa = cohen_kappa(cons[complete], pipe[complete])
            sel = merged.filter(pl.col("complete") & pl.col("match"))
            if dim != ALL:
                sel = sel.filter(pl.col("dimension") == dim)
            if sel.height:
                mae = float((sel["consensus_prevalence"] - sel["pipeline_prevalence"]).abs().mean())
        pair_rows.append(
            (dim, "consensus-pipeline", CONSENSUS, PIPELINE, n_complete, p_agree, p_kappa)
        )
        summary_rows.append(
            {
                "dimension": dim,
                "n_items": key.height * (len(dims) if dim == ALL else 1),
                "n_complete": n_complete,
                "n_annotators": len(annotators),
                "raw_agreement": raw,
                "mean_pairwise_agreement": _mean(x for x, _ in human_pairs),
                "mean_pairwise_kappa": _mean(k for _, k in human_pairs),
                "fleiss_kappa": fleiss,
                "fleiss_ci_low": low,
                "fleiss_ci_high": high,
                "ci_level": ci_level,
                "replicates": replicates,
                "valid_replicates": valid,
                "extractor": extractor,
                "pipeline_agreement": p_agree,
                "pipeline_kappa": p_kappa,
                "prevalence_mae": mae,
            }
        )

    pairs = pl.DataFrame(
        [dict(zip(PAIR_COLUMNS, r, strict=True)) for r in pair_rows], schema=PAIR_COLUMNS
    ).with_columns(pl.col("agreement", "kappa").fill_nan(None))
    summary = pl.DataFrame(summary_rows, schema=SUMMARY_COLUMNS)
    n_key_items = key.height * len(dims)
    per_annotator = (
        answers.group_by("annotator")
        .agg(
            pl.len().cast(pl.Int64).alias("n_answers"),
            (pl.col("label") == UNKNOWN).mean().alias("unknown_share"),
            pl.col("prevalence").mean().alias("mean_prevalence"),
        )
        .with_columns((pl.col("n_answers") / n_key_items).alias("coverage"))
        .select(list(ANNOTATOR_COLUMNS))
        .sort("annotator")
    )
    return {
        "agreement_pairs": pairs,
        "agreement_summary": summary,
        "consensus_vs_pipeline": merged,
        "agreement_annotators": per_annotator,
    }


def write_agreement_tables(
    report: dict[str, pl.DataFrame], out_dir: str | os.PathLike
) -> dict[str, Path]:
    """Write the tables of :func:`agreement_report` as parquet, each atomically:
    agreement_pairs, agreement_summary, consensus_vs_pipeline, agreement_annotators."""
    missing = [name for name in TABLE_FILES if name not in report]
    if missing:
        raise ValueError(f"report lacks tables {missing}")
    out = Path(out_dir)
    paths = {}
    for name, file in TABLE_FILES.items():
        write_parquet(out / file, report[name])
        paths[name] = out / file
    return paths
