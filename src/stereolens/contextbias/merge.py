"""Merge per-shard extraction records into the long attributes table and the
images table."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from stereolens.atomic import read_jsonl
from stereolens.contextbias.schema import AttributeSchema

KEY_COLUMNS = ["extractor", "model", "role", "condition", "prompt_id", "seed", "image_id"]
IMAGE_COLUMNS = {
    "extractor": pl.String,
    "model": pl.String,
    "role": pl.String,
    "condition": pl.String,
    "variant": pl.String,
    "prompt_id": pl.String,
    "seed": pl.Int64,
    "image_id": pl.String,
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
    "extractor": pl.String,
    "model": pl.String,
    "role": pl.String,
    "condition": pl.String,
    "variant": pl.String,
    "prompt_id": pl.String,
    "seed": pl.Int64,
    "image_id": pl.String,
    "cohort": pl.String,
    "dimension": pl.String,
    "label": pl.String,
}


def read_records(paths: list[str | Path]) -> list[dict]:
    return [rec for path in paths for rec in read_jsonl(path)]


def merge_extractions(
    paths: list[str | Path], schema: AttributeSchema
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(attributes, images). Only images with status "ok" contribute labels; every image,
    discarded ones included with their reason, is in the images table."""
    image_rows, attr_rows = [], []
    for rec in read_records(paths):
        labels = schema.labels(rec["attributes"]) if rec.get("status") == "ok" else []
        image_rows.append({**{k: rec.get(k) for k in IMAGE_COLUMNS}, "n_labels": len(labels)})
        base = {
            k: rec.get(k)
            for k in (
                "extractor",
                "model",
                "role",
                "condition",
                "variant",
                "prompt_id",
                "seed",
                "image_id",
            )
        }
        attr_rows.extend(
            {**base, "cohort": c, "dimension": d, "label": lab} for c, d, lab in labels
        )
    images = pl.DataFrame(image_rows, schema=IMAGE_COLUMNS)
    dup = images.filter(pl.struct("extractor", "image_id").is_duplicated())
    if dup.height:
        raise ValueError(
            f"{dup.height} images appear twice in the extraction files "
            f"(e.g. {dup['image_id'][0]}); a shard was listed twice"
        )
    attributes = pl.DataFrame(attr_rows, schema=ATTRIBUTE_COLUMNS)
    return attributes.sort(KEY_COLUMNS + ["dimension", "label"]), images.sort(KEY_COLUMNS)
