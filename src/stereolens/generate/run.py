"""Run one generation shard: images, thumbnails, metadata and timing into a folder, atomically
and resumably (the shard's layout: docs/architecture.md, "Inside a model job"). Imports
neither torch nor diffusers: the generator is passed in."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from stereolens.atomic import write_bytes, write_json, write_jsonl
from stereolens.ids import sha256_bytes, sha256_file
from stereolens.models.backends.prompt_tokens import QUIRK as PROMPT_TRUNCATED
from stereolens.models.job import TIMING_FILE, timing_record
from stereolens.models.requests import GenerationItem, Generator
from stereolens.thumbnails import (
    DEFAULT_PX,
    DEFAULT_QUALITY,
    SHARD_DIR,
    make_thumbnail,
    shard_thumbnail,
    shard_thumbnail_path,
)

METADATA_FILE = "metadata.jsonl"
PARTIAL_SUFFIX = ".partial"

# Keys of a metadata row that the runner fills; item.extra may not use them.
RESERVED_KEYS = (
    "image_id",
    "prompt_id",
    "seed",
    "model",
    "revision",
    "settings",
    "prompt",
    "image_file",
    "image_sha256",
    "width",
    "height",
    "seconds",
    "prompt_truncation",
    "quirks",
)

_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_RESERVED_IDS = {Path(TIMING_FILE).stem}


def partial_dir(out_dir: str | os.PathLike) -> Path:
    """Where a shard is built before it is moved onto ``out_dir``."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + PARTIAL_SUFFIX)


def _canonical(obj: Any) -> Any:
    """What ``obj`` looks like after a JSON round trip (tuples -> lists, ...)."""
    return json.loads(json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str))


def _validate(items: list[GenerationItem], model_name: str, batch_size: int) -> None:
    if not model_name:
        raise ValueError("generate_shard: model_name is empty")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"generate_shard: batch_size must be a positive integer, not {batch_size!r}"
        )
    if not items:
        raise ValueError(f"generate_shard: no items to generate for model {model_name!r}")
    seen: set[str] = set()
    dupes: list[str] = []
    for k, item in enumerate(items):
        if not isinstance(item, GenerationItem):
            raise TypeError(
                f"generate_shard: items[{k}] is a {type(item).__name__}, not a GenerationItem"
            )
        iid = item.image_id
        if not isinstance(iid, str) or not _ID_PATTERN.match(iid) or iid in _RESERVED_IDS:
            raise ValueError(
                f"generate_shard: items[{k}].image_id {iid!r} cannot be a file name; use "
                "letters, digits, '.', '_' and '-' (and not 'timing')"
            )
        if iid in seen:
            dupes.append(iid)
        seen.add(iid)
        if not isinstance(item.seed, int) or isinstance(item.seed, bool):
            raise ValueError(f"generate_shard: items[{k}].seed must be an int, not {item.seed!r}")
        clash = sorted(set(item.extra) & set(RESERVED_KEYS))
        if clash:
            raise ValueError(
                f"generate_shard: items[{k}] ({iid}) has extra key(s) {clash} that clash with "
                f"metadata keys the runner writes ({', '.join(RESERVED_KEYS)})"
            )
    if dupes:
        shown = ", ".join(sorted(set(dupes))[:10])
        raise ValueError(
            f"generate_shard: {len(dupes)} duplicate image_id(s) among {len(items)} items: {shown}"
        )


def _png_bytes(image: Any) -> bytes:
    if not hasattr(image, "save"):
        raise TypeError(f"generator returned a {type(image).__name__}, not a PIL image")
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _finished_row(partial: Path, expected: dict[str, Any]) -> dict[str, Any] | None:
    """The sidecar row of a finished image in ``partial``, or None if it must be redone."""
    png = partial / expected["image_file"]
    side = partial / f"{expected['image_id']}.json"
    if not (png.is_file() and side.is_file()):
        return None
    try:
        row = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(row, dict):
        return None
    if any(row.get(k) != v for k, v in expected.items()):
        return None
    if row.get("image_sha256") != sha256_file(png):
        return None
    return row


