"""Entry point of rule answer_mybench."""

from mybench.jobs import answer

from stereolens.workflow_support import model_job, run_logged


def main(log):
    answer(
        model_job(snakemake, log),  # noqa: F821
        model=snakemake.wildcards.model,  # noqa: F821
        questions=snakemake.params.questions,  # noqa: F821
    )


if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
