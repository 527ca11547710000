"""Entry point of rule extract_lvlm_story_attributes: the assistant reads each story of
one model x setting x axis into the character-attribute schema."""

import json

from stereolens.lvlm.jobs import extract_story_job
from stereolens.workflow_support import model_job, run_logged


def main(log):
    p = snakemake.params  # noqa: F821
    extract_story_job(
        model_job(snakemake, log),  # noqa: F821
        assistant=p.assistant,
        response_paths=list(snakemake.input.responses),  # noqa: F821
        settings=json.loads(p.settings),
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
