"""Entry point of rule read_lvlm_story_sample (loads the assistant)."""

from stereolens.lvlm.params import story_sample_config
from stereolens.lvlm.story_reading import read_sample_job
from stereolens.workflow_support import model_job, run_logged


def main(log):
    smk = snakemake  # noqa: F821
    read_sample_job(
        model_job(smk, log),
        assistant=smk.params.assistant,
        lv=story_sample_config(smk.params.settings),
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
