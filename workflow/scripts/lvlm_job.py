"""Entry point of the LVLM rules that load a model (respond_lvlm,
extract_lvlm_story_attributes, judge_lvlm_terms, label_lvlm_refusals)."""

from functools import partial

from stereolens.lvlm.jobs import run_rule
from stereolens.workflow_support import run_logged

# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, partial(run_rule, snakemake))  # noqa: F821
