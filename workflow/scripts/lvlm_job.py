"""Entry point of the LVLM rules that load a model (respond_lvlm,
extract_lvlm_story_attributes, judge_lvlm_terms, label_lvlm_refusals)."""

from functools import partial

from stereolens.lvlm.jobs import run_rule
from stereolens.workflow_support import run_logged

run_logged(snakemake, partial(run_rule, snakemake))  # noqa: F821
