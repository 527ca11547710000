"""Entry point of rule write_biasig_prompts."""

import json

from stereolens.atomic import write_parquet
from stereolens.biasig.prompts import load_prompts, select_prompts
from stereolens.workflow_support import run_logged


def main(log):
    s = json.loads(snakemake.params.settings)  # noqa: F821
    sel = select_prompts(
        load_prompts(),
        s["acquired_types"],
        s["conditions"],
        s["acquired_attributes"],
        s["max_variants"],
    )
    write_parquet(snakemake.output[0], sel)  # noqa: F821
    log.info("%d BiasIG prompts selected", sel.height)


run_logged(snakemake, main)  # noqa: F821
