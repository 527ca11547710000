"""A benchmark's corrected table (results/<benchmark>/corrected.parquet) from the reader
correction (stereolens.metrics.reader_correction): the cells with enough human labels, one
row per metric of their shares, and the SIMULATED human labels of the embedded default."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import polars as pl

from stereolens.metrics.human_labels import HUMAN_COLUMNS, NO_LABEL, check_human_labels
from stereolens.metrics.reader_correction import (
    MIN_LABELLED,
    Cell,
    ShareFunctional,
    corrected_metric,
)

METRIC_COLUMNS = [
    "metric", "naive", "naive_low", "naive_high", "corrected", "estimate_bc", "ci_low",
    "ci_high", "off_simplex", "n_human", "n_items", "interval_reliable",
]  # fmt: skip
"""The columns of a benchmark's corrected table after its cell's key columns
(``results/<benchmark>/corrected.parquet``; corrected_metric's keys but ``interval``)."""


def labelled_cells(
    reader: pl.DataFrame, human: pl.DataFrame, keys: Sequence[str] = ()
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the reader rows of the cells, ``keys`` x attribute, whose every stratum has
    MIN_LABELLED human labels; one row per cell left out, with n_items and n_human)."""
    cell = [*keys, "attribute"]
    items = reader.select(*cell, "item_id", "stratum").unique()
    seen = human.select("item_id", "attribute").unique().with_columns(pl.lit(1).alias("_h"))
    per = (
        items.join(seen, on=["item_id", "attribute"], how="left")
        .group_by(*cell, "stratum")
        .agg(pl.len().alias("n_items"), pl.col("_h").sum().alias("n_human"))
    )
    short = (
        per.group_by(cell)
        .agg(
            pl.col("n_items").sum(),
            pl.col("n_human").sum(),
            (pl.col("n_human").min() < MIN_LABELLED).alias("_short"),
        )
        .filter("_short")
        .drop("_short")
        .sort(cell)
    )
    return reader.join(short.select(cell), on=cell, how="anti"), short


def simulate_human_labels(
    reader: pl.DataFrame, fraction: float, flip: float, seed: int = 0
) -> pl.DataFrame:
    """A SIMULATED human-label table (HUMAN_COLUMNS plus ``flipped`` and ``simulated``) for
    a demonstration: per stratum a simple random sample of max(MIN_LABELLED, ceil(``fraction``
    x N_h)) items, each item x attribute given, with probability ``flip``, another of the
    attribute's labels, else the reader's (its first extractor's). Seeded by ``seed``."""
    if not 0.0 < fraction <= 1.0 or not 0.0 <= flip <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1] and flip in [0, 1], got {fraction}, {flip}")
    if "extractor" in reader.columns:  # several readers of the same items: the first one's
        reader = reader.filter(pl.col("extractor") == reader["extractor"].min())
    reader = check_human_labels(reader, "reader table", reader=True)
    items = reader.select("item_id", "stratum").unique().sort("stratum", "item_id")
    if items["item_id"].is_duplicated().any():
        raise ValueError("reader table: an item has two strata; an item has one stratum")
    rng = np.random.default_rng(seed)
    picked: list[tuple[str, float]] = []
    for stratum in sorted(set(items["stratum"])):
        ids = items.filter(pl.col("stratum") == stratum)["item_id"].to_list()
        n = min(len(ids), max(MIN_LABELLED, int(np.ceil(fraction * len(ids)))))
        picked += [(ids[i], n / len(ids)) for i in sorted(rng.choice(len(ids), n, replace=False))]
    probability = dict(picked)
    rows = (
        reader.filter(pl.col("item_id").is_in(list(probability)))
        .group_by("item_id", "attribute", "stratum")
        .agg(pl.col("label").sort())
        .sort("item_id", "attribute")
    )
    vocabulary = {
        a: sorted(v for v in set(part["label"]) if v.strip().lower() not in NO_LABEL)
        for (a,), part in reader.select("attribute", "label").group_by("attribute")
    }
    out = []
    for item, attribute, stratum, labels in rows.iter_rows():
        other = [v for v in vocabulary[attribute] if v not in labels]
        flipped = bool(rng.random() < flip) and bool(other)
        given = [other[rng.integers(len(other))]] if flipped else labels
        out += [(item, attribute, v, stratum, probability[item], flipped) for v in given]
    schema = {**HUMAN_COLUMNS, "flipped": pl.Boolean}
    return pl.DataFrame(out, schema=schema, orient="row").with_columns(
        pl.lit(True).alias("simulated")
    )


def metric_table(
    rows: Sequence[tuple[dict[str, str], Sequence[Cell], ShareFunctional, tuple | None]],
    key_columns: Sequence[str],
    metric: str,
    *,
    estimator: Callable[..., dict] = corrected_metric,
    **options,
) -> pl.DataFrame:
    """One row per (key dict, cells, functional, bounds) of ``rows``: the key columns, then
    METRIC_COLUMNS by ``estimator`` (corrected_metric or corrected_metric_double)."""
    out = []
    for key, cells, functional, bounds in rows:
        out.append({**key, **estimator(cells, functional, bounds=bounds, **options)})
    return metric_frame(out, key_columns, metric)


def metric_frame(records: Sequence[dict], key_columns: Sequence[str], metric: str) -> pl.DataFrame:
    """The key columns, then METRIC_COLUMNS, of ``records`` (each the key columns' values
    and corrected_metric's keys; ``interval`` dropped), one row each, metric ``metric``."""
    out = [{**{k: v for k, v in r.items() if k != "interval"}, "metric": metric} for r in records]
    schema = {**{k: pl.String for k in key_columns}, "metric": pl.String}
    schema.update({c: pl.Float64 for c in METRIC_COLUMNS if c not in schema})
    schema.update({"off_simplex": pl.Boolean, "n_human": pl.Int64, "n_items": pl.Int64})
    schema["interval_reliable"] = pl.Boolean
    return pl.DataFrame(out, schema=schema).select([*key_columns, *METRIC_COLUMNS])
