"""Entry point of rule generate_biasig_images."""

import json

from stereolens.biasig.jobs import generate_biasig_shard
from stereolens.workflow_support import run_logged


def main(log):
    w, p = snakemake.wildcards, snakemake.params  # noqa: F821
    s = json.loads(p.settings)
    generate_biasig_shard(
        registry_path=p.registry,
        model=w.model,
        acquired_type=w.atype,
        condition=w.visibility,
        shard=int(w.shard),
        prompts_per_shard=s["prompts_per_shard"],
        images_per_prompt=s["images_per_prompt"],
        out_dir=snakemake.output[0],  # noqa: F821
        prompts_path=snakemake.input.prompts,  # noqa: F821
        seed_base=s["seed_base"],
        log=log,
        threads=snakemake.threads,  # noqa: F821
    )


run_logged(snakemake, main)  # noqa: F821
