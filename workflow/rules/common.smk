# Config validation, registry, wildcard constraints and input functions.
# Module-level code stays cheap: every SLURM job re-parses this file.

import json
import math
import os

from stereolens.config import check_models, validate_config
from stereolens.contextbias.prompts import CONDITIONS as ALL_CONDITIONS
from stereolens.registry import load_registry
from stereolens.workflow_support import bank_roles, model_fingerprint_json, validation_roles


validate_config(config)
REGISTRY = load_registry(config["registry"])
check_models(config, REGISTRY)

CB = config["contextbias"]
CB_ROLES = CB["roles"] or bank_roles(CB["prompt_bank"])
CB_CONDITIONS = CB["conditions"]
CB_SHARDS = list(range(math.ceil(CB["seeds"]["per_prompt"] / CB["seeds"]["per_shard"])))
CB_VAL = CB["validation"]
CB_VAL_ROLES = validation_roles(CB["roles"]) if CB_VAL["enabled"] else []
CB_VAL_SHARDS = list(range(math.ceil(CB_VAL["seeds_per_prompt"] / CB["seeds"]["per_shard"])))


wildcard_constraints:
    model=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    extractor=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    role=r"[a-z0-9_]+",
    condition="|".join([*ALL_CONDITIONS, "VAL"]),
    shard=r"[0-9]+",
    checkpoint=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    atype="occupation|characteristic|social_relation",
    visibility="implicit|explicit",


def model_spec(name):
    return REGISTRY[name]


def get_checkpoint(name):
    """A locally built checkpoint the model needs (embedded default), else nothing."""
    spec = REGISTRY[name]
    return [spec.model] if spec.get("build") else []


def get_tiny_builder(wildcards):
    path = f"resources/models/{wildcards.checkpoint}"
    builders = {s.get("build") for s in REGISTRY.values() if s.get("build") and s.model == path}
    if len(builders) != 1:
        raise ValueError(f"no single registry entry builds {path}: found {sorted(builders)}")
    return builders.pop()


def get_extractor_env(wildcards):
    """Conda env of an extraction job: vLLM brings its own CUDA torch."""
    name = "vllm" if REGISTRY[wildcards.extractor].backend == "vllm" else "extract"
    return os.path.join(workflow.basedir, "envs", f"{name}.yaml")


def get_generator_fingerprint(wildcards):
    return model_fingerprint_json(REGISTRY[wildcards.model])


def get_extractor_fingerprint(wildcards):
    return model_fingerprint_json(REGISTRY[wildcards.extractor])


def get_canonical_llm_checkpoint(wildcards):
    llm = CB["canonicalisation"]["llm"]
    return get_checkpoint(llm) if llm else []


def get_canonical_llm_fingerprint(wildcards):
    llm = CB["canonicalisation"]["llm"]
    return model_fingerprint_json(REGISTRY[llm]) if llm else "none"


def get_canonical_overrides(wildcards):
    path = CB["canonicalisation"]["overrides"]
    return [path] if path else []


def get_prompt_bank():
    from stereolens.paths import resource

    return CB["prompt_bank"] or str(resource("contextbias", "prompts.json"))


def get_seed_settings(wildcards):
    """What decides a generator's seeds; a change here regenerates that model only."""
    seeds = CB["seeds"]
    if wildcards.condition == "VAL":
        return json.dumps(
            {"per_prompt": CB_VAL["seeds_per_prompt"], "seed_key": CB_VAL["seed_key"]},
            sort_keys=True,
        )
    return json.dumps(
        {
            "per_prompt": seeds["per_prompt"],
            "bank_key": seeds["bank_keys"].get(wildcards.model, seeds["default_bank_key"]),
            "default_bank_key": seeds["default_bank_key"],
            "fix_articles": CB["fix_articles"],
        },
        sort_keys=True,
    )


def get_extraction_files():
    from stereolens.paths import resource

    ex = CB["extraction"]
    return {
        "schema": ex["schema"] or str(resource("contextbias", "attribute_schema.v1.yaml")),
        "prompt": ex["prompt"] or str(resource("contextbias", "extraction_prompt.v1.yaml")),
    }


def get_contextbias_extractions(wildcards=None):
    return expand(
        "results/contextbias/extractions/{extractor}/{model}/{role}/{condition}/{shard}.jsonl",
        extractor=CB["extractors"],
        model=CB["generators"],
        role=CB_ROLES,
        condition=CB_CONDITIONS,
        shard=CB_SHARDS,
    )


