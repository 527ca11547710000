"""The run part of the report: every model the run used with its registry settings, the measured
throughput against the planner's figures, and the run settings."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import polars as pl

from stereolens.benchmark import benchmarks, model_roles
from stereolens.report import figures as F
from stereolens.report.html import Figure, Section, Table, finite
from stereolens.report.inputs import Inputs

MODEL_COLUMNS = ["role", "name", "kind", "backend", "model", "revision", "weights", "settings"]


def registry_entries(inputs: Inputs, config: dict) -> dict[str, dict] | None:
    """name -> {"kind", "fingerprint"} of the run's models: the workflow's, else the registry's."""
    if inputs.models is not None:
        return inputs.models
    from stereolens.models.registry import load_registry
    from stereolens.validation import ConfigError

    path = inputs.path("registry") or (Path(config["registry"]) if config.get("registry") else None)
    if path is None or not Path(path).exists():
        return None
    try:
        registry = load_registry(path)
    except ConfigError:
        return None
    return {n: {"kind": s.kind, "fingerprint": s.fingerprint()} for n, s in registry.items()}


def tiny_models(config: dict, entries: dict | None) -> list[str]:
    """Models of the run built from configs with random weights (registry ``build``)."""
    if entries is None:
        return []
    return sorted(
        {
            n
            for _, n in model_roles(config)
            if n in entries and entries[n]["fingerprint"].get("build")
        }
    )


def models_table(config: dict, entries: dict | None) -> pl.DataFrame:
    rows = []
    for role, name in model_roles(config):
        entry = (entries or {}).get(name)
        if entry is None:
            rows.append({"role": role, "name": name, "kind": "", "backend": "",
                         "model": "not in the registry", "revision": "", "weights": "",
                         "settings": ""})  # fmt: skip
            continue
        fp = entry["fingerprint"]
        settings = {
            k: v for k, v in fp.items() if k not in ("name", "backend", "model", "revision")
        }
        rows.append(
            {
                "role": role,
                "name": name,
                "kind": entry["kind"],
                "backend": fp["backend"],
                "model": fp["model"],
                "revision": fp["revision"] or "default branch",
                "weights": "tiny, random (built from a config)" if fp.get("build") else "",
                "settings": json.dumps(settings, sort_keys=True, default=str),
            }
        )
    # models outside the registry that a benchmark ran (its report module's model_rows)
    for plugin in benchmarks():
        if plugin.report_sections:
            extra = getattr(importlib.import_module(plugin.report_sections), "model_rows", None)
            rows += extra(config) if extra else []
    return pl.DataFrame(rows, schema={c: pl.String for c in MODEL_COLUMNS})


def _throughput_rows(jobs: pl.DataFrame | None, inputs: Inputs) -> pl.DataFrame | None:
    from stereolens.plan import load_throughput
    from stereolens.throughput import summarise
    from stereolens.validation import ConfigError

    table = None
    path = inputs.path("throughput_table")
    if path is not None:
        try:
            table = load_throughput(path)
        except ConfigError:
            table = None
    return None if jobs is None else summarise(jobs, table)


def throughput_figure(summary: pl.DataFrame) -> Figure | None:
    """Measured seconds per item per stage x benchmark x model (bars, log scale), the
    planner's figure as a black tick where its table has the model."""
    rows = summary.filter(pl.col("s_per_item").is_not_null() & (pl.col("s_per_item") > 0))
    if rows.is_empty():
        return None
    labels = [f"{r['stage']} {r['benchmark']}: {r['model']}" for r in rows.iter_rows(named=True)]
    fig, axes = F.subplots(1, 1, width=7.5, height=0.3 * len(labels) + 1.3)
    ax = axes[0][0]
    stages = rows["stage"].unique(maintain_order=True).to_list()
    colours = [F.COLOURS[stages.index(s) % len(F.COLOURS)] for s in rows["stage"]]
    ys = list(range(len(labels)))
    ax.barh(ys, rows["s_per_item"].to_list(), color=colours, height=0.6)
    planned = rows["planned_s_per_item"].to_list()
    pts = [(p, y) for p, y in zip(planned, ys, strict=True) if finite(p) and p > 0]
    if pts:
        ax.scatter([p for p, _ in pts], [y for _, y in pts], marker="|", s=250, color="black",
                   label="planned (config/throughput.yaml)", zorder=3)  # fmt: skip
        F.legend(ax, loc="lower right")
    ax.set_xscale("log")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per item (model time, load excluded)", fontsize=8)
    ax.grid(axis="x", alpha=0.3, which="both")
    n_planned = len(pts)
    return Figure(
        id="run-throughput",
        title="Measured throughput against the planner's figures",
        caption=(
            "Bars: measured s_per_item = model time (load excluded) summed over a model's "
            "jobs / the items that cost a model call, per stage, benchmark and model. Black "
            "ticks: the planner's seconds per image or call (config/throughput.yaml, "
            "`stereolens plan`); a bar past its tick = slower than planned "
            "(measured_vs_planned = measured / planned > 1). "
            + (
                f"{n_planned} of {len(labels)} rows have a planned figure. "
                if n_planned
                else "The planner's table has none of these models. "
            )
            + "The planner's figures are for its table's GPU: a CPU run differs for that "
            "reason alone."
        ),
        png=F.to_png(fig),
    )


