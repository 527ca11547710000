"""`stereolens contextbias ...` subcommands."""

from __future__ import annotations

import argparse
from pathlib import Path


def _metrics(args: argparse.Namespace) -> int:
    import polars as pl

    from stereolens.atomic import write_parquet
    from stereolens.contextbias.metrics import pooled_bi
    from stereolens.contextbias.schema import AttributeSchema

    attributes = pl.read_parquet(args.attributes)
    images = pl.read_parquet(args.images) if args.images else None
    schema = AttributeSchema.load(args.schema)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bi = pooled_bi(attributes, images, k_definition=args.k, schema=schema)
    write_parquet(out / "bi.parquet", bi)
    print(f"wrote {out / 'bi.parquet'} ({bi.height} rows, K = {args.k})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    cb = sub.add_parser("contextbias", help="ContextBias benchmark tools")
    cb_sub = cb.add_subparsers(dest="action", required=True)
    m = cb_sub.add_parser(
        "metrics",
        help="compute ContextBias metrics from an attributes table",
        description=(
            "Compute ContextBias metrics from a long attributes table (one row per image x "
            "dimension x label, columns model, role, condition, image_id, cohort, dimension, "
            "label; an `extractor` column, if present, splits every metric by extractor). "
            "Works on the workflow's results/contextbias/attributes.parquet or on your own "
            "annotations. Writes DIR/bi.parquet: Bias Intensity 1 - H(p)/log K per model x "
            "dimension x condition over label counts pooled across roles, cohort rows "
            "(dimension '*') and all-dimension rows (cohort '*')."),
    )
    m.add_argument("--attributes", required=True, metavar="PATH",
                   help="attributes parquet (long form)")
    m.add_argument("--out", required=True, metavar="DIR", help="output directory")
    m.add_argument("--images", metavar="PATH",
                   help="images parquet with image_id, model, condition, status: gives the "
                        "exact number of extracted images per cell (n_images); without it, "
                        "n_images counts the images that have at least one label")
    m.add_argument("--schema", metavar="PATH",
                   help="attribute schema YAML (default: the shipped v1, paper Table 6)")
    m.add_argument("--k", choices=["model", "cell", "vocabulary"], default="model",
                   help="K of BI: 'model' = labels seen for that model and dimension in any "
                        "condition (default, the paper's numbers); 'cell' = labels seen in the "
                        "cell (the released bootstrap); 'vocabulary' = the schema's closed "
                        "vocabulary (open dimensions use 'model')")
    m.set_defaults(func=_metrics)
