"""Entry point of rule generate_images (every benchmark's generation jobs)."""

import json

from stereolens.generate.job import generate_images_job
from stereolens.workflow_support import model_job, run_logged


def main(log):
    w, p = snakemake.wildcards, snakemake.params  # noqa: F821
    generate_images_job(
        model_job(snakemake, log),  # noqa: F821
        benchmark=w.benchmark,
        model=w.model,
        group=w.group,
        cell=w.cell,
        shard=int(w.shard),
        settings=json.loads(p.settings),
        prompts_path=snakemake.input.prompts,  # noqa: F821
        config=snakemake.config[w.benchmark],  # noqa: F821
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
