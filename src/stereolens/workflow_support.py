"""Small helpers shared by the Snakefile and the workflow scripts.

Kept import-light: the Snakefile imports this at parse time on every job.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from stereolens.cost import THROUGHPUT_TABLE as THROUGHPUT_TABLE
from stereolens.layout import REPORT as REPORT_LAYOUT
from stereolens.models.registry import ModelSpec

if TYPE_CHECKING:
    from stereolens.benchmark import Job


REPORT = REPORT_LAYOUT.index
JOB_TIMINGS = REPORT_LAYOUT.job_timings


def final_targets(config: dict) -> list[str]:
    """The inputs of rule all: the enabled benchmarks' targets, then the report."""
    from stereolens.benchmark import all_targets
    from stereolens.design.rounds import in_rounds
    from stereolens.layout import ADAPTIVE

    rounds = [ADAPTIVE.path("decisions", benchmark=p.name) for p in in_rounds(config)]
    return [*all_targets(config), *rounds, REPORT]


def report_inputs(config: dict) -> dict[str, str]:
    """Every file the report reads, by its stereolens.report.inputs name: the enabled
    benchmarks' report tables, the job timings and the throughput table (if any)."""
    from stereolens.benchmark import all_report_tables
    from stereolens.design.rounds import in_rounds
    from stereolens.layout import ADAPTIVE, adaptive_table

    inputs = {**all_report_tables(config), "job_timings": JOB_TIMINGS}
    for plugin in in_rounds(config):  # the adaptive design's decisions (design.mode adaptive)
        inputs[adaptive_table(plugin.name)] = ADAPTIVE.path("decisions", benchmark=plugin.name)
    if os.path.exists(THROUGHPUT_TABLE):
        inputs["throughput_table"] = THROUGHPUT_TABLE
    return inputs


def job_timing_inputs(
    config: dict, jobs: Callable[[str], Sequence[Job]] | None = None
) -> dict[str, list[str]]:
    """The outputs of every model job of the run that the measured throughput reads, split
    into the generation shard folders (``generation``) and the other job files
    (``answers``). ``jobs``: benchmark name -> its plug-in's jobs, where already known."""
    from stereolens.benchmark import benchmarks

    out: dict[str, list[str]] = {"generation": [], "answers": []}
    for plugin in benchmarks(config):
        if plugin.layout is None:
            continue
        for job in jobs(plugin.name) if jobs else plugin.jobs(config):
            found = plugin.layout.job(job.output)
            if found is not None:
                out["generation" if found[0] == "generate" else "answers"].append(job.output)
    return out


def model_fingerprint_json(spec: ModelSpec) -> str:
    """Canonical JSON of what determines a model's outputs (a Snakemake param: a change
    reruns that model's jobs; reordering the config or adding models does not)."""
    return json.dumps(spec.fingerprint(), sort_keys=True, default=str)


def set_offline() -> None:
    """Forbid model-hub access in this process: a hub lookup then raises at once
    instead of downloading. Must run before huggingface_hub is imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"


@contextmanager
def logged(log_path: str | os.PathLike | None):
    """Send logging, stdout and stderr to the rule's log file; log tracebacks on failure."""
    if not log_path:
        yield logging.getLogger("stereolens")
        return
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", buffering=1) as fh:
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = fh
        handler = logging.StreamHandler(fh)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            yield logging.getLogger("stereolens")
        except BaseException:
            traceback.print_exc(file=fh)
            raise
        finally:
            root.removeHandler(handler)
            sys.stdout, sys.stderr = old_out, old_err


def run_logged(snakemake, fn: Callable[[logging.Logger], None]) -> None:
    """Entry point of a workflow script: fn(log) with output going to snakemake.log[0]."""
    if snakemake.config.get("offline"):
        set_offline()
    log_path = snakemake.log[0] if len(snakemake.log) else None
    with logged(log_path) as log:
        start = time.perf_counter()
        check_inputs(snakemake.input)
        fn(log)
        log.info("done in %.1f s", time.perf_counter() - start)


