"""Entry point of rule collect_job_timings."""

from stereolens.atomic import write_parquet
from stereolens.throughput import collect_job_outputs
from stereolens.workflow_support import run_logged


def main(log):
    outputs = list(snakemake.input.generation) + list(snakemake.input.answers)  # noqa: F821
    jobs = collect_job_outputs(outputs, "results")
    write_parquet(snakemake.output[0], jobs)  # noqa: F821
    log.info("%d of %d job outputs have timing records", jobs.height, len(outputs))


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
