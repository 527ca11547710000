"""Entry point of rule generate_contextbias_images."""

import json

from stereolens.contextbias.jobs import generate_contextbias_shard
from stereolens.workflow_support import run_logged


def main(log):
    w, p = snakemake.wildcards, snakemake.params  # noqa: F821
    generate_contextbias_shard(
        registry_path=p.registry,
        model=w.model,
        role=w.role,
        condition=w.condition,
        shard=int(w.shard),
        seed_settings=json.loads(p.seed_settings),
        seeds_per_shard=snakemake.config["contextbias"]["seeds"]["per_shard"],  # noqa: F821
        bank_path=snakemake.input.bank,  # noqa: F821
        out_dir=snakemake.output[0],  # noqa: F821
        log=log,
        threads=snakemake.threads,  # noqa: F821
    )


run_logged(snakemake, main)  # noqa: F821
