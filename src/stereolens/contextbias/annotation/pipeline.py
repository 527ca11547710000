"""The extraction pipeline's answer to the annotation questions, set by set."""

from __future__ import annotations

import os

import polars as pl

from stereolens.annotation_form import UNKNOWN, key_dimensions, read_key
from stereolens.contextbias.schema import NOT_LABELS


def pipeline_set_labels(
    key: pl.DataFrame | str | os.PathLike, attributes: pl.DataFrame
) -> pl.DataFrame:
    """The pipeline's answer per set and dimension, from the long attributes table.

    pipeline_label = the label carried by the most images of the set (a label counts once
    per image); ties go to the alphabetically first label (pipeline_tie marks them).
    pipeline_prevalence = the number of the set's images with that label. When no image of
    the set has a countable label for the dimension the answer is ``unknown`` with
    prevalence = n_images (every image is unknown), matching the form's "unknown / not
    visible". n_labelled = images with any label for the dimension.

    Columns: (extractor,) set_id, dimension, n_images, n_labelled, pipeline_label,
    pipeline_prevalence, pipeline_tie; extractor when the attributes table has one (every
    extractor answers every set). Use the canonical labels for open vocabularies by
    passing a table whose ``label`` column holds them."""
    key = read_key(key)
    need = [c for c in ("image_id", "dimension", "label") if c not in attributes.columns]
    if need:
        raise ValueError(f"attributes table lacks columns {need}")
    dims = key_dimensions(key)
    ext = ["extractor"] if "extractor" in attributes.columns else []
    members = (
        key.select("set_id", "n_images", pl.col("image_ids").alias("image_id"))
        .explode("image_id")
        .drop_nulls("image_id")
    )
    attr = (
        attributes.filter(
            pl.col("dimension").is_in(dims)
            & pl.col("label").is_not_null()
            & ~pl.col("label").str.to_lowercase().str.strip_chars().is_in(list(NOT_LABELS))
        )
        .select(*ext, "image_id", "dimension", "label")
        .unique()
    )
    if not attributes.join(members.select("image_id").unique(), on="image_id", how="semi").height:
        raise ValueError(
            "the attributes table has no rows for any image of the annotation sample; "
            "is it the table the sample was drawn from?"
        )
    joined = members.join(attr, on="image_id", how="inner")
    group = [*ext, "set_id", "dimension"]
    counts = joined.group_by([*group, "label"]).agg(pl.col("image_id").n_unique().alias("n"))
    best = (
        counts.sort([*group, "n", "label"], descending=[False] * len(group) + [True, False])
        .group_by(group, maintain_order=True)
        .agg(
            pl.col("label").first().alias("pipeline_label"),
            pl.col("n").first().alias("pipeline_prevalence"),
            (pl.col("n") == pl.col("n").max()).sum().gt(1).alias("pipeline_tie"),
        )
    )
    labelled = joined.group_by(group).agg(pl.col("image_id").n_unique().alias("n_labelled"))
    grid = key.select("set_id", "n_images").join(
        pl.DataFrame({"dimension": dims}, schema={"dimension": pl.String}), how="cross"
    )
    if ext:
        extractors = attributes.select("extractor").unique().sort("extractor")
        grid = extractors.join(grid, how="cross")
    out = (
        grid.join(best, on=group, how="left")
        .join(labelled, on=group, how="left")
        .with_columns(
            pl.col("n_labelled").fill_null(0).cast(pl.Int64),
            pl.col("pipeline_label").fill_null(UNKNOWN),
            pl.col("pipeline_prevalence").fill_null(pl.col("n_images")).cast(pl.Int64),
            pl.col("pipeline_tie").fill_null(False),
        )
    )
    return out.select(
        *ext,
        "set_id",
        "dimension",
        "n_images",
        "n_labelled",
        "pipeline_label",
        "pipeline_prevalence",
        "pipeline_tie",
    ).sort(group)
