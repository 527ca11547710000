"""Entry point of rule build_lvlm_synthetic_faces."""

from stereolens.lvlm.jobs import build_synthetic_faces_job
from stereolens.workflow_support import run_logged


def main(log):
    p = snakemake.params  # noqa: F821
    build_synthetic_faces_job(snakemake.output[0], p.per_cell, p.seed)  # noqa: F821


run_logged(snakemake, main)  # noqa: F821
