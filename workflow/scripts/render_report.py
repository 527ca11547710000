"""Entry point of rule render_report."""

from stereolens.report import render_report
from stereolens.workflow_support import run_logged


def main(log):
    render_report(
        config=snakemake.params.config,  # noqa: F821
        inputs=dict(snakemake.input.items()),  # noqa: F821
        out_path=snakemake.output[0],  # noqa: F821
    )


run_logged(snakemake, main)  # noqa: F821
