"""Entry point of rule respond_lvlm: the audited model answers one task for one shard of one
group's user images."""

import json

from stereolens.lvlm.jobs import respond_job
from stereolens.workflow_support import model_job, run_logged


def main(log):
    w = snakemake.wildcards  # noqa: F821
    respond_job(
        model_job(snakemake, log),  # noqa: F821
        model=w.model,
        setting=w.setting,
        task=w.task,
        axis=w.axis,
        usergroup=w.usergroup,
        shard=int(w.shard),
        sets_path=snakemake.input.sets,  # noqa: F821
        settings=json.loads(snakemake.params.task_settings),  # noqa: F821
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
