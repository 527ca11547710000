"""Entry point of rule score_contextbias_validation."""

import polars as pl

from stereolens.atomic import write_parquet
from stereolens.contextbias.validation import validation_details, validation_scores
from stereolens.contextbias.validation_truth import load_validation_truth
from stereolens.workflow_support import run_logged


def main(log):
    i = snakemake.input  # noqa: F821
    attributes = pl.read_parquet(i.attributes)
    images = pl.read_parquet(i.images)
    truth = load_validation_truth(i.truth)
    scores = validation_scores(attributes, images, truth)
    details = validation_details(attributes, images, truth)
    write_parquet(snakemake.output.details, details)  # noqa: F821
    write_parquet(snakemake.output.scores, scores)  # noqa: F821
    log.info("validation scores: %d rows", scores.height)


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
