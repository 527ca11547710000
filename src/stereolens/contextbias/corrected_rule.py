"""ContextBias's printing rule for its corrected rows over many role cells (a generator's mean
over roles and its mean over generators), measured at the paper's design (bench/COVERAGE.md,
"Reader correction: ContextBias at the paper's design")."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE

AGGREGATE_MIN_LABELLED = {"bi_role": 20, "bi_role_mean": 20, "bi_pooled_mean": 20}
"""Per metric, the human-labelled images every role cell (generator x role x condition) of
its rows over many roles needs (:func:`aggregate_reliable`): ``bi_role`` (the mean over
roles), ``bi_role_mean`` (its mean over generators) and ``bi_pooled_mean`` (pooled BI's mean
over generators); the smallest labels a role from which every row of the metric covers
within two Monte Carlo errors of 95% at the paper's design (bench/COVERAGE.md;
bench/cover/_contextbias_design.py DESIGN_SWEEP). Other rows keep MIN_HUMAN_RELIABLE per
cell."""
AGGREGATE_ROLES = 92
"""The roles of the world the rule was measured in (the paper's 92)."""


def aggregate_minimum(metric: str) -> int:
    """The labels a generator's role cells of one dimension need in all for ``metric``'s
    rule: AGGREGATE_ROLES x its AGGREGATE_MIN_LABELLED (fewer roles need more labels each)."""
    return AGGREGATE_ROLES * AGGREGATE_MIN_LABELLED[metric]


def reason(metric: str) -> str:
    """withheld_reason of a ``metric`` row the rule withholds (the report's note)."""
    m = AGGREGATE_MIN_LABELLED[metric]
    each = " of every generator" if metric.endswith("_mean") else ""  # a mean over generators
    return (
        f"this row prints from {m:,} human labels in every role cell and "
        f"{aggregate_minimum(metric):,} in each dimension's role cells{each} ({AGGREGATE_ROLES} "
        f"roles x {m}), or {MIN_HUMAN_RELIABLE:,} in every cell (bench/COVERAGE.md, 'Reader "
        "correction: ContextBias at the paper's design')"
    )


def aggregate_reliable(labelled: Sequence[Sequence[int]], metric: str) -> bool:
    """``metric``'s rule on a row's parts (per dimension, the human labels of each of the
    generator's role cells): every cell AGGREGATE_MIN_LABELLED and every part
    :func:`aggregate_minimum` in all, or every cell MIN_HUMAN_RELIABLE (the per-cell rule)."""
    cells = [n for part in labelled for n in part]
    if cells and min(cells) >= MIN_HUMAN_RELIABLE:
        return True
    m, total = AGGREGATE_MIN_LABELLED[metric], aggregate_minimum(metric)
    return bool(cells) and all(min(p) >= m and sum(p) >= total for p in labelled)


def apply_rule(results: list[dict], cells: Sequence, parts: Sequence, metric: str) -> list:
    """``results`` (reader_correction.corrected_metrics', one per column) with
    interval_reliable by :func:`aggregate_reliable` of each column's ``parts`` (lists of
    indices into ``cells``: the role cells of one dimension) and withheld_reason
    :func:`reason` where it fails (None otherwise)."""
    for res, column in zip(results, parts, strict=True):
        ok = aggregate_reliable([[cells[i].labelled.size for i in p] for p in column], metric)
        res["interval_reliable"] = ok
        res["withheld_reason"] = None if ok else reason(metric)
    return results


def printing_minimums(strata: pl.DataFrame, minimum: int = MIN_HUMAN_RELIABLE) -> pl.DataFrame:
    """``strata`` (model, stratum "model|role|condition") with the human labels from which
    the report prints each headline row using the stratum (sample_design.printable_counts'
    ``minimums``): per AGGREGATE_MIN_LABELLED minimum (metrics sharing one: once) max(it,
    ceil(its :func:`aggregate_minimum` / the roles of the stratum's generator x condition)),
    the labels a role that put every role at it, at most ``minimum`` (every cell at the
    per-cell rule prints them too), and the per-cell rows' ``minimum``; ``minimum`` the
    largest."""
    condition = pl.col("stratum").str.split("|").list.last()
    roles = pl.len().over("model", condition)
    each = [
        pl.min_horizontal(
            pl.max_horizontal(
                pl.lit(m, pl.Int64), (aggregate_minimum(metric) / roles).ceil().cast(pl.Int64)
            ),
            pl.lit(minimum, pl.Int64),
        )
        for m, metric in {m: k for k, m in AGGREGATE_MIN_LABELLED.items()}.items()
    ]
    return strata.with_columns(
        pl.concat_list(*each, pl.lit(minimum, pl.Int64)).alias("minimums"),
        pl.max_horizontal(*each, pl.lit(minimum, pl.Int64)).alias("minimum"),
    )
