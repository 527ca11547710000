"""`stereolens plan`: jobs, images, model calls and GPU-hours of a run, from the config and the
shipped prompt tables alone, counted from each plug-in's job enumeration (docs/running.md)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stereolens.cost import STAGES, benchmark_sizes, size_hours, speed
from stereolens.cost import THROUGHPUT_SCHEMA as THROUGHPUT_SCHEMA
from stereolens.cost import THROUGHPUT_TABLE as DEFAULT_THROUGHPUT
from stereolens.cost import benchmark_hours as benchmark_hours
from stereolens.cost import default_throughput as default_throughput
from stereolens.cost import load_throughput as load_throughput
from stereolens.validation import ConfigError


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


def _rows(config: dict, registry: dict, throughput: dict) -> list[Row]:
    """One row per benchmark x stage x model from the benchmarks' own job enumeration (the
    one the Snakefile uses): jobs, images made or read, calls, GPU-hours."""
    from stereolens.benchmark import benchmarks

    groups: dict[tuple[str, str, str], list[int]] = {}
    units: dict[tuple[str, str, str], str] = {}
    for plugin in benchmarks(config):
        for job in plugin.jobs(config, counts=True):
            if job.stage not in STAGES or not job.model:
                continue
            key = (plugin.name, job.stage, job.model)
            acc = groups.setdefault(key, [0, 0])
            acc[0] += 1
            acc[1] += job.items
            units[key] = job.unit
    rows = []
    for (benchmark, stage, model), (jobs, items) in groups.items():
        seconds, status, source = speed(model, stage, registry, throughput)
        hours = None if seconds is None else items * seconds / 3600
        images = items if units[(benchmark, stage, model)] == "images" else 0
        rows.append(
            Row(benchmark, stage, model, jobs, images, items, seconds, status, source, hours)
        )
    return rows


LIMITS = {"jobs": "max_jobs", "images": "max_images", "gpu_hours": "max_gpu_hours"}
"""Figure of size() -> its ceiling's key under ``limits:`` in the config."""


