"""Entry point of rule render_report."""

from stereolens.report import render_report
from stereolens.workflow_support import run_logged


def main(log):
    render_report(
        config=snakemake.params.config,  # noqa: F821
        inputs=dict(snakemake.input.items()),  # noqa: F821
        out_path=snakemake.output[0],  # noqa: F821
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
