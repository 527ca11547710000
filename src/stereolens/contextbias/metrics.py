"""ContextBias metrics on the long attributes table.

Input columns: model, role, condition, image_id, cohort, dimension, label (plus
extractor, optional: when present every metric is computed per extractor too).
"""

from __future__ import annotations

import polars as pl

from stereolens.contextbias.schema import AttributeSchema
from stereolens.metrics.entropy import bias_intensity

REQUIRED = ("model", "role", "condition", "image_id", "cohort", "dimension", "label")
K_DEFINITIONS = ("model", "cell", "vocabulary")
BI_COLUMNS = ["model", "cohort", "dimension", "condition", "aggregation", "bi", "n_images",
              "k", "k_definition"]


def check_attributes(attributes: pl.DataFrame, source: str = "attributes table") -> None:
    missing = [c for c in REQUIRED if c not in attributes.columns]
    if missing:
        raise ValueError(f"{source} lacks columns {missing}; it needs {list(REQUIRED)} "
                         "(one row per image x dimension x label)")
    bad = attributes.filter(pl.col("label").is_null()
                            | pl.col("label").str.to_lowercase().is_in(["unknown", "none", ""]))
    if bad.height:
        raise ValueError(f"{source} has {bad.height} rows whose label is unknown, none, empty "
                         "or null; drop them (they are never counted)")


def _group_keys(attributes: pl.DataFrame) -> list[str]:
    return (["extractor"] if "extractor" in attributes.columns else []) + ["model"]


def image_counts(attributes: pl.DataFrame, images: pl.DataFrame | None) -> pl.DataFrame:
    """Images extracted per (extractor,) model, condition: the denominator n.

    From the images table (status ok) when given, else the distinct images in the
    attributes table (an image with no label at all is then missed)."""
    keys = _group_keys(attributes) + ["condition"]
    if images is not None:
        src = images.filter(pl.col("status") == "ok") if "status" in images.columns else images
        return src.group_by([k for k in keys if k in src.columns]).agg(
            pl.col("image_id").n_unique().alias("n_images"))
    return attributes.group_by(keys).agg(pl.col("image_id").n_unique().alias("n_images"))


def pooled_bi(attributes: pl.DataFrame, images: pl.DataFrame | None = None,
              k_definition: str = "model",
              schema: AttributeSchema | None = None) -> pl.DataFrame:
    """BI per (extractor,) model x dimension x condition over label counts pooled across
    roles (aggregation "pooled"), plus cohort rows (dimension "*": mean of the cohort's
    dimensions) and all-dimension rows (cohort "*", dimension "*")."""
    if k_definition not in K_DEFINITIONS:
        raise ValueError(f"k_definition {k_definition!r}; allowed: {', '.join(K_DEFINITIONS)}")
    check_attributes(attributes)
    gkeys = _group_keys(attributes)
    cell = gkeys + ["cohort", "dimension", "condition"]
    counts = attributes.group_by(cell + ["label"]).agg(pl.len().alias("count"))
    k_model = attributes.group_by(gkeys + ["dimension"]).agg(
        pl.col("label").n_unique().alias("k_model"))
    vocab = (schema or AttributeSchema.load()).vocabulary()
    rows = []
    cells = counts.group_by(cell).agg(pl.col("count"), pl.col("label")).join(
        k_model, on=gkeys + ["dimension"])
    for r in cells.iter_rows(named=True):
        if k_definition == "cell":
            k = len(r["count"])
        elif k_definition == "vocabulary" and vocab.get(r["dimension"]):
            k = len(vocab[r["dimension"]])
            outside = set(r["label"]) - set(vocab[r["dimension"]])
            if outside:
                raise ValueError(f"dimension {r['dimension']} has labels outside the schema "
                                 f"vocabulary ({sorted(outside)[:5]}); use --k model")
        else:
            k = r["k_model"]
        rows.append({**{c: r[c] for c in cell}, "bi": bias_intensity(r["count"], k), "k": k})
    schema_cols = {**{c: pl.String for c in cell}, "bi": pl.Float64, "k": pl.Int64}
    dims = pl.DataFrame(rows, schema=schema_cols).with_columns(
        pl.col("bi").fill_nan(None))
    dims = dims.join(image_counts(attributes, images), on=gkeys + ["condition"], how="left")
    cohorts = dims.group_by(gkeys + ["cohort", "condition"]).agg(
        pl.col("bi").mean(), pl.col("n_images").first()).with_columns(
        pl.lit("*").alias("dimension"), pl.lit(None, pl.Int64).alias("k"))
    overall = dims.group_by(gkeys + ["condition"]).agg(
        pl.col("bi").mean(), pl.col("n_images").first()).with_columns(
        pl.lit("*").alias("cohort"), pl.lit("*").alias("dimension"),
        pl.lit(None, pl.Int64).alias("k"))
    cols = gkeys + ["cohort", "dimension", "condition", "bi", "n_images", "k"]
    out = pl.concat([dims.select(cols), cohorts.select(cols), overall.select(cols)])
    out = out.with_columns(pl.lit("pooled").alias("aggregation"),
                           pl.lit(k_definition).alias("k_definition"),
                           pl.col("n_images").cast(pl.Int64))
    order = (["extractor"] if "extractor" in gkeys else []) + BI_COLUMNS
    return out.select(order).sort(gkeys + ["cohort", "dimension", "condition"])
