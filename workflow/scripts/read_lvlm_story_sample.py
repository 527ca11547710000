"""Entry point of rule read_lvlm_story_sample (loads the assistant)."""

from stereolens.lvlm.story_reading import read_sample_job
from stereolens.workflow_support import run_logged


def main(log):
    smk = snakemake  # noqa: F821
    read_sample_job(
        registry_path=smk.params.registry,
        assistant=smk.params.assistant,
        lv=smk.config["lvlm"],
        cache_dir=smk.params.cache_dir,
        out_path=smk.output[0],
        log=log,
        threads=smk.threads,
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
