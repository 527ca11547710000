"""Labelled user images (a folder of face images plus a ``file, gender, race, age`` CSV, FairFace
labels) and balanced per-group sets; age is never a target axis but is matched across groups."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from stereolens.atomic import atomic_path, write_text
from stereolens.ids import stable_id
from stereolens.lvlm.names import AXES, GENDERS, RACES  # noqa: E402
from stereolens.validation import ConfigError

AGES: tuple[str, ...] = (
    "0-2",
    "3-9",
    "10-19",
    "20-29",
    "30-39",
    "40-49",
    "50-59",
    "60-69",
    "more than 70",
)
LABEL_COLUMNS: tuple[str, ...] = ("gender", "race", "age")


def _key(text: str) -> str:
    return " ".join(text.replace("_", " ").replace("-", " ").replace("/", " ").lower().split())


_CANON = {
    "gender": {_key(g): g for g in GENDERS},
    "race": {_key(r): r for r in RACES},
    "age": {_key(a): a for a in AGES},
}


def canonical_label(column: str, value: str) -> str | None:
    """FairFace spelling of a label ("Male" -> "male", "latino-hispanic" -> "Latino_Hispanic"),
    or None when unknown."""
    return _CANON[column].get(_key(str(value)))


def load_labelled_images(
    folder: str | os.PathLike, labels_csv: str | os.PathLike | None = None
) -> pl.DataFrame:
    """Read ``labels_csv`` (default ``folder/labels.csv``): columns image_id (stable_id of the
    file name), file, path (absolute), gender, race, age (FairFace spellings) and any extra;
    ConfigError names missing files, unknown labels or missing columns."""
    folder = Path(folder)
    labels_csv = Path(labels_csv) if labels_csv is not None else folder / "labels.csv"
    if not labels_csv.is_file():
        raise ConfigError(
            f"labels file {labels_csv} not found (expected columns file,gender,race,age)"
        )
    frame = pl.read_csv(labels_csv, comment_prefix="#", infer_schema=False)
    missing_cols = [c for c in ("file", *LABEL_COLUMNS) if c not in frame.columns]
    if missing_cols:
        raise ConfigError(
            f"{labels_csv}: missing column(s) {', '.join(missing_cols)}; "
            f"have {', '.join(frame.columns)}"
        )
    if frame.height == 0:
        raise ConfigError(f"{labels_csv}: no rows")
    dupes = frame.filter(pl.col("file").is_duplicated())["file"].unique().sort().to_list()
    if dupes:
        raise ConfigError(f"{labels_csv}: file listed more than once: {', '.join(dupes[:5])}")
    problems: list[str] = []
    fixed: dict[str, list[str]] = {}
    for column in LABEL_COLUMNS:
        values = []
        for line, (file, raw) in enumerate(zip(frame["file"], frame[column], strict=True)):
            canon = canonical_label(column, raw) if raw is not None else None
            if canon is None:
                allowed = {"gender": GENDERS, "race": RACES, "age": AGES}[column]
                problems.append(
                    f"row {line + 1} ({file}): unknown {column} {raw!r}; "
                    f"allowed: {', '.join(allowed)}"
                )
            values.append(canon)
        fixed[column] = values
    if problems:
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise ConfigError(f"{labels_csv}: unknown labels:\n  " + "\n  ".join(problems[:10]) + more)
    paths = [(folder / f).resolve() for f in frame["file"]]
    absent = [f for f, p in zip(frame["file"], paths, strict=True) if not p.is_file()]
    if absent:
        more = f" ... and {len(absent) - 5} more" if len(absent) > 5 else ""
        raise ConfigError(
            f"{labels_csv}: {len(absent)} image(s) missing under {folder}: "
            f"{', '.join(absent[:5])}{more}"
        )
    return frame.with_columns(
        *(pl.Series(c, fixed[c], dtype=pl.String) for c in LABEL_COLUMNS),
        pl.Series("path", [str(p) for p in paths]),
        pl.Series("image_id", [stable_id("lvlm-image", f) for f in frame["file"]]),
    ).select(
        "image_id",
        "file",
        "path",
        *LABEL_COLUMNS,
        pl.exclude("image_id", "file", "path", *LABEL_COLUMNS),
    )


@dataclass
class BalancedDraw:
    """Result of draw_balanced_sets: ``images`` has the label columns plus axis, group and stratum
    (e.g. "East Asian|20-29"), sorted by group, stratum, file."""

    images: pl.DataFrame
    achieved_per_group: int
    shortfall: str | None = None
    """None when per_group was met; otherwise why not and how many were drawn instead."""


def draw_balanced_sets(
    labels: pl.DataFrame,
    axis: str,
    per_group: int,
    seed: int,
    groups: tuple[str, ...] | None = None,
    strict: bool = False,
) -> BalancedDraw:
    """Draw ``per_group`` images for each group of ``axis`` with the joint distribution of the
    other two labels (the stratum) identical across groups: stratum s gets n_s = per_group m_s
    / M by largest remainder (m_s = min_g a_{g,s} available, M = sum m_s; ties by name), drawn
    without replacement per (group, stratum) from the rows sorted by file, seeded from
    stable_id(seed, axis, group, stratum). When M < per_group every group gets M and
    ``shortfall`` says so (a warning; ``strict`` raises ConfigError)."""
    if axis not in AXES:
        raise ConfigError(f"axis {axis!r} is not one of {', '.join(AXES)}")
    if per_group < 1:
        raise ConfigError(f"per_group must be >= 1, got {per_group}")
    groups = tuple(groups) if groups is not None else AXES[axis]
    match = tuple(c for c in LABEL_COLUMNS if c != axis)
    frame = labels.filter(pl.col(axis).is_in(list(groups))).with_columns(
        pl.concat_str([pl.col(c) for c in match], separator="|").alias("stratum")
    )
    counts = frame.group_by(axis, "stratum").len()
    strata = sorted(frame["stratum"].unique().to_list())
    avail = {(r[axis], r["stratum"]): r["len"] for r in counts.iter_rows(named=True)}
    m = {s: min(avail.get((g, s), 0) for g in groups) for s in strata}
    total = sum(m.values())
    shortfall = None
    if total >= per_group:
        raw = {s: per_group * m[s] / total for s in strata}
        take = {s: int(np.floor(raw[s])) for s in strata}
        left = per_group - sum(take.values())
        for s in sorted(strata, key=lambda s: (-(raw[s] - take[s]), s))[:left]:
            take[s] += 1
        achieved = per_group
    else:
        take = dict(m)
        achieved = total
        empty = [g for g in groups if not any(avail.get((g, s), 0) for s in strata)]
        shortfall = (
            f"axis {axis}: asked for {per_group} images per group but only {total} can be drawn "
            f"with {' x '.join(match)} distributions identical across "
            f"{len(groups)} groups; drew {total} per group"
            + (f" (no images at all for: {', '.join(empty)})" if empty else "")
        )
        if strict:
            raise ConfigError(shortfall)
        warnings.warn(shortfall, stacklevel=2)
    parts = []
    for g in groups:
        for s in strata:
            n = take.get(s, 0)
            if n == 0:
                continue
            cell = frame.filter((pl.col(axis) == g) & (pl.col("stratum") == s)).sort("file")
            rng = np.random.default_rng(int(stable_id("balanced", seed, axis, g, s), 16))
            idx = np.sort(rng.choice(cell.height, size=n, replace=False))
            parts.append(cell[idx.tolist()])
    if parts:
        images = pl.concat(parts)
    else:
        images = frame.clear()
    images = images.with_columns(pl.lit(axis).alias("axis"), pl.col(axis).alias("group")).sort(
        "group", "stratum", "file"
    )
    return BalancedDraw(images=images, achieved_per_group=achieved, shortfall=shortfall)


SYNTHETIC_NOTE = (
    "SYNTHETIC: cartoon faces drawn by stereolens.lvlm.groups.build_synthetic_faces; "
    "the gender/race/age labels are arbitrary cell assignments, not properties of real people. "
    "For pipeline tests only; use FairFace (or your own labelled set) for real audits."
)


def build_synthetic_faces(
    out_dir: str | os.PathLike,
    n_per_cell: int = 1,
    seed: int = 0,
    ages: tuple[str, ...] = ("20-29", "30-39", "50-59"),
    size: int = 64,
) -> Path:
    """Write drawn PNG faces (colours and shapes from a seeded generator, depicting no label) for
    every gender x race x age cell, ``labels.csv`` (a ``#`` line saying the labels are
    synthetic) and ``README.txt``; returns the labels.csv path."""
    from PIL import Image, ImageDraw

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = ["file,gender,race,age,source"]
    for gender in GENDERS:
        for race in RACES:
            for age in ages:
                for k in range(n_per_cell):
                    name = (
                        f"{gender}_{_key(race).replace(' ', '-')}_{age.replace(' ', '-')}_{k}.png"
                    )
                    rng = np.random.default_rng(int(stable_id("synthface", seed, name), 16))
                    bg = tuple(int(x) for x in rng.integers(120, 256, 3))
                    face = tuple(int(x) for x in rng.integers(90, 240, 3))
                    hair = tuple(int(x) for x in rng.integers(0, 120, 3))
                    img = Image.new("RGB", (size, size), bg)
                    d = ImageDraw.Draw(img)
                    w = int(rng.integers(size * 5 // 16, size * 7 // 16))
                    h = int(rng.integers(size * 6 // 16, size * 7 // 16))
                    cx, cy = size // 2, size // 2 + 2
                    d.ellipse([cx - w, cy - h - 6, cx + w, cy + h - 14], fill=hair)
                    d.ellipse([cx - w + 4, cy - h + 2, cx + w - 4, cy + h], fill=face)
                    ey = cy - h // 4
                    for ex in (cx - w // 2, cx + w // 2):
                        d.ellipse([ex - 3, ey - 2, ex + 3, ey + 2], fill=(30, 30, 30))
                    mw = int(rng.integers(4, w // 2 + 5))
                    d.arc(
                        [cx - mw, cy + h // 4, cx + mw, cy + h // 2 + 4],
                        10,
                        170,
                        fill=(120, 30, 30),
                    )
                    with atomic_path(out / name, suffix=".png") as tmp:
                        img.save(tmp, format="PNG")
                    rows.append(f"{name},{gender},{race},{age},synthetic")
    write_text(out / "README.txt", SYNTHETIC_NOTE + "\n")
    labels = out / "labels.csv"
    write_text(labels, f"# {SYNTHETIC_NOTE}\n" + "\n".join(rows) + "\n")
    return labels
