"""The ContextBias image galleries of the report: one page per generator, per role x
condition a random draw of images with their prompt, seed, extraction status and the
attributes each extractor read (raw label -> canonical label).
"""

from __future__ import annotations

import polars as pl

from stereolens.contextbias.metrics import CONDITIONS
from stereolens.report.galleries import Card, GalleryPage, GallerySettings, Group, ImageRef, draw
from stereolens.report.inputs import Inputs


def _attribute_lines(attrs: pl.DataFrame) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(image_id, extractor) -> [(dimension, labels)], canonical labels after an arrow."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    if attrs.is_empty():
        return out
    if "extractor" not in attrs.columns:
        attrs = attrs.with_columns(pl.lit("").alias("extractor"))
    text = pl.col("label")
    if "canonical_label" in attrs.columns:
        text = (
            pl.when(pl.col("canonical_label").is_not_null() & (pl.col("canonical_label") != text))
            .then(text + " -> " + pl.col("canonical_label"))
            .otherwise(text)
        )
    lines = (
        attrs.with_columns(text.alias("_text"))
        .sort("image_id", "extractor", "dimension", "label")
        .group_by("image_id", "extractor", "dimension", maintain_order=True)
        .agg(pl.col("_text").str.join(", "))
    )
    for image_id, ext, dim, labels in lines.iter_rows():
        out.setdefault((image_id, ext or ""), []).append((dim, labels))
    return out


def galleries(inputs: Inputs, config: dict, settings: GallerySettings) -> list[GalleryPage]:
    """One page per generator: per role x condition, ``contextbias_per_set`` images drawn
    at random (discarded ones included at their rate), each with its prompt, seed,
    extraction status per extractor (with the reason when discarded) and its attributes."""
    images = inputs.get("images")
    if images is None or images.is_empty() or "image_path" not in images.columns:
        return []
    n = settings.count("contextbias_per_set", 4)
    one = images.unique(subset="image_id", keep="first", maintain_order=True)
    sample = draw(one, ["model", "role", "condition"], "image_id", n, settings.seed)
    ids = sample["image_id"].to_list()
    status = images.filter(pl.col("image_id").is_in(ids))
    attrs = pl.DataFrame()
    scan = inputs.scan("attributes")
    if scan is not None:
        cols = [c for c in ("image_id", "extractor", "dimension", "label", "canonical_label")
                if c in inputs.schema("attributes")]  # fmt: skip
        attrs = scan.select(cols).filter(pl.col("image_id").is_in(ids)).collect()
    lines = _attribute_lines(attrs)
    prompts = inputs.get("prompts")
    text = (
        dict(zip(prompts["prompt_id"].to_list(), prompts["text"].to_list(), strict=True))
        if prompts is not None and "text" in prompts.columns
        else {}
    )
    totals = {
        (m, r, c): k for m, r, c, k in one.group_by("model", "role", "condition").len().iter_rows()
    }
    by_image: dict[str, list[dict]] = {}
    for r in status.iter_rows(named=True):
        by_image.setdefault(r["image_id"], []).append(r)
    order = {c: i for i, c in enumerate(CONDITIONS)}
    sample = sample.with_columns(
        pl.col("condition").replace_strict(order, default=len(order)).alias("_order")
    ).sort("model", "role", "_order", maintain_order=True)
    pages = []
    for (model,), part in sample.group_by(["model"], maintain_order=True):
        groups = []
        for (role, cond), g in part.group_by(["role", "condition"], maintain_order=True):
            cards = []
            for r in g.iter_rows(named=True):
                recs = by_image.get(r["image_id"], [r])
                bad = [x for x in recs if x.get("status") != "ok"]
                fields = [
                    ("prompt", text.get(r.get("prompt_id"), "")),
                    ("seed", str(r.get("seed"))),
                    ("image", str(r["image_id"])),
                ]
                for x in recs:
                    ext = x.get("extractor") or ""
                    state = x.get("status") or ""
                    if state != "ok" and x.get("reason"):
                        state += f": {x['reason']}"
                    fields.append((f"{ext} status".strip(), state))
                    fields += [
                        (f"{ext} {d}".strip(), v) for d, v in lines.get((r["image_id"], ext), [])
                    ]
                headline = f"seed {r.get('seed')}"
                if bad:
                    reason = bad[0].get("reason") or ""
                    headline += f": {reason[:140]}" + ("..." if len(reason) > 140 else "")
                cards.append(
                    Card(
                        badge="discarded" if bad else "ok",
                        headline=headline,
                        fields=fields,
                        image=ImageRef(inputs.image_path(r["image_path"]), r.get("image_sha256")),
                        alt=f"{model} {role} {cond} seed {r.get('seed')}",
                        css="discarded" if bad else "",
                        details_label="prompt, attributes",
                    )
                )
            total = totals.get((model, role, cond), len(cards))
            groups.append(Group(f"{role} / {cond}", cards, note=f"{len(cards)} of {total} images"))
        n_bad = sum(c.badge == "discarded" for g in groups for c in g.cards)
        pages.append(
            GalleryPage(
                name=f"contextbias-{model}",
                title=f"ContextBias images of {model}",
                groups=groups,
                paragraphs=[
                    f"Per role and condition, up to {n} images drawn at random (stable seed "
                    f"{settings.seed}); discarded images appear at their rate, with the reason. "
                    "Click 'prompt, attributes' under an image for its prompt, seed and what "
                    "each extractor read from it (raw label -> canonical label)."
                ],
                summary=f"{len(groups)} role x condition sets, {sum(len(g.cards) for g in groups)} "
                f"images ({n_bad} discarded)",
            )
        )
    return pages
