"""Entry point of rule answer_biasig_vqa."""

from stereolens.biasig.jobs import vqa_biasig_shard
from stereolens.models.job import job_resources
from stereolens.workflow_support import run_logged


def main(log):
    p = snakemake.params  # noqa: F821
    vqa_biasig_shard(
        registry_path=p.registry,
        vlm_name=snakemake.wildcards.extractor,  # noqa: F821
        images_dir=snakemake.input.images,  # noqa: F821
        out_path=snakemake.output[0],  # noqa: F821
        max_attempts=p.max_attempts,
        cache_dir=p.cache_dir,
        log=log,
        threads=snakemake.threads,  # noqa: F821
        batch_size=snakemake.resources.get("batch_size"),  # noqa: F821
        job_resources=job_resources(snakemake),  # noqa: F821
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
