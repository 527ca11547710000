"""The BiasIG image galleries of the report: per model or variant, the subjects with the
lowest S_imp and S_exp, with sample images and the VQA's answers (:func:`pages`)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from stereolens.report.galleries import Card, GalleryPage, GallerySettings, Group, ImageRef, draw
from stereolens.report.inputs import Inputs

ATTRIBUTES = ("gender", "race", "age")


def _image_files(root: Path, variant: str, atype: str, visibility: str) -> dict[str, str]:
    """image_id -> PNG path of one variant x acquired type x visibility (its shards)."""
    base = root / variant / atype / visibility
    out = {}
    if base.is_dir():
        for shard in base.iterdir():
            if shard.is_dir() and not shard.name.endswith((".partial", ".stale")):
                for png in shard.glob("*.png"):
                    out[png.stem] = str(png)
    return out


def pages(
    inputs: Inputs,
    config: dict,
    settings: GallerySettings,
    implicit: pl.DataFrame,
    explicit: pl.DataFrame,
) -> list[GalleryPage]:
    """One page per model or variant: the ``biasig_subjects`` implicit subjects with the
    lowest S_imp and explicit subjects with the lowest S_exp, ``biasig_per_subject`` images
    each with the VQA's answers."""
    from stereolens.biasig.answers import subject_of

    n_subjects = settings.count("biasig_subjects", 12)
    per_subject = settings.count("biasig_per_subject", 4)
    per_shard = config["biasig"]["prompts_per_shard"]
    prompts = (
        inputs.get("biasig_prompts")
        .with_columns(subject_of(pl.col("text")).alias("subject"))
        # the generation shard of each prompt (stereolens.biasig.jobs: prompts of one type
        # and condition sorted by prompt_id, in blocks of prompts_per_shard)
        .sort("prompt_id")
        .with_columns(
            (pl.int_range(pl.len()).over("acquired_type", "visibility") // per_shard).alias("shard")
        )
    )
    pcols = ["prompt_id", "text", "subject", "acquired_type", "visibility", "protected_value",
             "shard"]  # fmt: skip
    prompts = prompts.select([c for c in pcols if c in prompts.columns])
    chosen = []
    for frame, vis, extra in (
        (implicit, "implicit", pl.col("protected_attribute") == "*"),
        (explicit, "explicit", pl.col("protected_value") != "*"),
    ):
        subj = frame.filter((pl.col("level") == "subject") & extra & pl.col("score").is_not_null())
        if subj.is_empty():
            continue
        low = (
            subj.sort(["variant", "score", "subject"])
            .group_by("variant", maintain_order=True)
            .head(n_subjects)
            .select("variant", "subject", "score", "ci_low", "ci_high", pl.lit(vis).alias("vis"))
        )
        chosen.append(low)
    if not chosen:
        return []
    chosen = pl.concat(chosen).unique(subset=["variant", "subject", "vis"], maintain_order=True)
    wanted = prompts.join(
        chosen.select("subject", "vis").unique(), left_on=["subject", "visibility"],
        right_on=["subject", "vis"], how="semi",
    )  # fmt: skip
    ids = wanted["prompt_id"].to_list()
    answers = (
        inputs.scan("biasig_answers")
        .filter(pl.col("prompt_id").is_in(ids))
        .collect()
        .join(prompts, on="prompt_id", how="inner")
    )
    answers = answers.join(
        chosen.select("variant", "subject", pl.col("vis").alias("visibility")),
        on=["variant", "subject", "visibility"],
        how="semi",
    )
    images = answers.unique(subset=["variant", "image_id"], maintain_order=True)
    sample = draw(
        images,
        ["variant", "subject", "visibility"],
        "image_id",
        per_subject,
        settings.seed,
    )
    by_image: dict[tuple[str, str], list[dict]] = {}
    for a in answers.iter_rows(named=True):
        by_image.setdefault((a["variant"], a["image_id"]), []).append(a)
    answers_path = inputs.path("biasig_answers")
    root = inputs.paths.get("biasig_images") or (
        answers_path.parent / "images" if answers_path is not None else None
    )
    files: dict[tuple[str, str, str], dict[str, str]] = {}
    pages = []
    for (variant,), part in sample.group_by(["variant"], maintain_order=True):
        groups = []
        picked = chosen.filter(pl.col("variant") == variant).sort(
            ["vis", "score"], descending=[True, False]
        )
        for r in picked.iter_rows(named=True):
            g = part.filter(
                (pl.col("subject") == r["subject"]) & (pl.col("visibility") == r["vis"])
            )
            cards = []
            for img in g.iter_rows(named=True):
                k = (variant, img["acquired_type"], img["visibility"])
                path = None
                if root is not None:
                    direct = Path(root, *k, str(img["shard"]), f"{img['image_id']}.png")
                    if direct.exists():
                        path = str(direct)
                    else:  # another sharding than the config says: look in every shard
                        if k not in files:
                            files[k] = _image_files(Path(root), *k)
                        path = files[k].get(img["image_id"])
                pos = sorted(by_image[(variant, img["image_id"])], key=lambda a: a["position"])
                fields = [("prompt", img["text"]), ("image", img["image_id"])]
                said = []
                for a in pos:
                    where = "" if a["position"] == "single" else f"{a['position']}: "
                    said.append(where + ", ".join(str(a.get(x)) for x in ATTRIBUTES))
                    reason = f": {a['reason']}" if a.get("reason") else ""
                    fields.append((f"{a['position']} status", a["status"] + reason))
                    fields.append((f"{a['position']} attempts", str(a.get("attempts"))))
                bad = any(a["status"] != "ok" for a in pos)
                if img["visibility"] == "explicit" and img.get("protected_value"):
                    fields.insert(1, ("asked for", img["protected_value"]))
                cards.append(
                    Card(
                        badge=pos[0]["status"] if len(pos) == 1 else ("partial" if bad else "ok"),
                        headline="; ".join(said),
                        fields=fields,
                        image=ImageRef(path) if path else None,
                        alt=f"{variant}: {img['text']}",
                        css="discarded" if bad else "",
                        details_label="prompt, VQA status",
                    )
                )
            if not cards:
                continue
            score = f"{r['score']:.3f}"
            missing = any(c.image is None for c in cards)
            metric = "S_imp" if r["vis"] == "implicit" else "S_exp"
            groups.append(
                Group(
                    f"{r['vis']}: {r['subject']}",
                    cards,
                    note=f"{metric} {score}; VQA answers: gender, race, age"
                    + ("; image files not found show no thumbnail" if missing else ""),
                )
            )
        pages.append(
            GalleryPage(
                name=f"biasig-{variant}",
                title=f"BiasIG images of {variant}",
                groups=groups,
                paragraphs=[
                    f"Implicit subjects with the lowest S_imp and explicit subjects with the "
                    f"lowest S_exp (up to {n_subjects} each), "
                    f"{per_subject} images each drawn at random (seed "
                    f"{settings.seed}). Under each image: the VQA's gender, race and age of "
                    "the person (left / right for two-person prompts); click for the prompt "
                    "and the answer status."
                ],
                summary=f"{len(groups)} subjects, {sum(len(g.cards) for g in groups)} images",
            )
        )
    return pages
