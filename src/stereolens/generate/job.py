"""One generation job of any benchmark (workflow rule ``generate_images``), and the job
plumbing that generation, extraction and VQA jobs share.

A job is one model x group x cell x shard of a benchmark: for ContextBias group = role,
cell = condition (CF, CA-R, CA-U, VAL), shard = block of seeds; for BiasIG group =
acquired-attribute type, cell = prompt condition (implicit, explicit), shard = block of
prompts. A benchmark *adapter* (``ADAPTERS``: a ``generation_items`` function in the
benchmark's jobs module) turns the benchmark's prompt table and those wildcards into
GenerationItem keyword dicts; everything else (loading the model once, threads, the batch
size of this attempt, the resumable shard runner, timing.json) is shared here.

Retries after running out of memory: the workflow gives every model job a ``batch_size``
and ``mem_mb`` that depend on Snakemake's attempt number (registry ``batch_size`` halved
per retry, ``mem_mb`` times the attempt; see stereolens.registry.ModelSpec.job_batch_size).
The job runs its model at that batch size, which changes speed and memory only: every
image has its own seed, so the images are the same whatever the batch size.

``STEREOLENS_INJECT_OOM=<n>`` makes a job whose batch size is above n raise an
out-of-memory error right after its model has loaded, to exercise those retries.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from stereolens.registry import ModelSpec, load_model, load_registry

ADAPTERS: dict[str, str] = {
    "contextbias": "stereolens.contextbias.jobs:generation_items",
    "biasig": "stereolens.biasig.jobs:generation_items",
}
"""Benchmark -> "module:function" turning a prompt table and a job's wildcards into items:
``fn(prompts_path, model, group, cell, shard, settings, config) -> list[dict]`` (see
:func:`generation_items`)."""

INJECT_OOM_ENV = "STEREOLENS_INJECT_OOM"


def limit_threads(threads: int | None) -> None:
    """Give torch the job's threads, not the machine's: several jobs share a node, and
    oversubscribed CPU threads make small models an order of magnitude slower."""
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def out_of_memory_error() -> type[BaseException]:
    """torch's out-of-memory exception where torch is installed, else MemoryError."""
    try:
        import torch
    except ImportError:
        return MemoryError
    return getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def check_injected_oom(batch_size: int | None, what: str) -> None:
    """Raise an out-of-memory error when ``STEREOLENS_INJECT_OOM`` is set to a number
    below this job's batch size (failure injection for the retry logic; unset = never)."""
    raw = os.environ.get(INJECT_OOM_ENV, "").strip()
    if not raw:
        return
    try:
        limit = int(raw)
    except ValueError:
        raise ValueError(f"{INJECT_OOM_ENV} must be an integer batch size, not {raw!r}") from None
    if batch_size is not None and batch_size > limit:
        raise out_of_memory_error()(
            f"{what}: injected out-of-memory error at batch size {batch_size} "
            f"({INJECT_OOM_ENV}={limit}: batch sizes above {limit} fail)"
        )


def job_resources(snakemake: Any) -> dict[str, Any]:
    """The scheduler resources of a running Snakemake job that concern memory (mem_mb,
    batch_size, gpu, threads), for the job's log and timing.json."""
    res = snakemake.resources
    out = {k: res.get(k) for k in ("mem_mb", "batch_size", "gpu") if res.get(k) is not None}
    out["threads"] = snakemake.threads
    return out


def generation_items(
    benchmark: str,
    prompts_path: str | None,
    model: str,
    group: str,
    cell: str,
    shard: int,
    settings: dict[str, Any],
    config: dict[str, Any] | None = None,
) -> list[dict]:
    """The images of one generation job of ``benchmark``, as GenerationItem keyword dicts.

    ``prompts_path`` is the benchmark's prompt input (ContextBias: the prompt bank, None =
    the shipped one; BiasIG: the prompt table parquet, None = the shipped table);
    ``settings`` the rule's settings param (ContextBias: seed settings; BiasIG: the
    biasig settings); ``config`` the benchmark's config section. Raises ValueError when
    the job has no images (a shard past the last one, an unknown group or cell).
    """
    try:
        target = ADAPTERS[benchmark]
    except KeyError:
        raise ValueError(
            f"unknown benchmark {benchmark!r}; generation adapters exist for {sorted(ADAPTERS)}"
        ) from None
    module, _, name = target.partition(":")
    adapter = getattr(importlib.import_module(module), name)
    return adapter(prompts_path, model, group, cell, shard, settings, config or {})


