"""`stereolens plan`: jobs, images, model calls and GPU-hours of a run, from the config and
the shipped prompt tables alone (no Snakemake, no model loaded).

Counts follow the workflow's job layout (workflow/rules/common.smk):

* ContextBias generation: one job per generator x role x condition x seed shard
  (ceil(seeds.per_prompt / seeds.per_shard) shards), plus, with validation on, one job per
  generator x validation role x validation shard; images = prompts x seeds per prompt.
* ContextBias extraction: one job per extractor x generation job; one call per image.
* BiasIG generation: one job per generator x acquired type x condition x block of
  prompts_per_shard prompts; images = prompts x images_per_prompt; one VQA job per
  generation job and one VQA call per image.
* LVLM audit: one response job per model x setting x task x axis x group x shard, one call
  per user image and prompt; the assistant's story and term-judge jobs per model x setting x
  axis, one call per story and per judged pair.

Calls count first attempts only (retries come on top, up to max_attempts). GPU-hours =
images (or calls) x seconds per image (or call) / 3600, from a throughput table
(config/throughput.yaml); API and CPU models use no GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stereolens.design import cli as design_cli
from stereolens.validation import ConfigError, load_yaml

DEFAULT_THROUGHPUT = "config/throughput.yaml"

THROUGHPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["entries"],
    "additionalProperties": False,
    "properties": {
        "gpu": {"type": "string", "description": "the GPU the figures are for"},
        "entries": {
            "type": "object",
            "description": "registry model name -> throughput entry",
            "additionalProperties": {
                "type": "object",
                "required": ["status", "source"],
                "additionalProperties": False,
                "properties": {
                    "seconds_per_image": {
                        "type": "number",
                        "exclusiveMinimum": 0,
                        "description": "generators: seconds per generated image",
                    },
                    "seconds_per_call": {
                        "type": "number",
                        "exclusiveMinimum": 0,
                        "description": "VLMs: seconds per request (one image)",
                    },
                    "status": {"enum": ["measured", "estimate"]},
                    "source": {
                        "type": "string",
                        "minLength": 1,
                        "description": "where the figure comes from (the arithmetic for "
                        "an estimate)",
                    },
                },
                "oneOf": [
                    {"required": ["seconds_per_image"], "not": {"required": ["seconds_per_call"]}},
                    {"required": ["seconds_per_call"], "not": {"required": ["seconds_per_image"]}},
                ],
            },
        },
    },
}


def _describe(error) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    if error.validator == "oneOf":
        return f"{where}: give exactly one of seconds_per_image or seconds_per_call"
    if error.validator == "enum":
        return f"{where}: {error.message}; allowed values: measured, estimate"
    if error.validator == "additionalProperties" and isinstance(error.schema, dict):
        props = ", ".join(sorted(error.schema.get("properties", {})))
        return f"{where}: {error.message}; allowed keys here: {props}"
    return f"{where}: {error.message}"


def load_throughput(path: str | os.PathLike) -> dict[str, Any]:
    """The throughput table, validated; raise ConfigError naming each problem."""
    import jsonschema

    path = Path(path)
    table = load_yaml(path, "throughput table")
    validator = jsonschema.Draft202012Validator(THROUGHPUT_SCHEMA)
    errors = sorted(validator.iter_errors(table), key=lambda e: list(e.absolute_path))
    if errors:
        lines = "\n  ".join(_describe(e) for e in errors[:20])
        raise ConfigError(f"throughput table {path} is invalid:\n  {lines}")
    return table


@dataclass
class Row:
    benchmark: str
    stage: str
    """generate, extract (ContextBias) or vqa (BiasIG)."""
    model: str
    jobs: int
    images: int
    """Generated images (generate) or images sent to the model (extract, vqa)."""
    calls: int
    """Model calls: images for generate, first-attempt requests for extract and vqa."""
    seconds_each: float | None
    status: str
    """measured, estimate, api (no GPU), cpu (no GPU) or unknown (no figure)."""
    source: str
    gpu_hours: float | None


def _speed(
    name: str, stage: str, registry: dict, throughput: dict[str, Any]
) -> tuple[float | None, str, str]:
    spec = registry[name]
    if spec.backend == "openai":
        return 0.0, "api", f"{spec.backend} API: no local GPU"
    if spec.get("device") == "cpu":
        return 0.0, "cpu", "runs on the CPU (registry device: cpu)"
    key = "seconds_per_image" if stage == "generate" else "seconds_per_call"
    entry = (throughput.get("entries") or {}).get(name)
    if entry is not None:
        if key not in entry:
            other = "seconds_per_call" if key == "seconds_per_image" else "seconds_per_image"
            raise ConfigError(
                f"throughput entry {name!r} gives {other}, but the model is used for {stage}: "
                f"give {key}"
            )
        return float(entry[key]), entry["status"], entry["source"]
    reg_key = "seconds_per_image" if stage == "generate" else "seconds_per_item"
    if spec.get(reg_key) is not None:
        return float(spec.get(reg_key)), "estimate", f"registry {reg_key}"
    return None, "unknown", "no throughput figure: add one to the throughput table"


def _row(benchmark, stage, model, jobs, images, registry, throughput) -> Row:
    seconds, status, source = _speed(model, stage, registry, throughput)
    hours = None if seconds is None else images * seconds / 3600
    return Row(benchmark, stage, model, jobs, images, images, seconds, status, source, hours)


def _contextbias_rows(config: dict, registry: dict, throughput: dict) -> list[Row]:
    import polars as pl

    from stereolens.contextbias.prompts import build_prompts
    from stereolens.contextbias.validation import build_validation_prompts
    from stereolens.workflow_support import bank_roles, validation_roles

    cb = config["contextbias"]
    seeds = cb["seeds"]
    roles = cb["roles"] or bank_roles(cb["prompt_bank"])
    conditions = cb["conditions"]
    n_shards = math.ceil(seeds["per_prompt"] / seeds["per_shard"])
    prompts = build_prompts(
        models=["_"],  # seeds are not needed here, only the prompt rows
        seeds_per_prompt=1,
        default_bank_key=seeds["default_bank_key"],
        roles=roles,
        bank_path=cb["prompt_bank"],
        fix_articles=cb["fix_articles"],
    ).filter(pl.col("condition").is_in(conditions))
    jobs = len(roles) * len(conditions) * n_shards
    images = prompts.height * seeds["per_prompt"]
    val = cb["validation"]
    if val["enabled"]:
        val_roles = validation_roles(cb["roles"])
        val_prompts = build_validation_prompts(["_"], 1).filter(pl.col("role").is_in(val_roles))
        jobs += len(val_roles) * math.ceil(val["seeds_per_prompt"] / seeds["per_shard"])
        images += val_prompts.height * val["seeds_per_prompt"]
    rows = [
        _row("contextbias", "generate", m, jobs, images, registry, throughput)
        for m in cb["generators"]
    ]
    n_gen = len(cb["generators"])
    rows += [
        _row("contextbias", "extract", x, jobs * n_gen, images * n_gen, registry, throughput)
        for x in cb["extractors"]
    ]
    return rows


def _biasig_rows(config: dict, registry: dict, throughput: dict) -> list[Row]:
    from stereolens.biasig.jobs import n_shards
    from stereolens.biasig.prompts import load_prompts, select_prompts

    bg = config["biasig"]
    if not bg["enabled"]:
        return []
    sel = select_prompts(
        load_prompts(),
        bg["acquired_types"],
        bg["conditions"],
        bg["acquired_attributes"],
        bg["max_variants"],
    )
    jobs = sum(
        n_shards(sel, atype, cond, bg["prompts_per_shard"])
        for (atype, cond), _ in sel.group_by(["acquired_type", "visibility"])
    )
    images = sel.height * bg["images_per_prompt"]
    rows = [
        _row("biasig", "generate", m, jobs, images, registry, throughput) for m in bg["generators"]
    ]
    n_gen = len(bg["generators"])
    rows.append(
        _row("biasig", "vqa", bg["vqa"], jobs * n_gen, images * n_gen, registry, throughput)
    )
    return rows


def _lvlm_prompt_counts(lv: dict) -> dict[str, int]:
    """Prompts per task without reading MMLU: story 1, term = terms kept, exam = 6 subjects x
    questions_per_subject, attribute_inferring 1."""
    from stereolens.lvlm.tasks import COLLEGE_SUBJECTS, load_terms

    terms = load_terms(lv.get("terms"))
    per_domain: dict[str, int] = {}
    for t in terms:
        per_domain[t.domain] = per_domain.get(t.domain, 0) + 1
    cap = lv.get("terms_per_domain")
    n_terms = sum(min(n, cap) if cap else n for n in per_domain.values())
    return {
        "story": 1,
        "term": n_terms,
        "exam": len(COLLEGE_SUBJECTS) * int(lv["questions_per_subject"]),
        "attribute_inferring": 1,
    }


def _lvlm_rows(config: dict, registry: dict, throughput: dict) -> list[Row]:
    """LVLM audit: response jobs per model x setting x task x axis x group x shard (calls =
    user images x prompts); the assistant's story and judge jobs per model x setting x axis
    (calls = stories, and judged pairs = images x group pairs x terms)."""
    from stereolens.design.story_reading import planned_readings
    from stereolens.lvlm.names import AXES

    lv = config.get("lvlm") or {}
    if not lv.get("enabled"):
        return []
    prompts = _lvlm_prompt_counts(lv)
    groups = {a: len((lv.get("groups") or {}).get(a) or AXES[a]) for a in lv["axes"]}
    jobs = calls = 0
    story_calls = judge_calls = assistant_jobs = 0
    for task, t in lv["tasks"].items():
        settings = [
            s for s in lv["settings"] if not (task == "attribute_inferring" and s == "persona")
        ]
        shards = math.ceil(t["images_per_group"] / t["images_per_shard"])
        for n_groups in groups.values():
            per_axis = len(settings) * n_groups
            jobs += per_axis * shards
            calls += per_axis * t["images_per_group"] * prompts[task]
            if task == "story":
                story_calls += per_axis * t["images_per_group"]
                assistant_jobs += len(settings)
            if task == "term":
                pairs = n_groups * (n_groups - 1) // 2
                judge_calls += len(settings) * t["images_per_group"] * pairs * prompts["term"]
                assistant_jobs += len(settings)
    rows = []
    for m in lv["models"]:
        seconds, status, source = _speed(m, "respond", registry, throughput)
        hours = None if seconds is None else calls * seconds / 3600
        rows.append(Row("lvlm", "respond", m, jobs, 0, calls, seconds, status, source, hours))
    if lv.get("assistant") and (story_calls or judge_calls):
        n = len(lv["models"])
        a_calls = (story_calls + judge_calls) * n
        # the audit of the story reading: one job reading the labelled sample
        readings = planned_readings(lv)
        a_calls += readings
        seconds, status, source = _speed(lv["assistant"], "assistant", registry, throughput)
        hours = None if seconds is None else a_calls * seconds / 3600
        rows.append(
            Row(
                "lvlm", "assistant", lv["assistant"], assistant_jobs * n + (readings > 0), 0,
                a_calls, seconds, status, source, hours,
            )
        )  # fmt: skip
    return rows


def plan(
    config: dict[str, Any], registry: dict, throughput: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The plan of a validated config: rows (per benchmark, stage and model) and totals."""
    throughput = throughput or {"entries": {}}
    rows = (
        _contextbias_rows(config, registry, throughput)
        + _biasig_rows(config, registry, throughput)
        + _lvlm_rows(config, registry, throughput)
    )
    known = [r.gpu_hours for r in rows if r.gpu_hours is not None]
    return {
        "gpu": throughput.get("gpu"),
        "rows": [asdict(r) for r in rows],
        "totals": {
            "jobs": sum(r.jobs for r in rows),
            "images_generated": sum(r.images for r in rows if r.stage == "generate"),
            "model_calls": sum(r.calls for r in rows),
            "gpu_hours": sum(known),
            "gpu_hours_complete": len(known) == len(rows),
        },
        "estimated": sorted({r.model for r in rows if r.status == "estimate"}),
        "unknown": sorted({r.model for r in rows if r.status == "unknown"}),
    }


