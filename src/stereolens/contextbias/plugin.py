"""The ContextBias benchmark as a plug-in (stereolens.benchmark): config checks, model jobs
(generation per generator x role x condition x seed shard, extraction per extractor x generation
job), targets, models and report tables."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from stereolens.benchmark import Benchmark, Job, Rounds, Size
from stereolens.contextbias.layout import LAYOUT
from stereolens.contextbias.prompts import CONDITIONS
from stereolens.metrics.command import (
    check_reader_correction,
    corrects_reader,
    reader_report_paths,
    reader_report_skip,
)
from stereolens.paths import resource
from stereolens.validation import ConfigError


def _check(config: dict, registry: dict) -> None:
    cb = config["contextbias"]
    for key, kind in (("generators", "generator"), ("extractors", "vlm")):
        for name in cb[key]:
            spec = registry.get(name)
            if spec is None:
                known = sorted(n for n, s in registry.items() if s.kind == kind)
                raise ConfigError(
                    f"contextbias.{key}: {name!r} is not in the registry "
                    f"{config['registry']}; known {kind}s: {', '.join(known)}. "
                    "Add an entry there to add a model."
                )
            if spec.kind != kind:
                raise ConfigError(
                    f"contextbias.{key}: {name!r} is a {spec.kind} in the registry, not a {kind}"
                )
    llm = cb["canonicalisation"]["llm"]
    if llm is not None and (llm not in registry or registry[llm].kind not in ("llm", "vlm")):
        known = sorted(n for n, s in registry.items() if s.kind == "llm")
        raise ConfigError(
            f"contextbias.canonicalisation.llm: {llm!r} is not an llm in the registry "
            f"{config['registry']}; known llms: {', '.join(known)}"
        )
    roles(config)  # checks the prompt bank
    check_reader_correction(cb["reader_correction"], "contextbias")


def roles(config: dict) -> list[str]:
    """The run's roles (contextbias.roles, else every role of the bank), bank-checked."""
    from stereolens.contextbias.prompts import check_prompt_bank

    return check_prompt_bank(config)


def validation_roles(config: dict) -> list[str]:
    """Roles of the validation prompts, restricted to contextbias.roles when given."""
    import json

    cb = config["contextbias"]
    if not cb["validation"]["enabled"]:
        return []
    entries = json.loads(resource("contextbias", "validation_prompts.json").read_text())
    found = list(dict.fromkeys(e["role"] for e in entries))
    return [r for r in found if cb["roles"] is None or r in cb["roles"]]


def _prompt_counts(config: dict) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    """Prompts per (role, condition) of the bank, and validation prompts per role."""
    import polars as pl

    from stereolens.contextbias.prompts import build_prompts
    from stereolens.contextbias.validation import build_validation_prompts

    cb = config["contextbias"]
    prompts = build_prompts(
        models=["_"],  # seeds are not needed here, only the prompt rows
        seeds_per_prompt=1,
        default_bank_key=cb["seeds"]["default_bank_key"],
        roles=roles(config),
        bank_path=cb["prompt_bank"],
        fix_articles=cb["fix_articles"],
    )
    counts = {(r, c): n for r, c, n in prompts.group_by("role", "condition").len().iter_rows()}
    val = {}
    if cb["validation"]["enabled"]:
        vp = build_validation_prompts(["_"], 1).filter(
            pl.col("role").is_in(validation_roles(config))
        )
        val = dict(vp.group_by("role").len().iter_rows())
    return counts, val


def _seeds_in(shard: int, per_shard: int, total: int) -> int:
    return max(0, min(per_shard, total - shard * per_shard))


