"""Entry point of checkpoint adaptive_round: one round's interim decisions of one group
(stereolens.design.rounds)."""

import polars as pl

from stereolens.atomic import write_parquet
from stereolens.benchmark import benchmark, resolve
from stereolens.design.rounds import decide_round
from stereolens.workflow_support import run_logged


def main(log):
    smk = snakemake  # noqa: F821
    plugin = benchmark(smk.wildcards.benchmark)
    round_ = int(smk.wildcards.round)
    current = resolve(plugin.rounds.interim)(smk.config, list(smk.input.shards))
    previous = [pl.read_parquet(p) for p in smk.input.previous]
    table = decide_round(smk.config, plugin, round_, current, previous)
    write_parquet(smk.output[0], table)
    for row in table.iter_rows(named=True):
        log.info(
            "round %d %s: estimate %.4g, se %s, critical %.3g -> %s (%s)",
            round_, row["cell"], row["estimate"], row["se"], row["critical"],
            row["decision"], row["reason"],
        )  # fmt: skip


if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
