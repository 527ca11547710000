"""Merge per-shard extraction records into the long attributes table and the images table, in
two steps (one part per extractor x generator, then the parts concatenated)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from stereolens.atomic import read_jsonl, sink_parquet, write_parquet
from stereolens.contextbias.schema import AttributeSchema
from stereolens.vocabulary import conform_columns

KEY_COLUMNS = ["extractor", "model", "role", "condition", "prompt_id", "seed", "image_id"]
_IMAGE_KEYS = {
    "extractor": pl.String,
    "model": pl.String,
    "role": pl.String,
    "condition": pl.String,
    "variant": pl.String,
    "prompt_id": pl.String,
    "seed": pl.Int64,
    "image_id": pl.String,
}
"""The leading columns of both tables: the image and what made and read it."""
IMAGE_COLUMNS = {
    **_IMAGE_KEYS,
    "image_path": pl.String,
    "image_sha256": pl.String,
    "status": pl.String,
    "reason": pl.String,
    "attempts": pl.Int64,
    "response_sha256": pl.String,
    "schema_version": pl.String,
    "prompt_version": pl.String,
    "extractor_model": pl.String,
    "extractor_revision": pl.String,
    "n_labels": pl.Int64,
}
ATTRIBUTE_COLUMNS = {
    **_IMAGE_KEYS,
    "cohort": pl.String,
    "dimension": pl.String,
    "label": pl.String,
}


BASE_COLUMNS = [c for c in ATTRIBUTE_COLUMNS if c not in ("cohort", "dimension", "label")]


def merge_extractions(
    paths: list[str | Path], schema: AttributeSchema
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(attributes, images). Only images with status "ok" contribute labels; every image,
    discarded ones included with their reason, is in the images table.

    Records are read file by file into columns (no dict per label): the attribute rows
    are the images' key columns gathered by image, beside cohort, dimension and label."""
    image_cols: dict[str, list] = {k: [] for k in IMAGE_COLUMNS}
    owner: list[int] = []
    cohorts: list[str] = []
    dimensions: list[str] = []
    labels: list[str] = []
    for path in paths:
        for rec in read_jsonl(path):
            found = schema.labels(rec["attributes"]) if rec.get("status") == "ok" else []
            i = len(image_cols["n_labels"])
            for k in IMAGE_COLUMNS:
                image_cols[k].append(rec.get(k))
            image_cols["n_labels"][-1] = len(found)
            owner.extend([i] * len(found))
            for c, d, lab in found:
                cohorts.append(c)
                dimensions.append(d)
                labels.append(lab)
    images = pl.DataFrame(image_cols, schema=IMAGE_COLUMNS)
    dup = images.filter(pl.struct("extractor", "image_id").is_duplicated())
    if dup.height:
        raise ValueError(
            f"{dup.height} images appear twice in the extraction files "
            f"(e.g. {dup['image_id'][0]}); a shard was listed twice"
        )
    attributes = (
        images.select(BASE_COLUMNS)[pl.Series(owner, dtype=pl.UInt32)]
        .with_columns(
            pl.Series("cohort", cohorts, dtype=pl.String),
            pl.Series("dimension", dimensions, dtype=pl.String),
            pl.Series("label", labels, dtype=pl.String),
        )
        .select(list(ATTRIBUTE_COLUMNS))
    )
    # the metrics CLI's rule, here too: a label the schema does not list is refused
    where = f"attributes of {len(paths)} extraction shard(s) ({paths[0] if paths else ''} ...)"
    hint = "the extraction shards do not fit it: re-extract them"
    attributes = conform_columns(attributes, schema.table_vocabularies(hint), where)
    return attributes.sort(KEY_COLUMNS + ["dimension", "label"]), images.sort(KEY_COLUMNS)


def merge_extraction_part(
    paths: list[str | Path],
    schema: AttributeSchema,
    out_attributes: str | Path,
    out_images: str | Path,
) -> tuple[int, int]:
    """One (extractor, generator) part of the merge: its extraction shards -> its
    attributes and images tables (sorted as the merged tables). Returns (images, labels)."""
    attributes, images = merge_extractions(paths, schema)
    write_parquet(out_images, images)
    write_parquet(out_attributes, attributes)
    return images.height, attributes.height


def merge_extraction_parts(
    attribute_parts: list[str | Path],
    image_parts: list[str | Path],
    out_attributes: str | Path,
    out_images: str | Path,
) -> dict[str, int]:
    """Concatenate the parts (each sorted, none overlapping another's (extractor, model))
    in (extractor, model) order: the merged tables, streamed. Returns per status the image
    count and, as "labels", the attribute rows."""
    if len(attribute_parts) != len(image_parts):
        raise ValueError("one attributes part per images part")
    from stereolens.damage import require_intact

    require_intact([*attribute_parts, *image_parts])
    keyed = []
    for a, i in zip(attribute_parts, image_parts, strict=True):
        first = pl.scan_parquet(i).select("extractor", "model").head(1).collect()
        keyed.append((tuple(first.row(0)) if first.height else ("", ""), str(a), str(i)))
    keyed.sort()
    images = (
        pl.concat([pl.scan_parquet(i) for _, _, i in keyed])
        if keyed
        else pl.LazyFrame(schema=IMAGE_COLUMNS)
    )
    dup = (
        images.filter(pl.struct("extractor", "image_id").is_duplicated())
        .select("image_id")
        .collect()
    )
    if dup.height:
        raise ValueError(
            f"{dup.height} images appear in two extraction parts (e.g. {dup['image_id'][0]})"
        )
    sink_parquet(out_images, images)
    attributes = (
        pl.concat([pl.scan_parquet(a) for _, a, _ in keyed])
        if keyed
        else pl.LazyFrame(schema=ATTRIBUTE_COLUMNS)
    )
    sink_parquet(out_attributes, attributes)
    counts = dict(
        pl.scan_parquet(out_images).group_by("status").len().sort("status").collect().rows()
    )
    counts["labels"] = pl.scan_parquet(out_attributes).select(pl.len()).collect().item()
    return counts


def part_paths(extractor: str, model: str) -> dict[str, str]:
    """Where the workflow writes an (extractor, generator) part of the merge."""
    from stereolens.contextbias.layout import LAYOUT

    return {
        key: LAYOUT.path("merged", extractor=extractor, model=model, table=table)
        for key, table in (("attributes", "attributes_raw"), ("images", "images"))
    }