def generate_shard(
    generator: Generator,
    items: list[GenerationItem],
    out_dir: str | os.PathLike,
    model_name: str,
    batch_size: int | None = None,
    log: Callable[[str], Any] = print,
    load_seconds: float | None = None,
    timing_extra: dict[str, Any] | None = None,
) -> list[dict]:
    """Make every item's image into ``out_dir``; return the metadata rows (item order).
    ``batch_size``: items per ``generator.generate`` call (None: the generator's own, else
    1); ``load_seconds`` and ``timing_extra`` go into timing.json (docs/architecture.md)."""
    started = time.perf_counter()
    items = list(items)
    if batch_size is None:
        batch_size = int(getattr(generator, "batch_size", 1) or 1)
    _validate(items, model_name, batch_size)

    out_dir = Path(out_dir)
    partial = partial_dir(out_dir)
    partial.mkdir(parents=True, exist_ok=True)
    for stray in [*partial.glob(".*.tmp"), *partial.glob(f"{SHARD_DIR}/.*.tmp")]:
        stray.unlink()  # temporary files of a killed write

    settings = _canonical(generator.settings())
    revision = settings.get("revision") if isinstance(settings, dict) else None

    def expected_row(item: GenerationItem) -> dict[str, Any]:
        return {
            "image_id": item.image_id,
            "prompt_id": item.prompt_id,
            "seed": item.seed,
            "model": model_name,
            "revision": revision,
            "settings": settings,
            "prompt": item.text,
            "image_file": f"{item.image_id}.png",
            **_canonical(dict(item.extra)),
        }

    expected = {item.image_id: expected_row(item) for item in items}
    done: dict[str, dict[str, Any]] = {}
    for item in items:
        row = _finished_row(partial, expected[item.image_id])
        if row is not None:
            done[item.image_id] = row
            png = partial / row["image_file"]
            if shard_thumbnail(png, DEFAULT_PX, DEFAULT_QUALITY, row["image_sha256"]) is None:
                make_thumbnail(
                    png, shard_thumbnail_path(png), DEFAULT_PX, DEFAULT_QUALITY,
                    row["image_sha256"],
                )  # fmt: skip
    todo = [item for item in items if item.image_id not in done]
    if done:
        log(
            f"{model_name}: {len(done)} of {len(items)} images already finished in {partial}; "
            f"making the other {len(todo)}"
        )

    def truncation(texts: list[str]) -> list[list[dict[str, Any]]]:
        check = getattr(generator, "prompt_truncation", None)
        return list(check(texts)) if check is not None else [[] for _ in texts]

    generation_seconds = 0.0
    with tqdm(
        total=len(items), initial=len(done), desc=model_name, unit="img", file=sys.stderr
    ) as bar:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            t0 = time.perf_counter()
            texts = [it.text for it in chunk]
            images = list(generator.generate(texts, [it.seed for it in chunk]))
            elapsed = time.perf_counter() - t0
            cuts = truncation(texts)
            generation_seconds += elapsed
            if len(images) != len(chunk):
                raise RuntimeError(
                    f"{model_name}: generator returned {len(images)} images for "
                    f"{len(chunk)} prompts"
                )
            for item, image, cut in zip(chunk, images, cuts, strict=True):
                data = _png_bytes(image)
                width, height = image.size
                row = {
                    **expected[item.image_id],
                    "image_sha256": sha256_bytes(data),
                    "width": int(width),
                    "height": int(height),
                    "seconds": elapsed / len(chunk),
                }
                if cut:
                    row.update(prompt_truncation=cut, quirks=[PROMPT_TRUNCATED])
                    log(
                        f"{model_name}: the prompt of {item.image_id} was cut: "
                        + "; ".join(
                            f"{c['encoder']} kept {c['kept']} of {c['tokens']} tokens" for c in cut
                        )
                    )
                png = partial / row["image_file"]
                write_bytes(png, data)
                make_thumbnail(
                    image, shard_thumbnail_path(png), DEFAULT_PX, DEFAULT_QUALITY,
                    row["image_sha256"],
                )  # fmt: skip
                write_json(partial / f"{item.image_id}.json", row)
                done[item.image_id] = row
            bar.update(len(chunk))

    rows = [done[item.image_id] for item in items]
    keep = {METADATA_FILE, TIMING_FILE, SHARD_DIR}
    thumbs = set()
    for row in rows:
        keep.update((row["image_file"], f"{row['image_id']}.json"))
        thumbs.add(shard_thumbnail_path(row["image_file"]).name)
    for path in [*partial.iterdir(), *(partial / SHARD_DIR).iterdir()]:
        # leftovers of an earlier run with other items (thumbs/ holds files only)
        wanted = keep if path.parent == partial else thumbs
        if path.name not in wanted or path.is_dir() != (path == partial / SHARD_DIR):
            shutil.rmtree(path) if path.is_dir() else path.unlink()

    write_jsonl(partial / METADATA_FILE, rows)
    per_image = {row["image_id"]: row["seconds"] for row in rows}
    extra = {
        "images": len(rows),
        "generated_this_run": len(todo),
        "reused_from_partial": len(items) - len(todo),
        "generation_seconds_this_run": generation_seconds,
        "total_seconds_this_run": time.perf_counter() - started,
        "mean_seconds_per_image": sum(per_image.values()) / len(per_image),
        "seconds_per_image": per_image,
        "prompts_truncated": sum(bool(row.get("prompt_truncation")) for row in rows),
        **(timing_extra or {}),
    }
    record = timing_record(
        model_name, load_seconds, sum(per_image.values()), len(rows), batch_size, **extra
    )
    write_json(partial / TIMING_FILE, record)

    # Move into place. An old out_dir is first renamed away (one atomic step) so that
    # out_dir never holds a mix of old and new files.
    if out_dir.is_dir() and not out_dir.is_symlink():
        stale = out_dir.with_name(out_dir.name + ".stale")
        if stale.exists():
            shutil.rmtree(stale)
        os.replace(out_dir, stale)
        shutil.rmtree(stale)
    elif out_dir.exists() or out_dir.is_symlink():
        out_dir.unlink()
    os.replace(partial, out_dir)
    for row in rows:  # the per-image sidecars only served resumption
        (out_dir / f"{row['image_id']}.json").unlink(missing_ok=True)
    log(f"{model_name}: wrote {len(rows)} images and {METADATA_FILE} to {out_dir}")
    return rows
