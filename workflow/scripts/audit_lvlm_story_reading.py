"""Entry point of rule audit_lvlm_story_reading."""

import polars as pl

from stereolens.atomic import read_jsonl, write_parquet
from stereolens.lvlm.story_reading import audit_readings, load_sample, score_readings
from stereolens.workflow_support import run_logged


def main(log):
    i, o = snakemake.input, snakemake.output  # noqa: F821
    p = snakemake.params  # noqa: F821
    items = score_readings(read_jsonl(i.readings), load_sample(i.sample))
    rates, gaps = audit_readings(items, list(p.axes), pl.read_parquet(i.scores), seed=int(p.seed))
    write_parquet(o.rates, rates)
    write_parquet(o.gaps, gaps)
    log.info(
        "story reading per group: %d item(s), %d flagged axis(es)", items.height, gaps["flag"].sum()
    )


if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