def size(
    config: dict[str, Any], registry: dict, throughput: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The size of a validated config from each plug-in's ``size`` (else its job list):
    ``jobs``, ``images``, ``gpu_hours`` and ``parts``, (benchmark, stage, jobs, images,
    GPU-hours) per benchmark and stage."""
    throughput = throughput or {"entries": {}}
    parts: dict[tuple[str, str], list[float]] = {}
    for plugin, sizes in benchmark_sizes(config):
        for s in sizes:
            hours = size_hours(s, registry, throughput) or 0.0
            images = s.items if s.stage == "generate" and s.unit == "images" else 0
            acc = parts.setdefault((plugin.name, s.stage), [0, 0, 0.0])
            acc[0] += s.jobs
            acc[1] += images
            acc[2] += hours
    return {
        "jobs": sum(a[0] for a in parts.values()),
        "images": sum(a[1] for a in parts.values()),
        "gpu_hours": sum(a[2] for a in parts.values()),
        "parts": [(b, st, *a) for (b, st), a in parts.items()],
    }


def check_ceiling(
    config: dict[str, Any],
    registry: dict,
    throughput: dict[str, Any] | None = None,
    at: Any = None,
) -> dict[str, Any]:
    """Refuse a run larger than its ceilings (config ``limits``: jobs, generated images,
    GPU-hours), counted by :func:`size` before any job list is built: a ConfigError with
    the figures, the parts that make them and the key to change. Returns the size (with
    ``capped``). Under design.adaptive.gpu_hours_cap the rounds count at the shards the cap
    affords (``at``, else ``budget`` with ``throughput``)."""
    from stereolens.design import rounds

    if at is None and rounds.in_rounds(config):
        if config["design"]["adaptive"]["gpu_hours_cap"] is not None:
            at = rounds.budget(config, registry, throughput)
    capped = at is not None and at.cap is not None
    counted = rounds.capped_config(config, at.shards) if capped else config
    got = {**size(counted, registry, throughput), "capped": capped}
    limits = config["limits"]
    over = []
    for figure, key in LIMITS.items():
        if got[figure] > limits[key]:
            col = {"jobs": 2, "images": 3, "gpu_hours": 4}[figure]
            parts = sorted((p for p in got["parts"] if p[col] >= 0.5), key=lambda p: -p[col])[:4]
            shown = ", ".join(f"{b} {st} {p[col]:,.0f}" for p in parts for b, st in [p[:2]])
            over.append(
                f"{got[figure]:,.0f} {figure.replace('_', '-')} > limits.{key} = "
                f"{limits[key]:,} ({shown})"
            )
    if over:
        raise ConfigError(
            "the run"
            + (" at design.adaptive.gpu_hours_cap's shards" if capped else "")
            + " is larger than its ceilings: "
            + "; ".join(over)
            + ". Make it smaller (seeds or images per prompt, roles, models), or, if it is "
            "meant to be this large, raise the limits key named (config schema: limits)"
        )
    return got


def plan(
    config: dict[str, Any], registry: dict, throughput: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The plan of a validated config: rows (per benchmark, stage and model) and totals."""
    throughput = throughput or {"entries": {}}
    rows = _rows(config, registry, throughput)
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


def reader_plan(config: dict[str, Any], pilot: Path | None = None) -> list[dict[str, Any]]:
    """Per benchmark with a reader design: sample_design.planner_part's human labels for
    the configured target width, per model and in all, the disagreement's source (pilot or
    default) and notes (docs/planner.md, "Human labels for the reader correction")."""
    from stereolens.benchmark import benchmarks, resolve

    if pilot is not None and not Path(pilot).is_dir():
        raise ConfigError(f"--pilot {pilot}: not a folder; give a run's results folder")
    return [
        resolve(plugin.reader_design)(config, pilot)
        for plugin in benchmarks(config)
        if plugin.reader_design
    ]


def format_reader(parts: list[dict[str, Any]]) -> str:
    """Plain text: the human labels per benchmark and model."""
    out = []
    for part in parts:
        if not part["rows"]:
            continue
        out.append("")
        out.append(
            f"Human labels for the {part['benchmark']} reader correction: a 95% corrected "
            f"interval of width {part['target_width']:g} on a label share of one model's "
            f"{part['unit']} ({part['allocation']} allocation over the strata; disagreement "
            f"from {part['disagreement_source']})"
        )
        for r in part["rows"]:
            rate = f"{r['disagreement_min']:.3f}"
            if r["disagreement_max"] != r["disagreement_min"]:
                rate += f"-{r['disagreement_max']:.3f}"
            need = (
                f"{r['n_human']:,} human labels (width {r['width']:.4f})"
                if r["n_human"] is not None
                else f"not reachable (labelling all {r['n_items']:,} gives width {r['width']:.4f})"
            )
            out.append(
                f"- {r['model']}: {need} of {r['n_items']:,} {part['unit']} in "
                f"{r['strata']:,} strata (at least {r['floor']:,}: 2 per stratum); "
                f"disagreement {rate}; a perfect reader's width {r['naive_width']:.4f}"
            )
            if "n_printable" in r:
                out.append(f"  {printable_line(r, part['unit'])}")
        if part["n_human"] is not None and len(part["rows"]) > 1:
            out.append(f"- all models: {part['n_human']:,} human labels")
        if "n_recommended" in part and len(part["rows"]) > 1:
            out.append(
                f"- all models, recommended: {part['n_recommended']:,} human labels "
                f"(every cell at its printing minimum: {part['n_printable']:,})"
            )
        out += [f"Note: {n}" for n in part["notes"]]
    return "\n".join(out)


def printable_line(r: dict[str, Any], unit: str) -> str:
    """A reader row's labels for printable intervals (sample_design.printable_counts), its
    cells that can never reach their minimum, and the count the plan recommends."""
    lo, hi = r["minimum_min"], r["minimum_max"]
    per = f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"
    text = (
        f"printable intervals: {r['n_printable']:,} human labels ({per} in each cell of the "
        f"headline rows, at most its {unit})"
    )
    short = r["cells_short"]
    if short:
        grow = f"; {r['knob']} >= {r['knob_needed']:,} allows them" if r["knob"] else ""
        text += (
            f"; {short:,} of {r['strata']:,} cells have fewer {unit} than their minimum "
            f"(fewest {r['short_items_min']:,}): the rows needing more are withheld at any "
            f"count{grow}"
        )
    if not short:
        why = "every headline interval printed"
    elif short == r["strata"] and not r.get("short_reaching"):
        why = "the width's: every headline interval will be withheld"
    else:
        why = "per cell the largest minimum it reaches, else the width's n_h"
    return f"{text}; recommended {r['n_recommended']:,} ({why})"


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
    check_ceiling(config, registry, throughput)
    result = plan(config, registry, throughput)
    from stereolens.design import cli as design_cli

    design = None
    if design_cli.requested(args, config):  # power and target effects (stereolens.design)
        design = design_cli.compute(config, registry, throughput, result, args, plan)
    reader = reader_plan(config, args.pilot)
    if args.json:
        out = {**result, "reader": reader}
        print(json.dumps(out if design is None else {**out, "design": design}, indent=2))
    else:
        print(format_plan(result))
        if any(part["rows"] for part in reader):
            print(format_reader(reader))
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
    from stereolens.design import cli as design_cli

    design_cli.add_options(p)
    p.set_defaults(func=_run)
