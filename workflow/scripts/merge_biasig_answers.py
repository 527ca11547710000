"""Entry point of rule merge_biasig_answers."""

from stereolens.atomic import write_parquet
from stereolens.biasig.jobs import merge_answers
from stereolens.models.registry import load_registry
from stereolens.workflow_support import run_logged


def main(log):
    registry = load_registry(snakemake.params.registry)  # noqa: F821
    answers = merge_answers(list(snakemake.input), registry)  # noqa: F821
    write_parquet(snakemake.output[0], answers)  # noqa: F821
    log.info("%d answer rows: %s", answers.height, dict(answers["status"].value_counts().rows()))


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
