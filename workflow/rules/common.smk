# Config validation, registry, wildcard constraints and input functions.
# Module-level code stays cheap: every SLURM job re-parses this file.

import json
import math
import os

from stereolens.config import check_models, validate_config
from stereolens.contextbias.prompts import CONDITIONS as ALL_CONDITIONS
from stereolens.registry import load_registry
from stereolens.workflow_support import bank_roles, model_fingerprint_json


validate_config(config)
REGISTRY = load_registry(config["registry"])
check_models(config, REGISTRY)

CB = config["contextbias"]
CB_ROLES = CB["roles"] or bank_roles(CB["prompt_bank"])
CB_CONDITIONS = CB["conditions"]
CB_SHARDS = list(range(math.ceil(CB["seeds"]["per_prompt"] / CB["seeds"]["per_shard"])))


wildcard_constraints:
    model=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    extractor=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    role=r"[a-z0-9_]+",
    condition="|".join(ALL_CONDITIONS),
    shard=r"[0-9]+",
    checkpoint=r"[A-Za-z0-9][A-Za-z0-9._-]*",


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


def get_final_targets():
    return [
        "results/contextbias/prompts.parquet",
        "results/contextbias/attributes.parquet",
        "results/contextbias/metrics/bi.parquet",
        "results/report/index.html",
    ]
