"""Entry point of rule export_lvlm_hf_images."""

from stereolens.lvlm.jobs import export_hf_images_job
from stereolens.workflow_support import run_logged


def main(log):
    export_hf_images_job(snakemake.params.settings, snakemake.output[0])  # noqa: F821


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
