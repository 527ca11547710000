"""Entry point of rule label_lvlm_refusals: refusal labels of one model and setting (phrase
rules, plus the LLM judge if configured)."""

import json

from stereolens.lvlm.jobs import refusals_job
from stereolens.workflow_support import model_job, run_logged


def main(log):
    p = snakemake.params  # noqa: F821
    refusals_job(
        model_job(snakemake, log),  # noqa: F821
        judge=p.judge,
        response_paths=list(snakemake.input.responses),  # noqa: F821
        settings=json.loads(p.settings),
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
