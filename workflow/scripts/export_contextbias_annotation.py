"""Entry point of rule export_contextbias_annotation."""

from pathlib import Path

import polars as pl

from stereolens.contextbias.annotation.form import export_annotation_sample
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


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