def get_validation_extractions(wildcards=None):
    return expand(
        "results/contextbias/extractions/{extractor}/{model}/{role}/VAL/{shard}.jsonl",
        extractor=CB["extractors"],
        model=CB["generators"],
        role=CB_VAL_ROLES,
        shard=CB_VAL_SHARDS,
    )


def get_validation_truth():
    from stereolens.paths import resource

    return CB_VAL["truth"] or str(resource("contextbias", "validation_truth.v1.yaml"))


BG = config["biasig"]


def biasig_selection():
    """The configured subset of the shipped BiasIG prompt table (read from its stored
    parquet: milliseconds, so every cluster job can re-plan cheaply)."""
    from stereolens.biasig.prompts import load_prompts, select_prompts

    return select_prompts(
        load_prompts(),
        BG["acquired_types"],
        BG["conditions"],
        BG["acquired_attributes"],
        BG["max_variants"],
    )


def biasig_shards():
    """(acquired_type, condition, shard) of every BiasIG generation job."""
    from stereolens.biasig.jobs import n_shards

    if not BG["enabled"]:
        return []
    sel = biasig_selection()
    out = []
    for (atype, cond), _ in sel.group_by(["acquired_type", "visibility"]):
        n = n_shards(sel, atype, cond, BG["prompts_per_shard"])
        out += [(atype, cond, i) for i in range(n)]
    return sorted(out)


BG_SHARDS = biasig_shards()


def get_biasig_vqa_outputs(wildcards=None):
    return [
        f"results/biasig/vqa/{BG['vqa']}/{model}/{atype}/{cond}/{shard}.jsonl"
        for model in BG["generators"]
        for atype, cond, shard in BG_SHARDS
    ]


def get_biasig_settings(wildcards):
    """What decides a BiasIG shard's images besides the model (a change reruns it)."""
    return json.dumps(
        {
            k: BG[k]
            for k in (
                "acquired_types",
                "conditions",
                "acquired_attributes",
                "max_variants",
                "images_per_prompt",
                "prompts_per_shard",
                "seed_base",
            )
        },
        sort_keys=True,
    )


def get_report_config():
    """The config as the report shows it, with model lists sorted: the order in which a
    user lists models changes no result, so it must not rerun the report."""
    import copy

    shown = copy.deepcopy(config)
    for section, key in (
        ("contextbias", "generators"),
        ("contextbias", "extractors"),
        ("biasig", "generators"),
    ):
        if key in shown.get(section, {}):
            shown[section][key] = sorted(shown[section][key])
    return shown


def get_report_inputs(wildcards):
    """Every table the report shows; optional studies only when configured."""
    inputs = {
        "prompts": "results/contextbias/prompts.parquet",
        "images": "results/contextbias/images.parquet",
        "mapping": "results/contextbias/canonical_mapping.parquet",
        **{
            name: f"results/contextbias/metrics/{name}.parquet"
            for name in ("bi", "ccs", "ccs_mean", "robustness", "bootstrap")
        },
    }
    if CB_VAL["enabled"]:
        inputs["validation"] = "results/contextbias/validation/scores.parquet"
    if CB["annotation"]["enabled"]:
        inputs["annotation_form"] = "results/contextbias/annotation/form.html"
    if CB["annotation"]["answers"]:
        inputs["agreement"] = "results/contextbias/annotation/agreement_summary.parquet"
    if BG["enabled"]:
        for name in ("implicit", "explicit", "eta"):
            inputs[f"biasig_{name}"] = f"results/biasig/metrics/{name}.parquet"
    return inputs


def get_final_targets():
    targets = []
    if BG["enabled"]:
        targets += ["results/biasig/answers.parquet", "results/biasig/metrics/eta.parquet"]
    if CB_VAL["enabled"]:
        targets.append("results/contextbias/validation/scores.parquet")
    if CB["annotation"]["enabled"]:
        targets.append("results/contextbias/annotation/form.html")
    if CB["annotation"]["answers"]:
        targets.append("results/contextbias/annotation/agreement_summary.parquet")
    return targets + [
        "results/contextbias/prompts.parquet",
        "results/contextbias/attributes.parquet",
        "results/contextbias/metrics/bi.parquet",
        "results/report/index.html",
    ]
