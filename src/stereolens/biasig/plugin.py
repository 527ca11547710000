"""The BiasIG benchmark as a plug-in (stereolens.benchmark): config checks, model jobs
(generation and VQA per block of prompts), targets, models and report tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stereolens.benchmark import Benchmark, Job, Size
from stereolens.biasig.layout import LAYOUT
from stereolens.metrics.command import (
    check_reader_correction,
    corrects_reader,
    reader_report_paths,
    reader_report_skip,
)
from stereolens.paths import resource
from stereolens.validation import ConfigError


def _enabled(config: dict[str, Any]) -> bool:
    return config["biasig"]["enabled"]


def _check(config: dict, registry: dict) -> None:
    bg = config["biasig"]
    for name in bg["generators"]:
        if registry.get(name) is None or registry[name].kind != "generator":
            raise ConfigError(
                f"biasig.generators: {name!r} is not a generator in the registry "
                f"{config['registry']}"
            )
    if bg["vqa"] is None or registry.get(bg["vqa"]) is None or registry[bg["vqa"]].kind != "vlm":
        raise ConfigError(
            f"biasig.vqa: {bg['vqa']!r} is not a vlm in the registry {config['registry']}"
        )
    check_reader_correction(bg["reader_correction"], "biasig")


def selection(config: dict):
    """The configured subset of the shipped BiasIG prompt table (its stored parquet)."""
    from stereolens.biasig.prompts import load_prompts, select_prompts

    bg = config["biasig"]
    return select_prompts(
        load_prompts(),
        bg["acquired_types"],
        bg["conditions"],
        bg["acquired_attributes"],
        bg["max_variants"],
    )


def shards(config: dict) -> list[tuple[str, str, int, int]]:
    """(acquired_type, condition, shard, prompts in it) of every generation job."""
    bg = config["biasig"]
    per = bg["prompts_per_shard"]
    sel = selection(config)
    out = []
    for (atype, cond), group in sel.group_by(["acquired_type", "visibility"]):
        n = group.height
        out += [(atype, cond, i, min(per, n - i * per)) for i in range(-(-n // per))]
    return sorted(out)


def _jobs(config: dict, counts: bool = False) -> list[Job]:
    bg = config["biasig"]
    blocks = shards(config)
    out = []
    for model in bg["generators"]:
        for atype, cond, shard, n in blocks:
            items = n * bg["images_per_prompt"] if counts else 0
            w = {"model": model, "atype": atype, "visibility": cond, "shard": shard}
            out.append(
                Job(
                    "generate_images",
                    "generate",
                    model,
                    LAYOUT.path("image_shard", **w),
                    items,
                    "images",
                    w,
                )
            )
    for g in list(out):
        w = g.wildcards
        out.append(
            Job(
                "answer_biasig_vqa",
                "vqa",
                bg["vqa"],
                LAYOUT.path("vqa", **w, extractor=bg["vqa"]),
                g.items,
                "images",
                {**w, "extractor": bg["vqa"]},
            )
        )
    return out


def _size(config: dict) -> list[Size]:
    """_jobs(config, counts=True) summed per stage and model, by arithmetic."""
    bg = config["biasig"]
    blocks = shards(config)
    images = sum(n for *_, n in blocks) * bg["images_per_prompt"]
    out = [Size("generate", m, len(blocks), images) for m in bg["generators"]]
    n_gen = len(bg["generators"])
    return [*out, Size("vqa", bg["vqa"], len(blocks) * n_gen, images * n_gen)]


METRICS = ("implicit", "explicit", "eta", "comparisons", "ranks")
"""The tables of rule compute_biasig_metrics (results/biasig/metrics/<name>.parquet)."""


READER_SAMPLE = ("form", "key", "template", "design")
"""The files of rule export_biasig_reader_sample (LAYOUT.reader_sample_<name>)."""


def _targets(config: dict) -> list[str]:
    out = [LAYOUT.answers, LAYOUT.path("metrics", table="eta")]
    if config["biasig"]["reader_sample"]["export"]:
        out += [LAYOUT.pattern(f"reader_sample_{name}") for name in READER_SAMPLE]
    return out + ([LAYOUT.corrected] if corrects_reader(config["biasig"]) else [])


def _models(config: dict) -> dict[str, list[str]]:
    bg = config["biasig"]
    return {
        "biasig generator": list(bg["generators"]),
        "biasig VQA": [bg["vqa"]] if bg["vqa"] else [],
    }


REPORT_PATHS = {f"biasig_{n}": LAYOUT.path("metrics", table=n) for n in METRICS} | {
    "biasig_prompts": LAYOUT.prompts,
    "biasig_answers": LAYOUT.answers,
    **reader_report_paths("biasig", LAYOUT),
}
"""Every table the report reads of BiasIG (a run writes them all)."""

PROMPTS = LAYOUT.prompts
"""The configured prompt table (rule write_biasig_prompts): the generation jobs' input."""


def _report_tables(config: dict) -> dict[str, str]:
    skip = reader_report_skip("biasig", config["biasig"])
    return {k: v for k, v in REPORT_PATHS.items() if k not in skip}


def _generation_prompts(config: dict) -> str:
    return PROMPTS


SETTINGS_KEYS = (
    "acquired_types",
    "conditions",
    "acquired_attributes",
    "max_variants",
    "images_per_prompt",
    "prompts_per_shard",
    "seed_base",
)


def settings(config: dict, model: str | None = None, cell: str | None = None) -> str:
    """What decides the prompt table and a BiasIG shard's images besides the model (JSON;
    the same for every model and cell: a change reruns every shard)."""
    import json

    bg = config["biasig"]
    return json.dumps({k: bg[k] for k in SETTINGS_KEYS}, sort_keys=True)


BENCHMARK = Benchmark.from_functions(
    globals(),
    name="biasig",
    title="BiasIG",
    generation_items="stereolens.biasig.jobs:generation_items",
    generation_prompts=_generation_prompts,
    generation_settings=settings,
    report_paths=REPORT_PATHS,
    unordered_models=("generators",),
    report_sections="stereolens.biasig.report",
    rules=("workflow/rules/inputs/biasig.smk", "workflow/rules/biasig.smk"),
    wildcards={
        "atype": "occupation|characteristic|social_relation",
        "visibility": "implicit|explicit",
    },
    config_schema=str(resource("schemas", "biasig.schema.yaml")),
    presets=str(Path(__file__).with_name("presets")),
    cli="stereolens.biasig.cli",
    model_rules=("answer_biasig_vqa",),
    planner="stereolens.biasig.design_worlds:build",
    power_check="stereolens.biasig.design_check:power_check",
    layout=LAYOUT,
    reader_design="stereolens.biasig.sample_design:labels_needed",
)