def run_generation(
    spec: ModelSpec,
    items: list[dict],
    out_dir: str,
    *,
    label: str,
    batch_size: int | None = None,
    load: Callable[[ModelSpec], Any] = load_model,
    log: logging.Logger | None = None,
    threads: int | None = None,
    job_resources: dict[str, Any] | None = None,
) -> list[dict]:
    """Load ``spec``'s model once and make ``items`` into ``out_dir``
    (stereolens.generate.run.generate_shard: PNGs, metadata.jsonl and timing.json, written
    atomically and resumably from ``<out_dir>.partial/``). ``batch_size`` overrides the
    registry's for this job (a retry's smaller batch); ``job_resources`` (the scheduler's
    mem_mb, batch_size, ...) are logged and recorded in timing.json."""
    from stereolens.generate.base import GenerationItem
    from stereolens.generate.run import generate_shard

    log = log or logging.getLogger(__name__)
    spec = spec.with_batch_size(batch_size)
    generation = [GenerationItem(**it) for it in items]
    log.info(
        "%s %s: %d images at batch size %s; loading %s",
        spec.name,
        label,
        len(generation),
        spec.get("batch_size", 1),
        spec.model,
    )
    if job_resources:
        log.info("job resources: %s", ", ".join(f"{k}={v}" for k, v in job_resources.items()))
    limit_threads(threads)
    start = time.perf_counter()
    generator = load(spec)
    load_seconds = time.perf_counter() - start
    log.info("model loaded in %.1f s", load_seconds)
    effective = int(getattr(generator, "batch_size", None) or spec.get("batch_size", 1) or 1)
    try:
        check_injected_oom(effective, f"{spec.name} {label}")
        return generate_shard(
            generator,
            generation,
            out_dir,
            model_name=spec.name,
            batch_size=effective,
            load_seconds=load_seconds,
            log=log.info,
            timing_extra={"job_resources": dict(job_resources or {})},
        )
    except Exception as exc:
        if isinstance(exc, (MemoryError, out_of_memory_error())):
            log.error(
                "out of memory at batch size %d (%s); with --retries, Snakemake reruns the "
                "job with half the batch size and more memory, and it resumes from the "
                "images already made",
                effective,
                ", ".join(f"{k}={v}" for k, v in (job_resources or {}).items()) or "no resources",
            )
        raise


def generate_images_job(
    registry_path: str,
    benchmark: str,
    model: str,
    group: str,
    cell: str,
    shard: int,
    settings: dict[str, Any],
    prompts_path: str | None,
    out_dir: str,
    config: dict[str, Any] | None = None,
    batch_size: int | None = None,
    log: logging.Logger | None = None,
    threads: int | None = None,
    job_resources: dict[str, Any] | None = None,
) -> list[dict]:
    """The body of rule generate_images: the benchmark adapter's items for (group, cell,
    shard), made by the model ``model`` of the registry at ``registry_path``."""
    spec = load_registry(registry_path)[model]
    items = generation_items(
        benchmark, prompts_path, model, group, cell, int(shard), settings, config
    )
    return run_generation(
        spec,
        items,
        out_dir,
        label=f"{benchmark} {group} {cell} shard {shard}",
        batch_size=batch_size,
        log=log,
        threads=threads,
        job_resources=job_resources,
    )


class ShardIntegrityError(RuntimeError):
    """A finished generation shard whose images do not match their recorded hashes."""


def read_shard_metadata(images_dir, keys) -> list[dict]:
    """The items of a finished generation shard (its metadata.jsonl): ``keys`` of each
    record plus ``image_path`` and the verified ``image_sha256``. Extraction and VQA jobs
    read their images this way: every image is hashed (it is read anyway) and compared with
    the hash recorded when it was made; a missing, truncated or changed image fails the
    job, naming the file and the command that regenerates its shard."""
    from pathlib import Path

    from stereolens.atomic import read_jsonl
    from stereolens.ids import sha256_file

    path = Path(images_dir) / "metadata.jsonl"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: the generation job for {images_dir} did not finish; "
            f"regenerate it: stereolens regenerate --shard {images_dir} --configfile <config>"
        )
    items, bad = [], []
    for r in read_jsonl(path):
        image = Path(images_dir) / r["image_file"]
        try:
            sha = sha256_file(image)
        except OSError as exc:
            bad.append(f"{image} ({type(exc).__name__})")
            continue
        if r.get("image_sha256") and sha != r["image_sha256"]:
            bad.append(f"{image} (sha256 {sha[:12]}... but {r['image_sha256'][:12]}... recorded)")
            continue
        items.append({**{k: r.get(k) for k in keys}, "image_path": str(image), "image_sha256": sha})
    if bad:
        more = f" ... and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ShardIntegrityError(
            f"{len(bad)} image(s) of the finished shard {images_dir} are missing, corrupt or "
            f"changed since they were made: {'; '.join(bad[:3])}{more}. Regenerate the shard "
            f"(and what was read from it): stereolens regenerate --shard {images_dir} "
            "--configfile <your config>"
        )
    return items


def run_model_job(
    spec: ModelSpec,
    out_path: str,
    work: Callable[[Any], Any],
    log: logging.Logger,
    *,
    threads: int | None = None,
    what: str = "",
    items: int | None = None,
    load: Callable[[ModelSpec], Any] = load_model,
):
    """Load ``spec``'s model once, run ``work(model)`` and record the job's own timing
    beside its output (``<out_path>.timing.json``: load seconds, work seconds, items =
    ``items`` or len(result)); ``load`` builds the model (as in run_generation). Shared by
    extraction, VQA and the LVLM jobs; the injected
    out-of-memory check (STEREOLENS_INJECT_OOM) runs right after the load."""
    from stereolens.workflow_support import write_job_timing

    if spec.backend.startswith("transformers"):
        limit_threads(threads)
    start = time.perf_counter()
    model = load(spec)
    load_seconds = time.perf_counter() - start
    log.info("%s loaded in %.1f s", spec.name, load_seconds)
    check_injected_oom(spec.get("batch_size", 1), f"{spec.name} {what}".strip())
    start = time.perf_counter()
    result = work(model)
    n = items if items is not None else len(result)
    write_job_timing(out_path, spec.name, load_seconds, time.perf_counter() - start, n)
    return result
