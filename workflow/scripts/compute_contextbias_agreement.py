"""Entry point of rule compute_contextbias_agreement."""

from pathlib import Path

import polars as pl

from stereolens.contextbias.annotation.study import agreement_report, write_agreement_tables
from stereolens.workflow_support import run_logged


def main(log):
    i, p = snakemake.input, snakemake.params  # noqa: F821
    attributes = pl.read_parquet(i.attributes)
    if "canonical_label" in attributes.columns:
        attributes = attributes.with_columns(pl.col("canonical_label").alias("label"))
    report = agreement_report(
        list(i.answers),
        i.key,
        attributes,
        replicates=p.replicates,
        seed=p.seed,
        extractor=p.extractor if "extractor" in attributes.columns else None,
    )
    write_agreement_tables(report, Path(snakemake.output.summary).parent)  # noqa: F821
    log.info("agreement tables written")


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
