# Input functions of the ContextBias rules (contextbias.smk, contextbias_studies.smk): the
# canonicalisation LLM, the prompt bank and extraction files, the extraction shards of each
# merge part (from the plug-in's jobs) and the validation inputs.

from stereolens.contextbias.plugin import prompt_bank as contextbias_prompt_bank
from stereolens.contextbias.plugin import roles as contextbias_roles

CB = config["contextbias"]
CB_OUT = layout("contextbias")
# roles present, every condition present, prompts non-empty, names that fit a folder:
# refused here, at parse time, not in a job after the queue
CB_ROLES = contextbias_roles(config)
CB_CONDITIONS = CB["conditions"]
CB_VAL = CB["validation"]


def get_canonical_llm_checkpoint(wildcards):
    return helper_checkpoint(CB["canonicalisation"]["llm"])


def get_canonical_llm_fingerprint(wildcards):
    return helper_fingerprint(CB["canonicalisation"]["llm"])


def get_canonical_overrides(wildcards):
    path = CB["canonicalisation"]["overrides"]
    return [path] if path else []


@lru_cache(maxsize=None)
def get_prompt_bank():
    return contextbias_prompt_bank(config)


def get_extraction_files():
    from stereolens.paths import resource

    ex = CB["extraction"]
    return {
        "schema": ex["schema"] or str(resource("contextbias", "attribute_schema.v1.yaml")),
        "prompt": ex["prompt"] or str(resource("contextbias", "extraction_prompt.v1.yaml")),
    }


@per_job
def get_contextbias_extractions(wildcards):
    """The extraction shards of one (extractor, generator) part of the merge (the
    wildcards'): the plug-in's extraction jobs of that pair, validation (VAL) aside; in
    rounds (design.mode adaptive) those of the rounds the pair's cell ran."""
    key = (wildcards.extractor, wildcards.model, False)
    if "contextbias" not in ROUNDS:
        return contextbias_extractions().get(key, [])
    # design.mode adaptive: the shards of the rounds this cell ran (workflow/rules/adaptive.smk)
    return [
        job.output
        for job in run_jobs("contextbias", wildcards.model)
        if job.stage == "extract"
        and (
            job.wildcards["extractor"],
            job.wildcards["model"],
            job.wildcards["condition"] == "VAL",
        )
        == key
    ]


@lru_cache(maxsize=None)
def contextbias_extractions():
    """(extractor, generator, validation?) -> the outputs of its extraction jobs."""
    out = {}
    for job in plugin_jobs("contextbias"):
        if job.stage == "extract":
            w = job.wildcards
            key = (w["extractor"], w["model"], w["condition"] == "VAL")
            out.setdefault(key, []).append(job.output)
    return out


def get_contextbias_merge_parts(wildcards=None):
    """Every (extractor, generator) part of the attributes merge: the pairs of the
    plug-in's extraction jobs, validation (VAL) aside, in its job order."""
    pairs = dict.fromkeys((e, g) for e, g, val in contextbias_extractions() if not val)
    return {
        name: [CB_OUT("merged", extractor=e, model=g, table=name) for e, g in pairs]
        for name in ("attributes_raw", "images")
    }


def get_validation_extractions(wildcards=None):
    """The extraction shards of the validation prompts (VAL), of every extractor x
    generator."""
    return [p for (_, _, val), paths in contextbias_extractions().items() if val for p in paths]


def get_validation_truth():
    from stereolens.paths import resource

    return CB_VAL["truth"] or str(resource("contextbias", "validation_truth.v1.yaml"))


def get_contextbias_human_labels(wildcards):
    """The human-label table of correct_contextbias_reader: contextbias.reader_correction
    .human_labels, else (simulate) the simulated one."""
    return CB["reader_correction"]["human_labels"] or CB_OUT.human_labels_simulated
