"""Measured throughput: model-load time and time per item of every model job of a run, per
stage x benchmark x model, next to the planner's figures; the sources are in docs/outputs.md."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Any

import polars as pl

from stereolens.atomic import read_jsonl
from stereolens.layout import ROOT, Layout
from stereolens.models.job import TIMING_FILE, read_job_timing


def job_layouts() -> dict[str, Layout]:
    """Benchmark name -> its layout (stereolens.layout), of every registered benchmark that
    has one: its job templates say where its model jobs write and under which stage."""
    from stereolens.benchmark import benchmarks

    return {p.name: p.layout for p in benchmarks() if p.layout is not None}


def job_stages() -> list[str]:
    """Every model-job stage of the registered layouts, in their order (the summary's)."""
    return list(dict.fromkeys(f.stage for lay in job_layouts().values() for f in lay.jobs.values()))


_LOADED = re.compile(r"loaded in ([0-9]+(?:\.[0-9]+)?) s")

JOB_SCHEMA = {
    "benchmark": pl.String,
    "stage": pl.String,
    "model": pl.String,
    "job": pl.String,
    "items": pl.Int64,
    "timed_items": pl.Int64,
    "item_seconds": pl.Float64,
    "load_seconds": pl.Float64,
    "wall_seconds": pl.Float64,
    "max_rss_mb": pl.Float64,
    "prompts_truncated": pl.Int64,
}

SUMMARY_COLUMNS = [
    "stage",
    "benchmark",
    "model",
    "jobs",
    "items",
    "load_s_total",
    "load_s_mean",
    "s_per_item",
    "items_per_hour",
    "wall_s_per_item",
    "peak_rss_mb",
    "planned_s_per_item",
    "planned_status",
    "measured_vs_planned",
]

CAPTION = (
    "Measured throughput per stage, benchmark and model, from the jobs of this run. "
    "jobs: finished jobs found; items: images generated (generate), images sent to the "
    "model (extract, vqa). load_s_total / load_s_mean: model-load time summed over / "
    "averaged across the jobs that recorded it (each job's timing record; for an "
    "extraction or VQA job of an older stereolens, its records or its log). s_per_item: "
    "the model's own "
    "time per item, load excluded = seconds recorded per item summed over all jobs, "
    "divided by the items that cost a model call (answers from the response cache cost "
    "none); empty when the jobs do not record per-item time. items_per_hour: 3600 / "
    "s_per_item. wall_s_per_item: Snakemake benchmark wall time of the whole jobs "
    "(start-up and load included) divided by their items. peak_rss_mb: largest max_rss "
    "(MB) of any job in the Snakemake benchmark files. planned_s_per_item and "
    "planned_status: the planner's figure for the model (config/throughput.yaml, "
    "`stereolens plan`) and whether it is measured or an estimate; measured_vs_planned: "
    "s_per_item / planned_s_per_item (above 1 = slower than planned). The planner's "
    "figures are for its table's GPU: a different device or a CPU run differs for that "
    "reason alone."
)


# ------------------------------------------------------------------ reading


def _read_benchmark_tsv(path: Path) -> tuple[float | None, float | None]:
    """(mean wall seconds, max of max_rss in MB) of a Snakemake benchmark file; None for a
    missing or unreadable value ("NA" or "-" where psutil could not measure)."""

    def num(value: Any) -> float | None:
        try:
            out = float(value)
        except (TypeError, ValueError):
            return None
        return out if math.isfinite(out) else None

    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
    except OSError:
        return None, None
    walls = [w for w in (num(r.get("s")) for r in rows) if w is not None]
    rss = [m for m in (num(r.get("max_rss")) for r in rows) if m is not None]
    return (sum(walls) / len(walls) if walls else None), (max(rss) if rss else None)


def _load_from_log(path: Path) -> float | None:
    """The last "loaded in N s" of a job log (logs are appended to on reruns)."""
    try:
        found = _LOADED.findall(path.read_text(errors="replace"))
    except OSError:
        return None
    return float(found[-1]) if found else None


def _answer_job(jsonl_path: Path, log_path: Path) -> dict[str, Any]:
    """The timing of an extraction or VQA job of an older stereolens, which wrote no timing
    record: the seconds its records carry, the load time from them or its log."""
    records = read_jsonl(jsonl_path)
    # VQA writes one row per image x person position; count images
    images = {r.get("image_id") for r in records}
    items = len(images) if None not in images else len(records)
    timed = [r for r in records if "seconds" in r]
    item_seconds = None
    timed_items = None
    if records and len(timed) == len(records):
        item_seconds = float(sum(float(r["seconds"] or 0.0) for r in records))
        # an answer wholly from the response cache cost no model call
        timed_items = sum(
            not all(a.get("cached") for a in (r.get("attempt_log") or [])) for r in records
        )
    loads = [r["load_seconds"] for r in records if r.get("load_seconds") is not None]
    load = float(loads[0]) if loads else _load_from_log(log_path)
    return {
        "items": items,
        "timed_items": timed_items,
        "item_seconds": item_seconds,
        "load_seconds": load,
    }


def _job(output: Path, stage: str, log_path: Path) -> dict[str, Any] | None:
    """The timing of the job that wrote ``output``: its record, else :func:`_answer_job`'s."""
    record = read_job_timing(output)
    if record is None:
        return None if stage == "generate" else _answer_job(output, log_path)
    seconds = record.get("seconds")
    return {
        "model": record.get("model"),
        "items": int(record["items"]),
        "timed_items": record.get("timed_items"),
        "item_seconds": None if seconds is None else float(seconds),
        "load_seconds": record.get("load_seconds"),
        # images whose prompt a text encoder cut (generation; None: a job of an older
        # stereolens, or a job that makes no images)
        "prompts_truncated": record.get("prompts_truncated"),
    }


def _job_row(
    layout: Layout, output: Path, results_dir: Path, benchmarks_dir: Path, logs_dir: Path
) -> dict[str, Any] | None:
    """The JOB_SCHEMA row of the job whose ``output`` (shard folder or .jsonl) is at a job
    template of ``layout``; None for another path, a work folder or a job without timing."""
    rel_results = output.relative_to(results_dir).as_posix()
    found = layout.job(f"{ROOT}/{rel_results}")
    if found is None or any(
        p.endswith((".partial", ".stale")) for p in output.relative_to(results_dir).parts
    ):
        return None  # not a job output, or the work folder of an unfinished or replaced job
    stage, parsed = found
    bench = layout.benchmark
    log = Path(layout.log(parsed.name).format(**parsed.keys)).relative_to("logs")
    try:
        job = _job(output, stage, logs_dir / log)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # a file being written or of an unknown layout: not a job
    if job is None:
        return None
    tsv = Path(layout.bench(parsed.name).format(**parsed.keys)).relative_to("benchmarks")
    wall, rss = _read_benchmark_tsv(benchmarks_dir / tsv)
    return {
        "benchmark": bench,
        "stage": stage,
        # the model that ran (an LVLM story job's folder names the audited model, its
        # timing the assistant that read the stories)
        "model": job.pop("model", None) or layout.job_model(parsed),
        "job": layout.job_name(parsed),
        **job,
        "wall_seconds": wall,
        "max_rss_mb": rss,
    }


def _dirs(results_dir, benchmarks_dir, logs_dir) -> tuple[Path, Path, Path]:
    results_dir = Path(results_dir)
    root = results_dir.parent
    benchmarks_dir = Path(benchmarks_dir) if benchmarks_dir else root / "benchmarks"
    logs_dir = Path(logs_dir) if logs_dir else root / "logs"
    return results_dir, benchmarks_dir, logs_dir


def collect_jobs(
    results_dir: str | Path,
    benchmarks_dir: str | Path | None = None,
    logs_dir: str | Path | None = None,
) -> pl.DataFrame:
    """One row per finished model job found under ``results_dir`` at a job template of a
    registered benchmark's layout (JOB_SCHEMA). ``benchmarks_dir`` and ``logs_dir`` default
    to the folders beside it."""
    results_dir, benchmarks_dir, logs_dir = _dirs(results_dir, benchmarks_dir, logs_dir)
    rows = []
    for layout in job_layouts().values():
        for name, folder in layout.jobs.items():
            base = results_dir / Path(layout.job_base(name)).relative_to(ROOT)
            if not base.is_dir():
                continue
            if folder.stage == "generate":  # a shard folder holds its timing record
                outputs = sorted(p.parent for p in base.rglob(TIMING_FILE))
            else:
                outputs = sorted(base.rglob("*.jsonl"))
            for output in outputs:
                row = _job_row(layout, output, results_dir, benchmarks_dir, logs_dir)
                if row is not None:
                    rows.append(row)
    return pl.DataFrame(rows, schema=JOB_SCHEMA)


def collect_job_outputs(
    outputs: list[str | Path],
    results_dir: str | Path,
    benchmarks_dir: str | Path | None = None,
    logs_dir: str | Path | None = None,
) -> pl.DataFrame:
    """The JOB_SCHEMA rows of the named job outputs only, without walking the results folder."""
    results_dir, benchmarks_dir, logs_dir = _dirs(results_dir, benchmarks_dir, logs_dir)
    layouts = job_layouts()
    rows = []
    for out in outputs:
        rel = Path(out).relative_to(results_dir).as_posix()
        layout = next(
            (lay for lay in layouts.values() if lay.job(f"{ROOT}/{rel}") is not None), None
        )
        if layout is None:
            raise ValueError(f"{out} is not a job output under {results_dir}/<benchmark>/")
        if not Path(out).exists():
            continue
        row = _job_row(layout, Path(out), results_dir, benchmarks_dir, logs_dir)
        if row is not None:
            rows.append(row)
    return pl.DataFrame(rows, schema=JOB_SCHEMA)


# ------------------------------------------------------------------ summary


def _planned(model: str, stage: str, table: dict | None) -> tuple[float | None, str | None]:
    entry = ((table or {}).get("entries") or {}).get(model)
    if not entry:
        return None, None
    key = "seconds_per_image" if stage == "generate" else "seconds_per_call"
    value = entry.get(key)
    return (float(value), entry.get("status")) if value is not None else (None, None)


def summarise(jobs: pl.DataFrame, throughput_table: dict | None = None) -> pl.DataFrame:
    """Per (stage, benchmark, model): SUMMARY_COLUMNS (see CAPTION for each)."""
    if jobs.is_empty():
        return pl.DataFrame(
            schema={
                c: (
                    pl.String
                    if c in ("stage", "benchmark", "model", "planned_status")
                    else pl.Int64
                    if c in ("jobs", "items")
                    else pl.Float64
                )
                for c in SUMMARY_COLUMNS
            }
        )
    with_bench = pl.col("wall_seconds").is_not_null()
    out = (
        jobs.group_by("stage", "benchmark", "model")
        .agg(
            pl.len().cast(pl.Int64).alias("jobs"),
            pl.col("items").sum().cast(pl.Int64).alias("items"),
            pl.col("load_seconds").sum().alias("load_s_total"),
            pl.col("load_seconds").mean().alias("load_s_mean"),
            pl.col("load_seconds").is_not_null().sum().alias("_load_jobs"),
            pl.col("item_seconds").sum().alias("_item_s"),
            pl.col("timed_items")
            .filter(pl.col("item_seconds").is_not_null())
            .sum()
            .alias("_timed"),
            pl.col("item_seconds").is_not_null().sum().alias("_timed_jobs"),
            pl.col("wall_seconds").filter(with_bench).sum().alias("_wall"),
            pl.col("items").filter(with_bench).sum().alias("_wall_items"),
            pl.col("max_rss_mb").max().alias("peak_rss_mb"),
        )
        .with_columns(
            pl.when(pl.col("_load_jobs") > 0).then(pl.col("load_s_total")).alias("load_s_total"),
            pl.when((pl.col("_timed_jobs") > 0) & (pl.col("_timed") > 0))
            .then(pl.col("_item_s") / pl.col("_timed"))
            .alias("s_per_item"),
            pl.when(pl.col("_wall_items") > 0)
            .then(pl.col("_wall") / pl.col("_wall_items"))
            .alias("wall_s_per_item"),
        )
        .with_columns(
            pl.when(pl.col("s_per_item") > 0)
            .then(3600.0 / pl.col("s_per_item"))
            .alias("items_per_hour")
        )
    )
    planned = [
        _planned(m, s, throughput_table) for m, s in zip(out["model"], out["stage"], strict=True)
    ]
    out = out.with_columns(
        pl.Series("planned_s_per_item", [p[0] for p in planned], dtype=pl.Float64),
        pl.Series("planned_status", [p[1] for p in planned], dtype=pl.String),
    ).with_columns(
        (pl.col("s_per_item") / pl.col("planned_s_per_item")).alias("measured_vs_planned")
    )
    order = {stage: i for i, stage in enumerate(job_stages())}
    return (
        out.with_columns(pl.col("stage").replace_strict(order, default=9).alias("_order"))
        .sort("_order", "benchmark", "model")
        .select(SUMMARY_COLUMNS)
    )


def measured_throughput(
    results_dir: str | Path,
    config: dict | None = None,
    throughput_table: dict | None = None,
    benchmarks_dir: str | Path | None = None,
    logs_dir: str | Path | None = None,
) -> pl.DataFrame:
    """The summary of every job under ``results_dir``; with ``config``, only the
    benchmarks and models it configures (left-over folders of other runs are ignored)."""
    jobs = configured_jobs(results_dir, config, benchmarks_dir, logs_dir)
    return summarise(jobs, throughput_table)


def configured_jobs(
    results_dir: str | Path,
    config: dict | None = None,
    benchmarks_dir: str | Path | None = None,
    logs_dir: str | Path | None = None,
) -> pl.DataFrame:
    """JOB_SCHEMA rows of every job under ``results_dir`` (with ``config``: its models only)."""
    jobs = collect_jobs(results_dir, benchmarks_dir, logs_dir)
    if config is not None and not jobs.is_empty():
        from stereolens.benchmark import configured_models

        wanted = {b: set(names) for b, names in configured_models(config).items()}
        keep = [
            m in wanted.get(b, set()) if b in wanted or b in config else True
            for b, m in zip(jobs["benchmark"], jobs["model"], strict=True)
        ]
        jobs = jobs.filter(pl.Series(keep, dtype=pl.Boolean))
    return jobs
