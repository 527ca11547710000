"""The blinded annotation form (paper Sec. 4.3, App. D.2): image sets drawn per role x
condition x generator, the self-contained HTML form and its separate key."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from stereolens import annotation_form as af
from stereolens.contextbias.annotation.columns import DEFAULT_DIMENSIONS, QUESTIONS
from stereolens.contextbias.metrics import CONDITIONS
from stereolens.contextbias.schema import AttributeSchema
from stereolens.ids import stable_id


# ============================================================================ export
def _select_images(images: pl.DataFrame, attributes: pl.DataFrame | None) -> pl.DataFrame:
    """One row per usable image: model, role, condition, image_id, image_path.

    An image is usable when every row the images table has for it (one per extractor) has
    status ok. Columns the images table lacks (model, role, condition) come from the
    attributes table by image_id."""
    if "image_id" not in images.columns or "image_path" not in images.columns:
        raise ValueError("images table needs image_id and image_path columns")
    src = images
    if "status" in src.columns:
        bad = src.filter(pl.col("status") != "ok").select("image_id")
        src = src.filter(pl.col("status") == "ok").join(bad, on="image_id", how="anti")
    lacking = [c for c in ("model", "role", "condition") if c not in src.columns]
    if lacking:
        if attributes is None or any(c not in attributes.columns for c in lacking):
            raise ValueError(
                f"images table lacks {lacking}; pass an attributes table that has them"
            )
        lookup = attributes.select("image_id", *lacking).unique(subset="image_id")
        src = src.join(lookup, on="image_id", how="inner")
    cols = ["model", "role", "condition", "image_id", "image_path"]
    out = src.select(cols).unique()
    dup = out.filter(pl.col("image_id").is_duplicated())
    if dup.height:
        raise ValueError(
            f"image {dup['image_id'][0]} has conflicting model/role/condition/path rows "
            "in the images table"
        )
    return out.sort(cols)


def _check_dimensions(
    dimensions: Sequence[str], schema: AttributeSchema
) -> dict[str, tuple[str, ...] | None]:
    vocab = schema.vocabulary()
    unknown = [d for d in dimensions if d not in vocab]
    if unknown:
        raise ValueError(
            f"dimensions {unknown} are not countable dimensions of schema {schema.version}; "
            f"choose from {sorted(vocab)}"
        )
    if len(set(dimensions)) != len(dimensions) or not dimensions:
        raise ValueError(f"dimensions must be distinct and non-empty, got {list(dimensions)}")
    return {d: vocab[d] for d in dimensions}


def export_annotation_sample(
    images: pl.DataFrame,
    attributes: pl.DataFrame | None,
    out_dir: str | os.PathLike,
    roles: Sequence[str] | None = None,
    conditions: Sequence[str] = CONDITIONS,
    generators: Sequence[str] | None = None,
    images_per_set: int = 10,
    dimensions: Sequence[str] | None = None,
    seed: int = 0,
    *,
    n_roles: int | None = None,
    schema: AttributeSchema | None = None,
    image_root: str | os.PathLike | None = None,
    max_side: int | None = 512,
    image_format: str = "jpeg",
    allow_short: bool = False,
) -> dict[str, Path]:
    """Draw a blinded annotation sample and write ``form.html`` and ``key.parquet``.

    One set per role x condition x generator (``model``) with ``images_per_set`` images
    drawn without replacement from the images whose extraction status is ok (paper: 10
    roles x 3 conditions x 4 generators x 10 images). ``roles=None`` takes every role, or
    ``n_roles`` of them drawn at random; ``generators=None`` every model. The draw of each
    set depends only on ``seed`` and its own role/condition/model (adding a role leaves the
    other sets as they were); set order and image order within a set are random.

    Blinding: the form shows no role, condition, prompt, model, image id or path; sets are
    named ``<sample_id>-<position>``, where sample_id is a hash of the whole sample; images
    are re-encoded (which drops embedded metadata such as prompts), downscaled to
    ``max_side`` and inlined. ``key.parquet`` (columns: ``KEY_SCHEMA``) maps sets back and
    is not referenced from the form: keep it away from the annotators.

    A triplet with fewer than ``images_per_set`` usable images is an error unless
    ``allow_short``, which keeps it with the images it has (and drops empty triplets).
    ``attributes`` (optional) supplies model/role/condition when the images table lacks
    them. Relative image paths are resolved against ``image_root`` (default: the current
    directory). Returns {"form": path, "key": path}.
    """
    if images_per_set < 1:
        raise ValueError(f"images_per_set must be at least 1, got {images_per_set}")
    if image_format not in ("jpeg", "png"):
        raise ValueError(f"image_format must be 'jpeg' or 'png', got {image_format!r}")
    schema = schema or AttributeSchema.load()
    dims = tuple(dimensions) if dimensions is not None else DEFAULT_DIMENSIONS
    vocab = _check_dimensions(dims, schema)
    pool = _select_images(images, attributes)

    def chosen(what: str, asked: Sequence[str] | None, available: list[str]) -> list[str]:
        if asked is None:
            return available
        missing = sorted(set(asked) - set(available))
        if missing:
            raise ValueError(
                f"{what} {missing} have no usable (status ok) images; available: {available}"
            )
        return sorted(set(asked))  # the argument order never changes the draw

    all_roles = sorted(pool["role"].unique().to_list())
    if roles is None and n_roles is not None:
        if not 1 <= n_roles <= len(all_roles):
            raise ValueError(f"n_roles must be between 1 and {len(all_roles)}, got {n_roles}")
        rng = np.random.default_rng([seed, int(stable_id("roles"), 16) & 0xFFFFFFFF])
        picked = rng.choice(len(all_roles), size=n_roles, replace=False)
        roles = sorted(all_roles[i] for i in picked)
    role_list = chosen("roles", roles, all_roles)
    cond_list = chosen("conditions", conditions, sorted(pool["condition"].unique().to_list()))
    model_list = chosen("generators", generators, sorted(pool["model"].unique().to_list()))

    groups = {
        k: g
        for k, g in pool.filter(
            pl.col("role").is_in(role_list)
            & pl.col("condition").is_in(cond_list)
            & pl.col("model").is_in(model_list)
        ).group_by(["role", "condition", "model"])
    }
    triplets = [(r, c, m) for r in role_list for c in cond_list for m in model_list]
    short = [
        (t, groups[t].height if t in groups else 0)
        for t in triplets
        if t not in groups or groups[t].height < images_per_set
    ]
    if short and not allow_short:
        listed = ", ".join(f"{r}/{c}/{m} ({n})" for (r, c, m), n in short[:10])
        more = f" and {len(short) - 10} more" if len(short) > 10 else ""
        raise ValueError(
            f"{len(short)} role/condition/generator sets have fewer than {images_per_set} "
            f"usable images: {listed}{more}; lower images_per_set, choose other roles, or "
            "pass allow_short=True"
        )

    drawn = []
    for t in triplets:
        if t not in groups:
            continue
        g = groups[t].sort("image_id")
        rng = np.random.default_rng(int(stable_id("set", seed, *t), 16))
        take = rng.permutation(g.height)[:images_per_set]  # a random subset in random order
        drawn.append((t, g[take.tolist()]))
    if not drawn:
        raise ValueError("no set has any usable image")
    return write_form(
        drawn, dims, vocab, schema, seed, out_dir, images_per_set,
        image_root=image_root, max_side=max_side, image_format=image_format,
    )  # fmt: skip


def write_form(
    drawn: list[tuple[tuple[str, str, str], pl.DataFrame]],
    dims: Sequence[str],
    vocab: dict[str, tuple[str, ...] | None],
    schema: AttributeSchema,
    seed: int,
    out_dir: str | os.PathLike,
    images_per_set: int,
    *,
    image_root: str | os.PathLike | None = None,
    max_side: int | None = 512,
    image_format: str = "jpeg",
) -> dict[str, Path]:
    """Write ``form.html`` and ``key.parquet`` (annotation_form.KEY_SCHEMA) into
    ``out_dir`` for the sets ``drawn``: ((role, condition, model), its images' rows with
    image_id and image_path in the order shown), each asked ``dims``, shown in an order
    drawn from ``seed``, named by a hash of the sample (annotation_form.write_form)."""
    return af.write_form(
        [(cell, g, tuple(dims)) for cell, g in drawn], vocab, schema.version, seed, out_dir,
        images_per_set, titles=QUESTIONS, image_root=image_root, max_side=max_side,
        image_format=image_format,
    )  # fmt: skip