def format_plan(result: dict[str, Any]) -> str:
    """A plain-text table."""
    head = ("benchmark", "stage", "model", "jobs", "images", "calls", "s/each", "GPU-h", "basis")
    lines = []
    for r in result["rows"]:
        secs = "-" if r["status"] in ("api", "cpu", "unknown") else f"{r['seconds_each']:g}"
        hours = "?" if r["gpu_hours"] is None else f"{r['gpu_hours']:,.1f}"
        lines.append(
            (
                r["benchmark"],
                r["stage"],
                r["model"],
                f"{r['jobs']:,}",
                f"{r['images']:,}",
                f"{r['calls']:,}",
                secs,
                hours,
                r["status"],
            )
        )
    t = result["totals"]
    total_hours = f"{t['gpu_hours']:,.1f}" + ("" if t["gpu_hours_complete"] else "+?")
    lines.append(
        (
            "total",
            "",
            "",
            f"{t['jobs']:,}",
            f"{t['images_generated']:,}",
            f"{t['model_calls']:,}",
            "",
            total_hours,
            "",
        )
    )
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(len(head))]
    right = {3, 4, 5, 6, 7}

    def fmt(cells):
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [fmt(head), fmt(["-" * w for w in widths])]
    out += [fmt(x) for x in lines[:-1]]
    out += [fmt(["-" * w for w in widths]), fmt(lines[-1])]
    gpu = result.get("gpu") or "the throughput table's GPU"
    out.append("")
    out.append(
        f"GPU-hours on one {gpu}, batch size 1, eager; jobs exclude the few aggregate jobs; "
        "calls are first attempts (retries add up to max_attempts)."
    )
    if result["estimated"]:
        out.append("Estimates (not measured): " + ", ".join(result["estimated"]) + ".")
    if result["unknown"]:
        out.append("No throughput figure (GPU-hours left out): " + ", ".join(result["unknown"]))
    return "\n".join(out)


