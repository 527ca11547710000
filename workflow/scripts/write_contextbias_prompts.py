"""Entry point of rule write_contextbias_prompts."""

from stereolens.atomic import write_parquet
from stereolens.contextbias.prompts import build_prompts
from stereolens.workflow_support import run_logged


def main(log):
    p = snakemake.params  # noqa: F821
    prompts = build_prompts(
        models=list(p.generators),
        seeds_per_prompt=p.seeds["per_prompt"],
        bank_keys=dict(p.seeds["bank_keys"]),
        default_bank_key=p.seeds["default_bank_key"],
        roles=list(p.roles),
        bank_path=snakemake.input.bank,  # noqa: F821
        fix_articles=p.fix_articles,
    )
    write_parquet(snakemake.output[0], prompts)  # noqa: F821
    log.info("%d prompts for %d roles", prompts.height, prompts["role"].n_unique())


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
