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


run_logged(snakemake, main)  # noqa: F821
