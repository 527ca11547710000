# Input functions of the LVLM rules (lvlm.smk) and of the story-reading audit (lvlm_studies.smk):
# the job files from the LVLM plug-in's jobs (plugin_jobs("lvlm"), in its order), the
# params from stereolens.lvlm.params; paths name groups by their path-safe slug
# ("East Asian" -> east-asian).


from stereolens.lvlm import params as lvlm_params

LV = config["lvlm"]
LV_OUT = layout("lvlm")
LV_CACHE = SHARED("cache", kind="lvlm") if LV["cache"] else None


def lvlm_outputs(rule, **selected):
    """Outputs of the LVLM jobs of ``rule`` whose wildcards have the ``selected`` values."""
    return [
        job.output
        for job in plugin_jobs("lvlm")
        if job.rule == rule and all(job.wildcards[k] == v for k, v in selected.items())
    ]


def get_lvlm_image_folder():
    return lvlm_params.image_folder(LV)


def get_lvlm_labels_csv():
    return lvlm_params.labels_csv(LV)


def get_lvlm_prompt_file():
    return lvlm_params.prompt_file(LV)


def get_lvlm_reader_sample_files():
    """The outputs of export_lvlm_reader_sample by name (lvlm.plugin.reader_sample_files)."""
    from stereolens.lvlm.plugin import reader_sample_files

    return reader_sample_files(LV)


def get_lvlm_draw_settings(wildcards):
    return lvlm_params.draw_settings(LV)


# Inputs, params and resources of the model-loading LVLM rules. Every setting that changes
# a job's result is a param (so Snakemake's params trigger covers all of them); speed-only
# settings (batch size, memory) are resources, halved / raised on a retry (--retries).
# The response jobs take the {model} wildcard's get_model_* functions; the assistant's and
# the refusal judge's jobs run one fixed registry entry (None: none configured).


@per_job
def get_lvlm_task_settings(wildcards):
    return lvlm_params.task_settings(LV, wildcards.task)


def get_lvlm_story_responses(wildcards):
    return lvlm_outputs(
        "respond_lvlm",
        model=wildcards.model,
        setting=wildcards.setting,
        task="story",
        axis=wildcards.axis,
    )


def get_lvlm_term_responses(wildcards):
    return lvlm_outputs(
        "respond_lvlm",
        model=wildcards.model,
        setting=wildcards.setting,
        task="term",
        axis=wildcards.axis,
    )


def get_lvlm_setting_responses(wildcards):
    return lvlm_outputs("respond_lvlm", model=wildcards.model, setting=wildcards.setting)


def get_lvlm_assistant_checkpoint(wildcards):
    return helper_checkpoint(LV["assistant"])


def get_lvlm_assistant_gpu(wildcards):
    return helper_gpu(LV["assistant"])


def get_lvlm_assistant_mem_mb(wildcards, attempt):
    return helper_mem_mb(LV["assistant"], attempt)


def get_lvlm_assistant_batch_size(wildcards, attempt):
    return helper_batch_size(LV["assistant"], attempt)


def get_lvlm_judge_checkpoint(wildcards):
    return helper_checkpoint(LV["refusal_judge"])


def get_lvlm_judge_gpu(wildcards):
    return helper_gpu(LV["refusal_judge"])


def get_lvlm_judge_mem_mb(wildcards, attempt):
    return helper_mem_mb(LV["refusal_judge"], attempt)


def get_lvlm_judge_batch_size(wildcards, attempt):
    return helper_batch_size(LV["refusal_judge"], attempt)


def get_lvlm_model_merge_inputs(wildcards):
    """One audited model's files for its part of the merged LVLM tables."""
    m = wildcards.model
    return {
        "responses": lvlm_outputs("respond_lvlm", model=m),
        "refusals": lvlm_outputs("label_lvlm_refusals", model=m),
        "stories": lvlm_outputs("extract_lvlm_story_attributes", model=m),
        "judgements": lvlm_outputs("judge_lvlm_terms", model=m),
    }


LV_TABLES = ("responses", "story_attributes", "stories", "term_judgements")


def get_lvlm_merge_parts(wildcards):
    """Every model's part of each merged LVLM table (models in sorted order)."""
    return {
        name: [LV_OUT("merged", model=m, table=name) for m in sorted(LV["models"])]
        for name in LV_TABLES
    }


# ---- Designing an audit (input functions of workflow/rules/lvlm_studies.smk)


def get_story_reading_sample():
    return lvlm_params.story_reading_sample(LV)


def get_lvlm_human_labels(wildcards):
    """The human-label table of correct_lvlm_reader: lvlm.reader_correction.human_labels,
    else (simulate) the simulated one."""
    return LV["reader_correction"]["human_labels"] or LV_OUT.human_labels_simulated
