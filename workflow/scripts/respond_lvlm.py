"""Entry point of rule respond_lvlm: the audited model answers one task for one shard of one
group's user images."""

import json

from stereolens.lvlm.jobs import respond_job
from stereolens.models.job import job_resources
from stereolens.workflow_support import run_logged


def main(log):
    w, p = snakemake.wildcards, snakemake.params  # noqa: F821
    respond_job(
        registry_path=p.registry,
        model=w.model,
        setting=w.setting,
        task=w.task,
        axis=w.axis,
        usergroup=w.usergroup,
        shard=int(w.shard),
        sets_path=snakemake.input.sets,  # noqa: F821
        settings=json.loads(p.task_settings),
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