def truncation_line(jobs: pl.DataFrame | None) -> str | None:
    """Images whose prompt a text encoder cut, from the jobs' timing.json; None if unrecorded."""
    if jobs is None or "prompts_truncated" not in jobs.columns:
        return None
    every = jobs.filter(pl.col("stage") == "generate")
    gen = every.filter(pl.col("prompts_truncated").is_not_null())
    if gen.is_empty():
        return None
    images = int(gen["items"].sum())
    older = every.height - gen.height
    note = (
        f" ({older} generation jobs made before stereolens recorded it are not counted)"
        if older
        else ""
    )
    per_model = (
        gen.group_by("model")
        .agg(pl.col("prompts_truncated").sum().alias("cut"), pl.col("items").sum())
        .filter(pl.col("cut") > 0)
        .sort("model")
    )
    if per_model.is_empty():
        return f"Prompts cut by a text encoder: none of the {images} generated images{note}."
    cut = int(per_model["cut"].sum())
    models = "; ".join(
        f"{r['model']} {r['cut']} of {r['items']}" for r in per_model.iter_rows(named=True)
    )
    return (
        f"Prompts cut by a text encoder: {cut} of {images} generated images ({models}){note}. "
        "The encoder saw only the first tokens of these prompts (CLIP 77, T5 its "
        "max_sequence_length); each such image's metadata.jsonl row lists the encoders "
        "with tokens, kept and dropped (prompt_truncation) and has quirks "
        "[prompt_truncated]."
    )


def _jobs(inputs: Inputs, config: dict) -> pl.DataFrame | None:
    """The run's model jobs (throughput.JOB_SCHEMA): the workflow's job_timings table, else
    the jobs found under the results folder, of the models the config names."""
    jobs = inputs.get("job_timings")
    if jobs is not None:
        return jobs
    results = inputs.results_dir()
    if results is None:
        return None
    from stereolens.throughput import configured_jobs

    return configured_jobs(results, config=config)


def sections(inputs: Inputs, config: dict, shown: dict | None = None) -> list[Section]:
    """The run section; its settings show ``shown`` (default: ``config``)."""
    from stereolens.throughput import CAPTION

    section = Section("run", "The run: models, throughput, settings")
    models = models_table(config, registry_entries(inputs, config))
    section.tables.append(
        Table(
            "run-models",
            "Models of this run and their registry settings",
            "Every model the run used, by role: generators, extractors, the canonicalisation "
            "LLM and encoder, BiasIG's VQA, the audited LVLMs, the LVLM assistant and the "
            "refusal judge; settings = the registry entry's keys that determine the outputs.",
            models,
            collapsed=False,
        )
    )
    jobs = _jobs(inputs, config)
    summary = _throughput_rows(jobs, inputs)
    sub = Section("run-throughput", "Measured throughput")
    if summary is None or summary.is_empty():
        sub.paragraphs.append("No job timing records were found for this run.")
    else:
        fig = throughput_figure(summary)
        if fig is not None:
            sub.figures.append(fig)
        sub.tables.append(
            Table(
                "run-throughput-table",
                "Throughput per stage, benchmark and model",
                CAPTION,
                summary,
            )  # fmt: skip
        )
        slow = summary.filter(pl.col("measured_vs_planned") > 1)
        if slow.height:
            worst = slow.sort("measured_vs_planned", descending=True).row(0, named=True)
            ratio = worst["measured_vs_planned"]
            if finite(ratio):
                sub.paragraphs.append(
                    f"{slow.height} stage x model rows ran slower than planned; the slowest "
                    f"against its plan: {worst['model']} ({worst['stage']}, {ratio:.1f}x)."
                )
    section.subsections.append(sub)
    line = truncation_line(jobs)
    if line is not None:
        generation = Section("run-generation", "Generation quirks")
        generation.paragraphs.append(line)
        section.subsections.append(generation)
    settings = Section("run-settings", "Run settings")
    settings.preformatted.append(
        (
            "The config of this run (JSON)",
            json.dumps(config if shown is None else shown, indent=2, sort_keys=True, default=str),
        )
    )
    section.subsections.append(settings)
    return [section]
