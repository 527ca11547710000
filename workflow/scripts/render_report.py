"""Entry point of rule render_report."""

from pathlib import Path

from stereolens.report.inputs import Inputs
from stereolens.report.render import render_report
from stereolens.workflow_support import run_logged


def main(log):
    inputs = dict(snakemake.input.items())  # noqa: F821
    got = render_report(
        config=snakemake.params.config,  # noqa: F821
        inputs=Inputs(inputs, roots=[Path.cwd()], models=snakemake.params.models),  # noqa: F821
        out_path=snakemake.output.index,  # noqa: F821
        cache_dir=snakemake.params.thumbnail_cache,  # noqa: F821
        threads=snakemake.threads,  # noqa: F821
    )
    log.info("report: %s", {k: v for k, v in got.items() if k != "index"})


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