def _jobs(config: dict, counts: bool = False) -> list[Job]:
    cb = config["contextbias"]
    seeds = cb["seeds"]
    per_shard = seeds["per_shard"]
    val = cb["validation"]
    cells = [
        (role, cond, shard, seeds["per_prompt"])
        for role in roles(config)
        for cond in cb["conditions"]
        for shard in range(math.ceil(seeds["per_prompt"] / per_shard))
    ] + [
        (role, "VAL", shard, val["seeds_per_prompt"])
        for role in validation_roles(config)
        for shard in range(math.ceil(val["seeds_per_prompt"] / per_shard))
    ]
    n_prompts, n_val = _prompt_counts(config) if counts else ({}, {})
    out = []
    for model in cb["generators"]:
        for role, cond, shard, total in cells:
            n = n_val.get(role, 0) if cond == "VAL" else n_prompts.get((role, cond), 0)
            items = n * _seeds_in(shard, per_shard, total) if counts else 0
            wildcards = {"model": model, "role": role, "condition": cond, "shard": shard}
            out.append(
                Job(
                    "generate_images",
                    "generate",
                    model,
                    LAYOUT.path("image_shard", **wildcards),
                    items,
                    "images",
                    wildcards,
                )
            )
    generation = list(out)
    for extractor in cb["extractors"]:
        for g in generation:
            w = g.wildcards
            out.append(
                Job(
                    "extract_contextbias_attributes",
                    "extract",
                    extractor,
                    LAYOUT.path("extraction", **w, extractor=extractor),
                    g.items,
                    "images",
                    {**w, "extractor": extractor},
                )
            )
    return out


def _size(config: dict) -> list[Size]:
    """_jobs(config, counts=True) summed per stage and model, by arithmetic: a shard per
    ceil(seeds / per_shard) per role x condition (and validation role), every seed of every
    prompt an image; each extractor reads every generated image."""
    cb = config["contextbias"]
    seeds, val = cb["seeds"], cb["validation"]
    per_shard = seeds["per_shard"]
    n_prompts, n_val = _prompt_counts(config)
    cells = [(r, c) for r in roles(config) for c in cb["conditions"]]
    val_roles = validation_roles(config)
    jobs = len(cells) * math.ceil(seeds["per_prompt"] / per_shard) + len(val_roles) * math.ceil(
        val["seeds_per_prompt"] / per_shard
    )
    images = (
        sum(n_prompts.get(cell, 0) for cell in cells) * seeds["per_prompt"]
        + sum(n_val.get(r, 0) for r in val_roles) * val["seeds_per_prompt"]
    )
    out = [Size("generate", m, jobs, images) for m in cb["generators"]]
    n_gen = len(cb["generators"])
    out += [Size("extract", e, jobs * n_gen, images * n_gen) for e in cb["extractors"]]
    return out


def _targets(config: dict) -> list[str]:
    cb = config["contextbias"]
    out = [LAYOUT.prompts, LAYOUT.attributes, LAYOUT.path("metrics", table="bi")]
    if cb["validation"]["enabled"]:
        out.append(LAYOUT.path("validation", table="scores"))
        # the extractors audited per demographic group (docs/planner.md)
        out.append(LAYOUT.path("validation", table="group_gaps"))
    if cb["annotation"]["enabled"]:
        out.append(LAYOUT.annotation_form)
    if cb["annotation"]["answers"]:
        out.append(LAYOUT.path("annotation", table="agreement_summary"))
    if corrects_reader(cb):
        out.append(LAYOUT.corrected)
    return out


def _models(config: dict) -> dict[str, list[str]]:
    cb = config["contextbias"]
    out = {
        "contextbias generator": list(cb["generators"]),
        "contextbias extractor": list(cb["extractors"]),
    }
    canon = cb["canonicalisation"]
    if canon["enabled"] and canon["llm"]:
        out["contextbias canonicalisation LLM"] = [canon["llm"]]
    return out


METRICS = ("bi", "ccs", "ccs_mean", "robustness", "bootstrap", "comparisons", "ranks")
"""The tables of results/contextbias/metrics/ (the metrics rule's outputs)."""
COMPARISON_TABLES = ("comparisons", "ranks")
"""Report keys contextbias_comparisons and contextbias_ranks (report.comparisons)."""

REPORT_PATHS = {
    "prompts": LAYOUT.prompts,
    "images": LAYOUT.images,
    "attributes": LAYOUT.attributes,
    "mapping": LAYOUT.mapping,
    **{n: LAYOUT.path("metrics", table=n) for n in METRICS if n not in COMPARISON_TABLES},
    **{f"contextbias_{n}": LAYOUT.path("metrics", table=n) for n in COMPARISON_TABLES},
    "validation": LAYOUT.path("validation", table="scores"),
    "validation_by_group": LAYOUT.path("validation", table="by_group"),
    "validation_group_gaps": LAYOUT.path("validation", table="group_gaps"),
    "annotation_form": LAYOUT.annotation_form,
    "agreement": LAYOUT.path("annotation", table="agreement_summary"),
    **reader_report_paths("contextbias", LAYOUT),
}
"""Every table the report can read of ContextBias (the plug-in's report_paths)."""


