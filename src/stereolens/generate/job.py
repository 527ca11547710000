"""One generation job of any benchmark (rule ``generate_images``): the benchmark's adapter turns
its prompt table and wildcards into items; loading, batch size and the shard runner are shared
here (docs/architecture.md, "Inside a model job")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from stereolens.models.job import (
    check_injected_oom,
    limit_threads,
    log_job_resources,
    out_of_memory_error,
)
from stereolens.models.registry import ModelSpec, load_model, load_registry


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
    from stereolens.benchmark import benchmark as plugin
    from stereolens.benchmark import resolve

    target = plugin(benchmark).generation_items
    if target is None:
        raise ValueError(f"benchmark {benchmark!r} generates no images")
    adapter = resolve(target)
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
    from stereolens.generate.run import generate_shard
    from stereolens.models.requests import GenerationItem

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
    log_job_resources(log, job_resources)
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
