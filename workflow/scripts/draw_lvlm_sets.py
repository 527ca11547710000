"""Entry point of rule draw_lvlm_sets."""

from stereolens.lvlm.jobs import draw_sets_job
from stereolens.workflow_support import run_logged


def main(log):
    draw_sets_job(
        folder=snakemake.input.folder,  # noqa: F821
        labels_csv=snakemake.params.labels_csv,  # noqa: F821
        lv=snakemake.config["lvlm"],  # noqa: F821
        images_out=snakemake.output.images,  # noqa: F821
        sets_out=snakemake.output.sets,  # noqa: F821
        log=log,
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
