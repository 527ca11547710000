"""Entry point of rule export_lvlm_hf_images."""

from stereolens.lvlm.user_images import export_hf_images
from stereolens.workflow_support import run_logged


def main(log):
    s = snakemake.params.settings  # noqa: F821
    export_hf_images(
        s["dataset"],
        snakemake.output[0],  # noqa: F821
        config_name=s["dataset_config"],
        split=s["split"],
        revision=s["revision"],
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
