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


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