def _run(args: argparse.Namespace) -> int:
    from stereolens.config import load_config

    config, registry = load_config(args.configfile)
    throughput = None
    if args.throughput is not None:
        throughput = load_throughput(args.throughput)
    elif Path(DEFAULT_THROUGHPUT).is_file():
        throughput = load_throughput(DEFAULT_THROUGHPUT)
    else:
        print(
            f"stereolens plan: no {DEFAULT_THROUGHPUT} here; GPU-hours need --throughput",
            file=sys.stderr,
        )
    result = plan(config, registry, throughput)
    design = None
    if design_cli.requested(args):  # power and target effects (stereolens.design)
        design = design_cli.compute(config, registry, throughput, result, args)
    if args.json:
        print(json.dumps(result if design is None else {**result, "design": design}, indent=2))
    else:
        print(format_plan(result))
        if design is not None:
            print(design_cli.format_report(design))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `stereolens plan` to the CLI's subcommands."""
    p = sub.add_parser(
        "plan",
        help="count jobs, images and model calls of a config and estimate GPU-hours "
        "(no Snakemake, no model loaded)",
    )
    p.add_argument("--configfile", required=True, metavar="PATH", help="a run config")
    p.add_argument(
        "--throughput",
        metavar="PATH",
        default=None,
        help=f"per-model throughput table (default: {DEFAULT_THROUGHPUT} when present)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    design_cli.add_options(p)
    p.set_defaults(func=_run)
