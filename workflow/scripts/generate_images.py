"""Entry point of rule generate_images (every benchmark's generation jobs)."""

import json

from stereolens.generate.job import generate_images_job
from stereolens.models.job import job_resources
from stereolens.workflow_support import run_logged


def main(log):
    w, p = snakemake.wildcards, snakemake.params  # noqa: F821
    generate_images_job(
        registry_path=p.registry,
        benchmark=w.benchmark,
        model=w.model,
        group=w.group,
        cell=w.cell,
        shard=int(w.shard),
        settings=json.loads(p.settings),
        prompts_path=snakemake.input.prompts,  # noqa: F821
        out_dir=snakemake.output[0],  # noqa: F821
        config=snakemake.config[w.benchmark],  # noqa: F821
        batch_size=snakemake.resources.get("batch_size"),  # noqa: F821
        log=log,
        threads=snakemake.threads,  # noqa: F821
        job_resources=job_resources(snakemake),  # noqa: F821
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
