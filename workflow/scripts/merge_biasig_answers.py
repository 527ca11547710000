"""Entry point of rules merge_biasig_model_answers (one generator's VQA shards -> its
part) and merge_biasig_answers (the parts -> results/biasig/answers.parquet)."""

from stereolens.biasig.merge import merge_answer_parts, merge_model_answers
from stereolens.models.registry import load_registry
from stereolens.workflow_support import run_logged


def main(log):
    smk = snakemake  # noqa: F821
    if smk.rule == "merge_biasig_model_answers":
        registry = load_registry(smk.params.registry)
        counts = merge_model_answers(list(smk.input), smk.output[0], registry)
        log.info("%s: %d answer rows: %s", smk.wildcards.model, sum(counts.values()), counts)
    else:
        rows = merge_answer_parts(list(smk.input), smk.output[0])
        log.info("%d answer rows from %d generator(s)", rows, len(smk.input))


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
