"""Entry point of rule label_lvlm_refusals: refusal labels of one model and setting (phrase
rules, plus the LLM judge if configured)."""

import json

from stereolens.lvlm.jobs import refusals_job
from stereolens.models.job import job_resources
from stereolens.workflow_support import run_logged


def main(log):
    p = snakemake.params  # noqa: F821
    refusals_job(
        registry_path=p.registry,
        judge=p.judge,
        response_paths=list(snakemake.input.responses),  # noqa: F821
        settings=json.loads(p.settings),
        cache_dir=p.cache_dir,
        out_path=snakemake.output[0],  # noqa: F821
        log=log,
        threads=snakemake.threads,  # noqa: F821
        batch_size=snakemake.resources.get("batch_size"),  # noqa: F821
        job_resources=job_resources(snakemake),  # noqa: F821
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
