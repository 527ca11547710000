"""Entry point of rule audit_contextbias_extraction_by_group."""

import polars as pl

from stereolens.atomic import write_parquet
from stereolens.contextbias.extraction_audit import audit_contextbias
from stereolens.workflow_support import run_logged


def main(log):
    i, o = snakemake.input, snakemake.output  # noqa: F821
    rates, gaps = audit_contextbias(
        pl.read_parquet(i.details),
        pl.read_parquet(i.attributes),
        pl.read_parquet(i.bootstrap),
        seed=int(snakemake.params.seed),  # noqa: F821
    )
    write_parquet(o.by_group, rates)
    write_parquet(o.gaps, gaps)
    log.info("extraction per group: %d group rows, %d flagged", rates.height, gaps["flag"].sum())


# Guarded like every workflow script (vLLM's spawned processes re-run it).
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
