"""The LVLM audit's user images: the labelled face photos (synthetic, a local folder, or a
Hugging Face dataset exported once) with content hashes, and the balanced per-group sets."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from stereolens.ids import sha256_file
from stereolens.lvlm import groups as G
from stereolens.lvlm.names import groups
from stereolens.validation import ConfigError


def export_hf_images(
    dataset: str,
    out_dir: str | os.PathLike,
    *,
    config_name: str | None = None,
    split: str = "validation",
    revision: str | None = None,
) -> Path:
    """Write a Hugging Face image dataset with gender, race and age columns (FairFace's
    layout: ClassLabel or string values) as ``out_dir/images/*.png`` plus ``labels.csv``.
    Returns the labels.csv path. ``dataset`` may be a hub id or a local dataset folder."""
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(
            "lvlm.user_images.source huggingface needs the `datasets` package: "
            "pip install 'stereolens[lvlm]'"
        ) from exc
    from stereolens.atomic import atomic_path, write_text

    ds = datasets.load_dataset(dataset, config_name, split=split, revision=revision)
    missing = [c for c in ("image", *G.LABEL_COLUMNS) if c not in ds.column_names]
    if missing:
        raise ConfigError(
            f"dataset {dataset} ({config_name}, {split}): missing column(s) "
            f"{', '.join(missing)}; have {', '.join(ds.column_names)}"
        )

    def names(column: str) -> Callable[[Any], str]:
        feature = ds.features[column]
        if hasattr(feature, "int2str"):
            return lambda v: feature.int2str(int(v))
        return str

    decode = {c: names(c) for c in G.LABEL_COLUMNS}
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows = ["file,gender,race,age"]
    for i, row in enumerate(ds):
        file = f"images/{i:06d}.png"
        with atomic_path(out / file, suffix=".png") as tmp:
            row["image"].convert("RGB").save(tmp, format="PNG")
        labels = [decode[c](row[c]) for c in G.LABEL_COLUMNS]
        rows.append(",".join([file, *(f'"{v}"' for v in labels)]))
    header = f"# exported from {dataset} config={config_name} split={split} revision={revision}"
    labels_csv = out / "labels.csv"
    write_text(labels_csv, header + "\n" + "\n".join(rows) + "\n")
    return labels_csv


def user_image_labels(
    folder: str | os.PathLike, labels_csv: str | os.PathLike | None
) -> pl.DataFrame:
    """The labelled image table (see groups.load_labelled_images) with each image's sha256."""
    table = G.load_labelled_images(folder, labels_csv)
    return table.with_columns(
        pl.Series("image_sha256", [sha256_file(p) for p in table["path"]], dtype=pl.String)
    )


def draw_sets(labels: pl.DataFrame, lv: dict[str, Any]) -> tuple[pl.DataFrame, list[str]]:
    """One row per (task, axis, group, image) with its shard, and the shortfall notes: each
    (task, axis) drawn by groups.draw_balanced_sets (images_per_group, the lvlm seed), the k-th
    image of a group in shard k // images_per_shard (shards of all groups hold the same strata)."""
    parts, notes = [], []
    for task, task_cfg in lv["tasks"].items():
        for axis in lv["axes"]:
            draw = G.draw_balanced_sets(
                labels,
                axis,
                int(task_cfg["images_per_group"]),
                seed=int(lv["seed"]),
                groups=groups(lv, axis),
            )
            if draw.shortfall:
                notes.append(f"{task}: {draw.shortfall}")
            per_shard = int(task_cfg["images_per_shard"])
            parts.append(
                draw.images.with_columns(
                    pl.lit(task).alias("task"),
                    (pl.int_range(pl.len()).over("group") // per_shard).alias("shard"),
                )
            )
    table = pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()
    first = ["task", "axis", "group", "shard", "image_id", "file", "path", "stratum"]
    if table.height:
        _check_decodable(table)
    return table.select(*first, pl.exclude(first)), notes


def _check_decodable(table: pl.DataFrame) -> None:
    """Every drawn user photo decodes (each once): a corrupt or unreadable photo is refused
    here, naming the files, before any model is asked about it."""
    from stereolens.images import ImageUnreadable, load_image

    bad = []
    for path in table["path"].unique(maintain_order=True).to_list():
        try:
            load_image(path)
        except (ImageUnreadable, OSError) as exc:
            bad.append(str(exc))
    if bad:
        more = f" ... and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ConfigError(
            f"{len(bad)} drawn user photo(s) cannot be read: {'; '.join(bad[:5])}{more}. "
            "Replace the files, or remove their rows from the labels CSV (the draw then "
            "takes other photos)"
        )
