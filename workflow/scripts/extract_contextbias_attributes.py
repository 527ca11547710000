"""Entry point of rule extract_contextbias_attributes."""

from stereolens.contextbias.jobs import extract_contextbias_shard
from stereolens.workflow_support import model_job, run_logged


def main(log):
    extract_contextbias_shard(
        model_job(snakemake, log),  # noqa: F821
        extractor=snakemake.wildcards.extractor,  # noqa: F821
        images_dir=snakemake.input.images,  # noqa: F821
        schema_path=snakemake.input.schema,  # noqa: F821
        prompt_path=snakemake.input.prompt,  # noqa: F821
        max_attempts=snakemake.params.max_attempts,  # noqa: F821
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
