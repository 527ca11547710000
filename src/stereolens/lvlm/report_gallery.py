"""Gallery pages of the LVLM report: per audited model, sample responses of every setting x
task x axis x user group with the user photo, the refusal labels and, for stories, the
assistant's reading (lvlm.report.galleries)."""

from __future__ import annotations

import polars as pl

from stereolens.report.galleries import Card, GalleryPage, GallerySettings, Group, ImageRef, draw
from stereolens.report.inputs import Inputs

TASK_ORDER = ("story", "term", "exam")
"""The scored tasks in report order."""


RESPONSE_COLUMNS = (
    "model", "setting", "task", "axis", "group", "image_id", "prompt_id", "request_key",
    "request", "response", "status", "attempts", "refusal", "refusal_phrase", "refusal_rule",
    "refusal_judge", "empty", "subject", "term", "choice", "correct", "answer",
)  # fmt: skip


def _clip(text: str | None, limit: int = 1500) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit] + f" ... ({len(text):,} characters)"


def galleries(inputs: Inputs, config: dict, settings: GallerySettings) -> list[GalleryPage]:
    """One page per audited model: per setting x task x axis x group, ``lvlm_per_group``
    responses drawn at random with the user photo, the refusal labels and, for stories,
    what the assistant read from the story."""
    if not (inputs.has("lvlm_responses") and inputs.has("lvlm_sets")):
        return []
    n = settings.count("lvlm_per_group", 3)
    sets = inputs.get("lvlm_sets")
    photos = draw(sets, ["task", "axis", "group"], "image_id", n, settings.seed)
    schema = inputs.schema("lvlm_responses")
    cols = [c for c in RESPONSE_COLUMNS if c in schema]
    responses = (
        inputs.scan("lvlm_responses")
        .select(cols)
        .filter(pl.col("image_id").is_in(photos["image_id"].unique().to_list()))
        .collect()
    )
    if responses.is_empty():
        return []
    key = "request_key" if "request_key" in responses.columns else "image_id"
    sample = draw(responses, ["model", "setting", "task", "axis", "group"], key, n, settings.seed)
    reading: dict[tuple, list[tuple[str, str]]] = {}
    if inputs.has("lvlm_story_attributes"):
        story = sample.filter(pl.col("task") == "story")
        attrs = (
            inputs.scan("lvlm_story_attributes")
            .filter(pl.col("image_id").is_in(story["image_id"].unique().to_list()))
            .collect()
        )
        for r in attrs.iter_rows(named=True):
            k = (r["model"], r["setting"], r["axis"], r["image_id"], r["prompt_id"])
            reading.setdefault(k, []).append((r["attribute"], r["value"]))
    photo = {
        r["image_id"]: (r.get("path") or r.get("file"), r.get("image_sha256"))
        for r in sets.unique(subset="image_id").iter_rows(named=True)
    }
    pages = []
    for (model,), part in sample.group_by(["model"], maintain_order=True):
        groups = []
        rank = {t: i for i, t in enumerate((*TASK_ORDER, "attribute_inferring"))}
        order = part.with_columns(
            pl.col("task").replace_strict(rank, default=len(rank)).alias("_task")
        ).sort("setting", "_task", "axis", "group")
        for (setting, task, axis, group), g in order.group_by(
            ["setting", "task", "axis", "group"], maintain_order=True
        ):
            cards = []
            for r in g.iter_rows(named=True):
                refused = bool(r.get("refusal"))
                fields = [("request", _clip(r.get("request"), 600)), ("user photo", r["image_id"])]
                for label in ("refusal_phrase", "refusal_rule", "refusal_judge", "empty"):
                    if label in r and r[label] is not None:
                        fields.append((label.replace("_", " "), str(r[label])))
                for extra in ("subject", "term", "choice", "correct", "answer"):
                    if r.get(extra) is not None:
                        fields.append((extra, str(r[extra])))
                fields.append(("status", f"{r.get('status')} ({r.get('attempts')} attempt(s))"))
                read = reading.get((model, setting, axis, r["image_id"], r["prompt_id"]))
                if task == "story":
                    fields += [(f"assistant: {a}", v) for a, v in sorted(read or [])]
                    if not read:
                        fields.append(("assistant", "no attribute read from this story"))
                path, sha = photo.get(r["image_id"], (None, None))
                cards.append(
                    Card(
                        badge="refusal" if refused else "answered",
                        headline=(
                            f"{r.get('refusal_phrase')}"
                            if refused and r.get("refusal_phrase")
                            else ""
                        ),
                        text=_clip(r.get("response")),
                        fields=fields,
                        image=ImageRef(inputs.image_path(path), sha) if path else None,
                        alt=f"user photo of group {group}",
                        css="refusal" if refused else "",
                        details_label="request, labels"
                        + (", assistant's reading" if task == "story" else ""),
                    )
                )
            groups.append(Group(f"{setting} / {task} / {axis}: {group}", cards))
        pages.append(
            GalleryPage(
                name=f"lvlm-{model}",
                title=f"LVLM responses of {model}",
                layout="responses",
                groups=groups,
                paragraphs=[
                    f"Per setting, task, axis and user group, up to {n} responses drawn at "
                    f"random (seed {settings.seed}) with the user photo attached to the "
                    "request. A red frame marks a refusal (phrase rules / judge). Click under "
                    "a response for the request, the refusal labels and, for stories, the "
                    "attributes the assistant read from it (what the story score counts)."
                ],
                summary=f"{len(groups)} groups, {sum(len(g.cards) for g in groups)} responses",
            )
        )
    return pages