PLANNING_FLAGS = frozenset(
    "--dry-run --dryrun --summary -S --detailed-summary -D --lint --unlock --list-rules -l "
    "--list-target-rules --lt --dag --rulegraph --filegraph --d3dag --list-changes --lc "
    "--list-input-changes --li --list-params-changes --lp --list-code-changes --cleanup-metadata "
    "--delete-all-output --delete-temp-output --containerize --print-compilation".split()
)
"""Snakemake options of an invocation that runs no job (Snakemake decides the dry run
after the parse, so the Snakefile reads its command line)."""


def runs_no_job(argv: Sequence[str] | None = None) -> bool:
    """Whether the Snakemake command line ``argv`` (default sys.argv) runs no job: a dry
    run, a summary, a lint, an unlock, a graph or a listing."""
    args = sys.argv[1:] if argv is None else argv
    return any(
        a in PLANNING_FLAGS or (a.startswith("-") and not a.startswith("--") and "n" in a[1:])
        for a in args
    )


HOUSEKEEPING_FLAGS = frozenset(
    "--unlock --cleanup-metadata --lint --list-rules -l --list-target-rules --lt".split()
)
"""Snakemake options of an invocation that neither runs nor plans jobs: a damaged table
only warns there (an unlock must work, so that `stereolens regenerate` can mend it)."""


def housekeeping(argv: Sequence[str] | None = None) -> bool:
    """Whether Snakemake's ``argv`` (default sys.argv) only unlocks, lints or lists."""
    args = sys.argv[1:] if argv is None else argv
    return any(a in HOUSEKEEPING_FLAGS for a in args)


def check_results_intact(configfiles=(), root: str = "results", warn_only: bool = False) -> None:
    """Refuse a run (at parse time) while a table under ``root`` is damaged, naming each
    damaged file and the `stereolens regenerate` command that mends it; under `stereolens
    regenerate` (REGENERATING_ENV) or with ``warn_only`` it only warns."""
    from stereolens.damage import REGENERATING_ENV, DamagedTable, message, scan

    found = scan(root)
    if not found:
        return
    configfile = str(configfiles[-1]) if configfiles else None
    if configfile and Path(configfile).is_absolute():
        rel = os.path.relpath(configfile)
        configfile = configfile if rel.startswith("..") else rel
    text = message(found, configfile)
    if warn_only or os.environ.get(REGENERATING_ENV):
        print(f"stereolens: warning: {text}", file=sys.stderr)
        return
    raise DamagedTable(text, [p for p, _ in found])


def check_inputs(paths) -> None:
    """Refuse to start a job whose parquet or JSON-lines input under results/ is damaged,
    naming each such file and the command that mends it (stereolens.damage)."""
    from stereolens.damage import in_results, require_intact

    # outputs of the workflow only: a hand-written JSON-lines input (annotation answers)
    # may lack its final newline
    require_intact(p for p in paths if isinstance(p, str) and in_results(p) and os.path.isfile(p))


def job_resources(snakemake) -> dict:
    """The scheduler resources of a running Snakemake job that concern memory (mem_mb,
    batch_size, gpu) and its threads: logged and recorded in the job's timing record."""
    res = snakemake.resources
    out = {k: res.get(k) for k in ("mem_mb", "batch_size", "gpu") if res.get(k) is not None}
    out["threads"] = snakemake.threads
    return out


def model_job(snakemake, log: logging.Logger):
    """The plain values of a model-loading job (models.job.ModelJob) from its Snakemake object."""
    from stereolens.models.job import ModelJob

    return ModelJob(
        out_path=snakemake.output[0],
        registry_path=snakemake.params.registry,
        log=log,
        threads=snakemake.threads,
        batch_size=snakemake.resources.get("batch_size"),
        resources=job_resources(snakemake),
        cache_dir=getattr(snakemake.params, "cache_dir", None),
    )
