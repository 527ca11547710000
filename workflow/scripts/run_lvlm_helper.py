"""Entry point of the rules in which a helper model reads the audited model's responses:
extract_lvlm_story_attributes (the assistant reads each story into the character-attribute
schema), judge_lvlm_terms (the assistant picks the more technical explanation in cross-group
pairs) and label_lvlm_refusals (phrase rules, plus the LLM judge if configured)."""

import json

from stereolens.lvlm import jobs
from stereolens.workflow_support import model_job, run_logged

JOBS = {
    "extract_lvlm_story_attributes": (jobs.extract_story_job, "assistant"),
    "judge_lvlm_terms": (jobs.judge_terms_job, "assistant"),
    "label_lvlm_refusals": (jobs.refusals_job, "judge"),
}
"""Rule -> its job of stereolens.lvlm.jobs and the param naming its helper model."""


def main(log):
    job, helper = JOBS[snakemake.rule]  # noqa: F821
    p = snakemake.params  # noqa: F821
    job(
        model_job(snakemake, log),  # noqa: F821
        response_paths=list(snakemake.input.responses),  # noqa: F821
        settings=json.loads(p.settings),
        **{helper: getattr(p, helper)},
    )


# Guarded: vLLM starts its engine with the spawn method, which re-runs this file (as
# __mp_main__) in the engine's process, where no `snakemake` object exists.
if __name__ == "__main__":
    run_logged(snakemake, main)  # noqa: F821
