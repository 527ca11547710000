"""The one model-job runner, whatever the benchmark: load once, threads, the injected
out-of-memory check, resources, one timing record, and a finished shard's verified items
(docs/architecture.md, "Inside a model job")."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from stereolens.models.registry import ModelSpec, load_model, load_registry

INJECT_OOM_ENV = "STEREOLENS_INJECT_OOM"
TIMING_FILE = "timing.json"
"""The timing record's name inside a folder output (a generation shard)."""
TIMING_SUFFIX = ".timing.json"
"""The timing record's suffix beside a file output (``<output>.timing.json``)."""
R = TypeVar("R")


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


class ShardIntegrityError(RuntimeError):
    """A finished generation shard whose images do not match their recorded hashes."""


def read_shard_metadata(images_dir, keys) -> list[dict]:
    """The items of a finished generation shard (its metadata.jsonl): ``keys`` of each
    record plus ``image_path`` and ``image_sha256``, verified against the recorded hash; a
    missing or changed image fails the job, naming the command that regenerates the shard."""
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


def timing_path(output: str | os.PathLike) -> Path:
    """Where a model job's timing record is: ``timing.json`` inside a folder output (it
    moves with a generation shard, atomically), ``<output>.timing.json`` beside a file."""
    output = Path(output)
    return (
        output / TIMING_FILE if output.is_dir() else output.with_name(output.name + TIMING_SUFFIX)
    )


def timing_record(
    model: str,
    load_seconds: float | None,
    seconds: float,
    items: int,
    batch_size: int | None = None,
    job_resources: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The one schema of a model job's timing record (docs/outputs.md): ``model``,
    ``load_seconds`` (model load), ``seconds`` (the model's own time for the ``items``,
    load excluded), ``items``, ``seconds_per_item``, ``batch_size`` and the scheduler's
    ``job_resources``; ``extra`` = what one kind of job adds (a shard's per-image seconds)."""
    return {
        "model": model,
        "load_seconds": load_seconds,
        "seconds": seconds,
        "items": items,
        "seconds_per_item": seconds / items if items else None,
        "batch_size": batch_size,
        "job_resources": dict(job_resources or {}),
        **extra,
    }


def read_job_timing(output: str | os.PathLike) -> dict[str, Any] | None:
    """The timing record of a job's ``output`` (:func:`timing_record`'s keys), None where
    the job wrote none. A generation shard of an older stereolens recorded only
    ``images`` and ``seconds_per_image``: its ``items`` and ``seconds`` come from those."""
    import json

    path = timing_path(output)
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if "seconds" not in record and "seconds_per_image" in record:
        per_image = record.get("seconds_per_image") or {}
        record["items"] = int(record.get("images", len(per_image)))
        record["seconds"] = float(sum(per_image.values())) if per_image else None
        record["timed_items"] = len(per_image) if per_image else None
    record.setdefault("timed_items", record["items"])
    return record


@dataclass(frozen=True)
class LoadedModel:
    """What a job's work receives from :meth:`ModelJob.run`."""

    model: Any
    """The loaded backend (a generator, VLM or LLM)."""
    spec: ModelSpec
    """Its registry entry at this attempt's batch size."""
    batch_size: int
    """The batch size it runs at (the backend's own, else the entry's, else 1)."""
    load_seconds: float
    """How long the load took."""
    cache: Any
    """The job's ResponseCache, None without a cache folder."""


@dataclass(frozen=True)
class ModelJob:
    """The plain values a model job takes from its rule (the workflow scripts unpack the
    Snakemake object into one), and the one runner of every generation, extraction, VQA
    and LVLM job (:meth:`run`)."""

    out_path: str
    """The job's output (a generation shard's folder, or a file); its timing record is
    :func:`timing_path` of it."""
    registry_path: str | None = None
    """The model registry (config/models.yaml) the job's model names are looked up in."""
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("stereolens.job"))
    threads: int | None = None
    """torch threads of the job (None = torch's default)."""
    batch_size: int | None = None
    """This attempt's batch size (a retry's is smaller); None = the registry's."""
    resources: Mapping[str, Any] = field(default_factory=dict)
    """The scheduler's resources of the job (mem_mb, gpu, batch_size, threads): logged and
    recorded in the timing record."""
    cache_dir: str | None = None
    """The response cache folder (None = no cache)."""

    def spec(self, model: str | ModelSpec) -> ModelSpec:
        """``model``'s registry entry (a name, looked up in registry_path, or an entry) at
        this attempt's batch size."""
        if isinstance(model, str):
            if self.registry_path is None:
                raise ValueError(f"model {model!r} given by name, but the job has no registry")
            model = load_registry(self.registry_path)[model]
        return model.with_batch_size(self.batch_size)

    def read_shard(
        self, model: str, images_dir: str, keys, read: Callable[[LoadedModel, list[dict]], R]
    ) -> tuple[list[dict], R]:
        """The images of a finished generation shard (:func:`read_shard_metadata` with
        ``keys``) and what ``read(loaded, items)`` makes of them with ``model`` (:meth:`run`,
        timed per image): the body of an extraction or VQA job."""
        items = read_shard_metadata(images_dir, keys)
        self.log.info("%d images", len(items))
        rows = self.run(model, lambda m: read(m, items), what=f"on {images_dir}", items=len(items))
        return items, rows

    def run(
        self,
        model: str | ModelSpec,
        work: Callable[[LoadedModel], R],
        *,
        what: str = "",
        items: int | None = None,
        load: Callable[[ModelSpec], Any] | None = None,
        record: bool = True,
        oom_note: str = "",
    ) -> R:
        """Load ``model`` once (``load``, None = its registry backend), check the injected
        out-of-memory failure, run ``work(loaded)`` and write the timing record (items =
        ``items`` or len(result); ``record=False``: the work writes it). An out-of-memory
        error is logged with the resources and raised, for Snakemake's retry."""
        log = self.log
        spec = self.spec(model)
        if self.resources:
            log.info("job resources: %s", _resources_text(self.resources))
        if spec.backend == "diffusers" or spec.backend.startswith("transformers"):
            limit_threads(self.threads)
        start = time.perf_counter()
        loaded_model = (load or load_model)(spec)
        load_seconds = time.perf_counter() - start
        log.info("%s loaded in %.1f s", spec.name, load_seconds)
        batch = getattr(loaded_model, "batch_size", None) or spec.get("batch_size", 1) or 1
        cache = None
        if self.cache_dir:
            from stereolens.models.ask import ResponseCache

            cache = ResponseCache(self.cache_dir)
        loaded = LoadedModel(loaded_model, spec, int(batch), load_seconds, cache)
        try:
            check_injected_oom(loaded.batch_size, f"{spec.name} {what}".strip())
            start = time.perf_counter()
            result = work(loaded)
        except Exception as exc:
            if isinstance(exc, (MemoryError, out_of_memory_error())):
                log.error(
                    "out of memory at batch size %d (%s); with --retries, Snakemake reruns "
                    "the job with half the batch size and more memory%s",
                    loaded.batch_size,
                    _resources_text(self.resources) or "no resources",
                    oom_note,
                )
            raise
        if record:
            from stereolens.atomic import write_json

            n = items if items is not None else len(result)
            seconds = time.perf_counter() - start
            write_json(
                timing_path(self.out_path),
                timing_record(
                    spec.name, load_seconds, seconds, n, loaded.batch_size, self.resources
                ),
            )
        return result


def _resources_text(resources: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (resources or {}).items())
