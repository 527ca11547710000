"""Entry point of rule answer_biasig_vqa."""

from stereolens.biasig.jobs import vqa_biasig_shard
from stereolens.workflow_support import model_job, run_logged


def main(log):
    vqa_biasig_shard(
        model_job(snakemake, log),  # noqa: F821
        vlm_name=snakemake.wildcards.extractor,  # noqa: F821
        images_dir=snakemake.input.images,  # noqa: F821
        max_attempts=snakemake.params.max_attempts,  # noqa: F821
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
