"""Entry point of rule render_report."""

from stereolens.report import render_report
from stereolens.workflow_support import run_logged


def main(log):
    i = snakemake.input  # noqa: F821
    render_report(
        config=snakemake.params.config,  # noqa: F821
        prompts_path=i.prompts,
        images_path=i.images,
        bi_path=i.bi,
        out_path=snakemake.output[0],  # noqa: F821
    )


run_logged(snakemake, main)  # noqa: F821
