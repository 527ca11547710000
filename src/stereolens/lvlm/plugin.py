"""The LVLM audit as a plug-in (stereolens.benchmark): config checks, model jobs (responses per
model x setting x task x axis x group x shard; the assistant's story and term-judge jobs;
refusal labels), targets, models and report tables."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from stereolens.benchmark import Benchmark, Job, Size
from stereolens.lvlm.layout import LAYOUT
from stereolens.lvlm.names import groups
from stereolens.metrics.command import (
    check_reader_correction,
    corrects_reader,
    reader_report_paths,
    reader_report_skip,
)
from stereolens.paths import resource
from stereolens.validation import ConfigError


def _enabled(config: dict[str, Any]) -> bool:
    return config["lvlm"]["enabled"]


def _check(config: dict, registry: dict) -> None:
    lv = config["lvlm"]
    where = config["registry"]
    check_reader_correction(lv["reader_correction"], "lvlm")
    if not lv["models"]:
        raise ConfigError("lvlm.models is empty: name at least one vlm of the registry")
    for name in lv["models"]:
        if registry.get(name) is None or registry[name].kind != "vlm":
            known = sorted(n for n, s in registry.items() if s.kind == "vlm")
            raise ConfigError(
                f"lvlm.models: {name!r} is not a vlm in the registry {where}; known vlms: "
                f"{', '.join(known)}. Add an entry under vlms: to add a model."
            )
    needs_assistant = [t for t in ("story", "term") if t in lv["tasks"]]
    if needs_assistant and lv["assistant"] is None:
        raise ConfigError(
            f"lvlm.assistant is null but task(s) {', '.join(needs_assistant)} need the LLM "
            "assistant: name an llms (or vlms) entry of the registry"
        )
    for key in ("assistant", "refusal_judge"):
        name = lv[key]
        if name is not None and (name not in registry or registry[name].kind not in ("llm", "vlm")):
            raise ConfigError(f"lvlm.{key}: {name!r} is not an llm or vlm in the registry {where}")
    src = lv["user_images"]
    if src["source"] == "folder" and not src["folder"]:
        raise ConfigError("lvlm.user_images.source is folder but lvlm.user_images.folder is unset")
    if "attribute_inferring" in lv["tasks"] and lv["settings"] == ["persona"]:
        raise ConfigError(
            "lvlm.tasks.attribute_inferring asks about the photo: it needs the image or "
            "mitigation setting, not persona alone"
        )


def settings(lv: dict, task: str) -> list[str]:
    """The attribute-inferring baseline asks about the photo: no text-persona setting."""
    return [s for s in lv["settings"] if not (task == "attribute_inferring" and s == "persona")]


def n_shards(lv: dict, task: str) -> int:
    t = lv["tasks"][task]
    return math.ceil(t["images_per_group"] / t["images_per_shard"])


def prompt_counts(lv: dict) -> dict[str, int]:
    """Prompts per task without reading MMLU: story 1, term = terms kept, exam = 6 subjects x
    questions_per_subject, attribute_inferring 1."""
    from stereolens.lvlm.tasks import COLLEGE_SUBJECTS, kept_terms

    return {
        "story": 1,
        "term": len(kept_terms(lv)),
        "exam": len(COLLEGE_SUBJECTS) * int(lv["questions_per_subject"]),
        "attribute_inferring": 1,
    }


def _jobs(config: dict, counts: bool = False) -> list[Job]:
    from stereolens.lvlm.names import group_slug

    lv = config["lvlm"]
    prompts = prompt_counts(lv) if counts else {}
    out = []
    for model in sorted(lv["models"]):
        for task, t in lv["tasks"].items():
            per_shard, per_group = t["images_per_shard"], t["images_per_group"]
            for setting in settings(lv, task):
                for axis in lv["axes"]:
                    for group in groups(lv, axis):
                        slug = group_slug(group)
                        for shard in range(n_shards(lv, task)):
                            images = min(per_shard, per_group - shard * per_shard)
                            wildcards = {
                                "model": model,
                                "setting": setting,
                                "task": task,
                                "axis": axis,
                                "usergroup": slug,
                                "shard": shard,
                            }
                            out.append(
                                Job(
                                    "respond_lvlm",
                                    "respond",
                                    model,
                                    LAYOUT.path("responses", **wildcards),
                                    images * prompts[task] if counts else 0,
                                    "calls",
                                    wildcards,
                                )
                            )
        for task, rule, template in (
            ("story", "extract_lvlm_story_attributes", "story_attributes"),
            ("term", "judge_lvlm_terms", "term_judgements"),
        ):
            if task not in lv["tasks"]:
                continue
            per_group = lv["tasks"][task]["images_per_group"]
            for setting in settings(lv, task):
                for axis in lv["axes"]:
                    n = len(groups(lv, axis))
                    if task == "story":
                        calls = n * per_group
                    else:
                        calls = per_group * n * (n - 1) // 2 * prompts.get("term", 0)
                    out.append(
                        Job(
                            rule,
                            "assistant",
                            lv["assistant"],
                            LAYOUT.path(template, model=model, setting=setting, axis=axis),
                            calls if counts else 0,
                            "calls",
                            {"model": model, "setting": setting, "axis": axis},
                        )
                    )
        for setting in lv["settings"]:
            out.append(
                Job(
                    "label_lvlm_refusals",
                    "refusals",
                    lv["refusal_judge"] or "",
                    LAYOUT.path("refusals", model=model, setting=setting),
                    0,
                    "calls",
                    {"model": model, "setting": setting},
                )
            )
    from stereolens.lvlm.story_reading import planned_readings

    readings = planned_readings(lv)
    if readings:
        out.append(
            Job(
                "read_lvlm_story_sample",
                "assistant",
                lv["assistant"],
                LAYOUT.story_readings,
                readings if counts else 0,
                "calls",
                {},
            )
        )
    return out


def _size(config: dict) -> list[Size]:
    """_jobs(config, counts=True) summed per stage and model, by arithmetic (the same jobs and
    calls, not listed one by one)."""
    from stereolens.lvlm.story_reading import planned_readings

    lv = config["lvlm"]
    prompts = prompt_counts(lv)
    n_groups = {axis: len(groups(lv, axis)) for axis in lv["axes"]}
    all_groups = sum(n_groups.values())
    jobs = calls = 0
    for task, t in lv["tasks"].items():
        n_set = len(settings(lv, task))
        jobs += n_set * all_groups * n_shards(lv, task)
        calls += n_set * all_groups * t["images_per_group"] * prompts[task]
    out = [Size("respond", m, jobs, calls, "calls") for m in lv["models"]]
    a_jobs = a_calls = 0
    for task in ("story", "term"):
        if task not in lv["tasks"]:
            continue
        per_group, n_set = lv["tasks"][task]["images_per_group"], len(settings(lv, task))
        for n in n_groups.values():
            a_jobs += n_set
            a_calls += n_set * (
                n * per_group if task == "story" else per_group * n * (n - 1) // 2 * prompts["term"]
            )
    n_models = len(lv["models"])
    if a_jobs:
        out.append(
            Size("assistant", lv["assistant"], a_jobs * n_models, a_calls * n_models, "calls")
        )
    out.append(
        Size("refusals", lv["refusal_judge"] or "", len(lv["settings"]) * n_models, 0, "calls")
    )
    readings = planned_readings(lv)
    if readings:
        out.append(Size("assistant", lv["assistant"], 1, readings, "calls"))
    return out


METRICS = (
    "scores",
    "prompt_scores",
    "refusals",
    "story_skew",
    "exam_accuracy",
    "comparisons",
    "ranks",
)


def story_reading_enabled(lv: dict) -> bool:
    """The assistant's story reading is audited (docs/planner.md) when the story
    task and an assistant are configured and lvlm.story_reading.enabled."""
    return bool(
        lv["enabled"]
        and "story" in lv["tasks"]
        and lv["assistant"]
        and lv["story_reading"]["enabled"]
    )


def reader_sample_files(lv: dict) -> dict[str, str]:
    """The files of rule export_lvlm_reader_sample by output name (LAYOUT.reader_sample_
    <name>): a form and key per configured story / term task (story_form, story_key,
    term_form, term_key), then template and design."""
    names = [f"{t}_{f}" for t in ("story", "term") if t in lv["tasks"] for f in ("form", "key")]
    return {n: LAYOUT.pattern(f"reader_sample_{n}") for n in [*names, "template", "design"]}


def _targets(config: dict) -> list[str]:
    out = [LAYOUT.path("metrics", table="scores")]
    if config["lvlm"]["reader_sample"]["export"]:
        out += list(reader_sample_files(config["lvlm"]).values())
    if story_reading_enabled(config["lvlm"]):
        out.append(LAYOUT.path("metrics", table="story_reading_gaps"))
    if corrects_reader(config["lvlm"]):
        out.append(LAYOUT.corrected)
    return out


def _models(config: dict) -> dict[str, list[str]]:
    lv = config["lvlm"]
    out = {"lvlm audited model": list(lv["models"])}
    if lv["assistant"]:
        out["lvlm assistant (story attributes, term judge)"] = [lv["assistant"]]
    if lv["refusal_judge"]:
        out["lvlm refusal judge"] = [lv["refusal_judge"]]
    return out


REPORT_PATHS = {f"lvlm_{n}": LAYOUT.path("metrics", table=n) for n in METRICS} | {
    "lvlm_sets": LAYOUT.sets,
    "lvlm_responses": LAYOUT.path("table", table="responses"),
    "lvlm_story_attributes": LAYOUT.path("table", table="story_attributes"),
    "story_reading": LAYOUT.path("metrics", table="story_reading"),
    "story_reading_gaps": LAYOUT.path("metrics", table="story_reading_gaps"),
    **reader_report_paths("lvlm", LAYOUT),
}
"""Every table the report can read of the LVLM audit (the plug-in's report_paths)."""


def _report_tables(config: dict) -> dict[str, str]:
    reading = story_reading_enabled(config["lvlm"])
    skip = reader_report_skip("lvlm", config["lvlm"])
    return {
        k: v
        for k, v in REPORT_PATHS.items()
        if (reading or not k.startswith("story_")) and k not in skip
    }


BENCHMARK = Benchmark.from_functions(
    globals(),
    name="lvlm",
    title="LVLM bias with the user photo as context",
    report_paths=REPORT_PATHS,
    report_sections="stereolens.lvlm.report",
    rules=(
        "workflow/rules/inputs/lvlm.smk",
        "workflow/rules/lvlm.smk",
        "workflow/rules/lvlm_studies.smk",
    ),
    wildcards={
        "setting": "image|mitigation|persona",
        "task": "story|term|exam|attribute_inferring",
        "axis": "gender|race",
        "usergroup": r"[a-z0-9_-]+",
    },
    config_schema=str(resource("schemas", "lvlm.schema.yaml")),
    presets=str(Path(__file__).with_name("presets")),
    cli="stereolens.lvlm.cli",
    model_rules=(
        "respond_lvlm",
        "extract_lvlm_story_attributes",
        "judge_lvlm_terms",
        "label_lvlm_refusals",
    ),
    planner="stereolens.lvlm.design:build",
    power_check="stereolens.lvlm.design_check:power_check",
    reader_design="stereolens.lvlm.reader_sample:labels_needed",
    layout=LAYOUT,
)
