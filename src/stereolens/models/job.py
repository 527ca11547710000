"""A model job, whatever the benchmark: load once, threads, the injected out-of-memory check,
memory resources, a finished shard's verified items and the job's timing file
(docs/architecture.md, "Inside a model job")."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from stereolens.models.registry import ModelSpec, load_model

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


def log_job_resources(log: logging.Logger, resources: dict[str, Any] | None) -> None:
    """Log a job's scheduler resources (:func:`job_resources`), if it has any."""
    if resources:
        log.info("job resources: %s", ", ".join(f"{k}={v}" for k, v in resources.items()))


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


def write_job_timing(
    out_path: str | os.PathLike, model: str, load_seconds: float, seconds: float, items: int
) -> None:
    """A model job's own timing beside its output (``<output>.timing.json``): model load
    seconds, work seconds after the load, items and seconds per item. The report's
    measured-throughput table reads these (stereolens.throughput)."""
    from stereolens.atomic import write_json

    write_json(
        f"{out_path}.timing.json",
        {
            "model": model,
            "load_seconds": round(load_seconds, 3),
            "seconds": round(seconds, 3),
            "items": items,
            "seconds_per_item": round(seconds / items, 6) if items else None,
        },
    )


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