def _report_tables(config: dict) -> dict[str, str]:
    cb = config["contextbias"]
    skip = set()
    if not cb["validation"]["enabled"]:
        skip |= {"validation", "validation_by_group", "validation_group_gaps"}
    if not cb["annotation"]["enabled"]:
        skip.add("annotation_form")
    if not cb["annotation"]["answers"]:
        skip.add("agreement")
    skip |= reader_report_skip("contextbias", cb)
    return {k: v for k, v in REPORT_PATHS.items() if k not in skip}


def prompt_bank(config: dict) -> str:
    """The prompt bank's path: contextbias.prompt_bank, else the shipped bank."""
    return config["contextbias"]["prompt_bank"] or str(resource("contextbias", "prompts.json"))


def generation_settings(config: dict, model: str, cell: str) -> str:
    """What decides a ContextBias generator's seeds (JSON); a change here regenerates that
    model only. Cell VAL: the explicit-attribute validation prompts."""
    import json

    cb = config["contextbias"]
    seeds = cb["seeds"]
    if cell == "VAL":
        val = cb["validation"]
        return json.dumps(
            {"per_prompt": val["seeds_per_prompt"], "seed_key": val["seed_key"]},
            sort_keys=True,
        )
    return json.dumps(
        {
            "per_prompt": seeds["per_prompt"],
            "bank_key": seeds["bank_keys"].get(model, seeds["default_bank_key"]),
            "default_bank_key": seeds["default_bank_key"],
            "fix_articles": cb["fix_articles"],
        },
        sort_keys=True,
    )


def seed_shards(config: dict) -> int:
    """Seed shards of a role x condition (the adaptive rounds' cap): ceil(seeds.per_prompt
    / seeds.per_shard)."""
    seeds = config["contextbias"]["seeds"]
    return math.ceil(seeds["per_prompt"] / seeds["per_shard"])


def capped_seeds(config: dict, shards: int) -> dict:
    """``config`` with ``shards`` seed shards per role x condition: seeds.per_prompt cut to
    shards x seeds.per_shard (the shards keep their size: the validation prompts' too)."""
    cb = config["contextbias"]
    seeds = cb["seeds"]
    n = min(seeds["per_prompt"], shards * seeds["per_shard"])
    return {**config, "contextbias": {**cb, "seeds": {**seeds, "per_prompt": n}}}


def _in_rounds(job: Job) -> bool:
    """The rounds add seeds of the audited prompts; the validation prompts (VAL), the
    extractors' audit, run in full."""
    return job.wildcards.get("condition") != "VAL"


ROUNDS = Rounds(
    interim="stereolens.contextbias.adaptive:interim",
    reads="extract",
    keys=("model", "extractor"),
    shards=seed_shards,
    capped=capped_seeds,
    in_rounds=_in_rounds,
    shard_key="contextbias.seeds.per_shard",
    settings=("metrics",),
)
"""design.mode adaptive: rounds of seed shards per generator; a cell is an extractor x
generator, its question the headline shift BI(CA-U) - BI(CF) (stereolens.contextbias
.adaptive)."""


def _enabled(config: dict[str, Any]) -> bool:
    return bool(config.get("contextbias", {}).get("generators"))


BENCHMARK = Benchmark.from_functions(
    globals(),
    name="contextbias",
    title="ContextBias",
    generation_items="stereolens.contextbias.jobs:generation_items",
    generation_prompts=prompt_bank,
    generation_settings=generation_settings,
    report_paths=REPORT_PATHS,
    unordered_models=("generators", "extractors"),
    report_sections="stereolens.contextbias.report",
    rules=(
        "workflow/rules/inputs/contextbias.smk",
        "workflow/rules/contextbias.smk",
        "workflow/rules/contextbias_studies.smk",
    ),
    wildcards={"role": r"[a-z0-9_]+", "condition": "|".join([*CONDITIONS, "VAL"])},
    config_schema=str(resource("schemas", "contextbias.schema.yaml")),
    presets=str(Path(__file__).with_name("presets")),
    cli="stereolens.contextbias.cli",
    model_rules=("extract_contextbias_attributes",),
    planner="stereolens.contextbias.design_worlds:build",
    power_check="stereolens.contextbias.design_check:power_check",
    reader_design="stereolens.contextbias.annotation.sample_design:labels_needed",
    layout=LAYOUT,
    rounds=ROUNDS,
)
