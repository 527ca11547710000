"""One generation job of any benchmark (rule ``generate_images``): the benchmark's adapter turns
its prompt table and wildcards into items; loading, batch size and the shard runner are shared
here (docs/architecture.md, "Inside a model job")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stereolens.models.job import ModelJob
from stereolens.models.registry import ModelSpec, load_registry


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
    """The images of one generation job of ``benchmark``, as GenerationItem keyword dicts
    (``prompts_path`` None: the shipped prompts); ValueError when the job has none."""
    from stereolens.benchmark import benchmark as plugin
    from stereolens.benchmark import resolve

    target = plugin(benchmark).generation_items
    if target is None:
        raise ValueError(f"benchmark {benchmark!r} generates no images")
    adapter = resolve(target)
    return adapter(prompts_path, model, group, cell, shard, settings, config or {})


def run_generation(
    job: ModelJob,
    spec: ModelSpec,
    items: list[dict],
    *,
    label: str,
    load: Callable[[ModelSpec], Any] | None = None,
) -> list[dict]:
    """Make ``items`` with ``spec``'s model into the shard ``job.out_path`` through the one
    model-job runner (stereolens.generate.run.generate_shard: PNGs, metadata.jsonl and the
    timing record timing.json, written atomically and resumably from
    ``<out_dir>.partial/``), at this attempt's batch size (``job.batch_size``)."""
    from stereolens.generate.run import generate_shard
    from stereolens.models.requests import GenerationItem

    generation = [GenerationItem(**it) for it in items]
    job.log.info(
        "%s %s: %d images at batch size %s; loading %s",
        spec.name,
        label,
        len(generation),
        job.spec(spec).get("batch_size", 1),
        spec.model,
    )
    return job.run(
        spec,
        lambda gen: generate_shard(
            gen.model,
            generation,
            job.out_path,
            model_name=gen.spec.name,
            batch_size=gen.batch_size,
            load_seconds=gen.load_seconds,
            log=job.log.info,
            timing_extra={"job_resources": dict(job.resources)},
        ),
        what=label,
        load=load,
        record=False,
        oom_note=", and it resumes from the images already made",
    )


def generate_images_job(
    job: ModelJob,
    benchmark: str,
    model: str,
    group: str,
    cell: str,
    shard: int,
    settings: dict[str, Any],
    prompts_path: str | None,
    config: dict[str, Any] | None = None,
) -> list[dict]:
    """The body of rule generate_images: the benchmark adapter's items for (group, cell,
    shard), made by the registry's model ``model`` into ``job.out_path``."""
    spec = load_registry(job.registry_path)[model]
    items = generation_items(
        benchmark, prompts_path, model, group, cell, int(shard), settings, config
    )
    return run_generation(job, spec, items, label=f"{benchmark} {group} {cell} shard {shard}")
