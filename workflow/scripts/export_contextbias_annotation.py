"""Entry point of rule export_contextbias_annotation."""

from pathlib import Path

import polars as pl

from stereolens.contextbias.agreement import export_annotation_sample
from stereolens.workflow_support import run_logged


def main(log):
    p = snakemake.params  # noqa: F821
    s = p.settings
    paths = export_annotation_sample(
        pl.read_parquet(snakemake.input.images),  # noqa: F821
        pl.read_parquet(snakemake.input.attributes),  # noqa: F821
        Path(snakemake.output.form).parent,  # noqa: F821
        roles=list(p.roles),
        conditions=tuple(p.conditions),
        generators=list(p.generators),
        images_per_set=s["images_per_set"],
        allow_short=s["allow_short"],
        dimensions=s["dimensions"],
        seed=s["seed"],
    )
    log.info("annotation form: %s", paths)


run_logged(snakemake, main)  # noqa: F821
