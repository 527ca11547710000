"""Entry point of rule collect_adaptive_decisions: every round's table of a benchmark in
one, with the workflow's GPU-hours cap (stereolens.design.rounds.collect)."""

import json

import polars as pl

from stereolens.atomic import write_parquet
from stereolens.design.rounds import Budget, collect
from stereolens.workflow_support import run_logged


def main(log):
    smk = snakemake  # noqa: F821
    at = Budget(**json.loads(smk.params.budget))
    table = collect([pl.read_parquet(p) for p in smk.input], at)
    write_parquet(smk.output[0], table)
    stops = table.filter(pl.col("decision") == "stop")
    log.info(
        "%d rows over %d rounds; stops: %s",
        table.height, table["round"].max(), dict(stops.group_by("reason").len().iter_rows()),
    )  # fmt: skip


if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
