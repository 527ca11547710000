"""Entry point of rule merge_lvlm_responses."""

from stereolens.lvlm.jobs import merge_job
from stereolens.workflow_support import run_logged


def main(log):
    i = snakemake.input  # noqa: F821
    merge_job(
        response_paths=list(i.responses),
        refusal_paths=list(i.refusals),
        story_paths=list(i.stories),
        judgement_paths=list(i.judgements),
        out=dict(snakemake.output.items()),  # noqa: F821
        log=log,
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
