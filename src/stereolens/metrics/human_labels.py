"""The human-label table and the reader table it is checked against: their columns, what
counts as no label, reading one from parquet or CSV, and the checks that name the column and
what to do (docs/statistics.md, "Correcting for the reader's errors")."""

from __future__ import annotations

from pathlib import Path

import polars as pl

HUMAN_COLUMNS: dict[str, type[pl.DataType]] = {
    "item_id": pl.String,
    "attribute": pl.String,
    "label": pl.String,
    "stratum": pl.String,
    "selection_probability": pl.Float64,
}
"""The human-label table: one row per labelled item x attribute x label the human gave (none:
a NO_LABEL row); ``stratum`` the sampling stratum the item was drawn from,
``selection_probability`` its chance of being drawn (n_h / N_h)."""
READER_COLUMNS: dict[str, type[pl.DataType]] = {
    c: t for c, t in HUMAN_COLUMNS.items() if c != "selection_probability"
}
"""The reader's table: every audited item x attribute (unlabelled: a NO_LABEL row) with its
stratum; further columns (model, condition, ...) may name the cells."""
NO_LABEL = frozenset({"unknown", "none", ""})
"""Labels that mean "no label": the item counts in N but adds to no label's share."""


def check_human_labels(
    table: pl.DataFrame, source: str = "human-label table", reader: bool = False
) -> pl.DataFrame:
    """The table with its columns cast to HUMAN_COLUMNS (READER_COLUMNS when ``reader``); a
    ValueError naming the column and what to do otherwise."""
    spec = READER_COLUMNS if reader else HUMAN_COLUMNS
    missing = [c for c in spec if c not in table.columns]
    if missing:
        raise ValueError(
            f"{source} lacks columns {missing}; it needs {list(spec)} (one row per item x "
            "attribute x label; docs/statistics.md, 'Correcting for the reader's errors')"
        )
    for c in spec:
        if table[c].null_count():
            what = "use 'unknown' for an item without a label" if c == "label" else "fill it"
            raise ValueError(f"{source}: column {c} has {table[c].null_count()} nulls; {what}")
    try:
        table = table.with_columns(pl.col(c).cast(t) for c, t in spec.items())
    except pl.exceptions.PolarsError as exc:
        raise ValueError(
            f"{source}: a column cannot be read as {dict(spec)}: {exc}; "
            "selection_probability must be a number"
        ) from exc
    if not reader:
        p = table["selection_probability"]
        if ((p <= 0) | (p > 1) | p.is_nan()).any():
            raise ValueError(
                f"{source}: column selection_probability must lie in (0, 1] (the chance "
                f"the item was drawn), found {p.min()} .. {p.max()}"
            )
    one = table.group_by("item_id").agg(
        [pl.col(c).n_unique().alias(c) for c in ("stratum", "selection_probability") if c in spec]
    )
    for c in one.columns[1:]:
        bad = one.filter(pl.col(c) > 1)
        if bad.height:
            raise ValueError(
                f"{source}: column {c} differs between rows of the same item "
                f"(e.g. item {bad['item_id'][0]!r}); an item has one {c}"
            )
    dup = table.filter(pl.struct("item_id", "attribute", "label").is_duplicated())
    if dup.height:
        raise ValueError(
            f"{source}: item {dup['item_id'][0]!r} repeats label {dup['label'][0]!r} of "
            f"attribute {dup['attribute'][0]!r}; give one consensus answer per item"
        )
    return table


def read_human_labels(path: str | Path, reader: bool = False) -> pl.DataFrame:
    """The human-label table (or, with ``reader``, a reader table) from parquet or CSV."""
    path = Path(path)
    if path.suffix == ".parquet":
        table = pl.read_parquet(path)
    elif path.suffix in (".csv", ".tsv"):
        sep = "\t" if path.suffix == ".tsv" else ","
        table = pl.read_csv(path, separator=sep, infer_schema=False)
    else:
        raise ValueError(f"{path}: human labels are read from .parquet, .csv or .tsv")
    return check_human_labels(table, source=str(path), reader=reader)


def check_human_in_reader(reader: pl.DataFrame, human: pl.DataFrame) -> None:
    """A ValueError unless every human-labelled item x attribute is one the reader read, in
    the same stratum (the tables checked by check_human_labels)."""
    items = reader.select("item_id", "attribute", "stratum").unique()
    if items.select("item_id", "attribute").is_duplicated().any():
        raise ValueError("reader table: an item has two strata; an item has one stratum")
    joined = human.join(items, on=["item_id", "attribute"], how="left", suffix="_reader")
    lost = joined.filter(pl.col("stratum_reader").is_null())
    if lost.height:
        raise ValueError(
            f"human-label table: item {lost['item_id'][0]!r} (attribute "
            f"{lost['attribute'][0]!r}) is not in the reader table; every human-labelled "
            "item must be one the reader read"
        )
    moved = joined.filter(pl.col("stratum") != pl.col("stratum_reader"))
    if moved.height:
        raise ValueError(
            f"human-label table: item {moved['item_id'][0]!r} has stratum "
            f"{moved['stratum'][0]!r} but {moved['stratum_reader'][0]!r} in the reader table"
        )
