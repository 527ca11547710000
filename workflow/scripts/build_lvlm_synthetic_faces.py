"""Entry point of rule build_lvlm_synthetic_faces."""

from stereolens.lvlm.groups import build_synthetic_faces
from stereolens.workflow_support import run_logged


def main(log):
    p = snakemake.params  # noqa: F821
    build_synthetic_faces(snakemake.output[0], n_per_cell=p.per_cell, seed=p.seed)  # noqa: F821


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
