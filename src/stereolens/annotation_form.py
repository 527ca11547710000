"""The blinded annotation form every benchmark's human labels are collected with (one HTML page, a
separate key) and its answers read back: the CSV's reader and the annotators' consensus per
question (docs/architecture.md, "Layout")."""

from __future__ import annotations

import base64
import csv
import io
import math
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from stereolens.atomic import write_parquet, write_text
from stereolens.ids import stable_id
from stereolens.metrics.human_labels import HUMAN_COLUMNS, NO_LABEL, check_human_labels
from stereolens.paths import resource

FORM_TEMPLATE = ("annotation", "annotation_form.v1.html.j2")
UNKNOWN = "unknown"
UNKNOWN_TEXT = "unknown / not visible"
CSV_COLUMNS = ("annotator", "set_id", "dimension", "label", "prevalence")
MAX_DESCRIPTOR_CHARS = 60
NO_ANSWER = frozenset({*NO_LABEL, "not visible", UNKNOWN_TEXT, "n/a"})
"""Answers read as ``unknown`` (after lower-casing and collapsing whitespace)."""

KEY_SCHEMA = {
    "set_id": pl.String,
    "position": pl.Int64,
    "sample_id": pl.String,
    "role": pl.String,
    "condition": pl.String,
    "model": pl.String,
    "n_images": pl.Int64,
    "image_ids": pl.List(pl.String),
    "image_paths": pl.List(pl.String),
    "dimensions": pl.List(pl.String),
    "schema_version": pl.String,
    "seed": pl.Int64,
}
"""key.parquet, one row per set: position in the form (1-based), image_ids / image_paths as
shown, the dimensions asked, the cell it was drawn from (role, condition, model) and the
vocabulary's schema_version."""


# ============================================================================ the form
def encode_image(path: Path, max_side: int | None, image_format: str) -> str:
    """A data: URL of the re-encoded image. Re-encoding always happens: it drops PNG text
    chunks and EXIF, where generators store prompts and model names."""
    from stereolens.images import load_image

    image = load_image(path, max_side)
    buf = io.BytesIO()
    if image_format == "jpeg":
        image.save(buf, format="JPEG", quality=85)
        mime = "image/jpeg"
    else:
        image.save(buf, format="PNG")
        mime = "image/png"
    return f"data:{mime};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def render_form(
    key: pl.DataFrame,
    encoded: dict[str, list[str]],
    vocab: Mapping[str, tuple[str, ...] | None],
    images_per_set: int,
    titles: Mapping[str, str],
    *,
    instructions: Sequence[str] = (),
    unknown_text: str = UNKNOWN_TEXT,
    ask_prevalence: bool = True,
) -> str:
    """The form (FORM_TEMPLATE) with the sets in their shown order, their inlined images and
    one question per dimension (``titles``, ``vocab``: closed vocabulary or None for free
    text). ``instructions``: the paragraphs above the sets; without ``ask_prevalence`` no
    "images showing it" slider is shown."""
    from stereolens.templating import render_template

    def questions(dims: Sequence[str]) -> list[dict]:
        return [
            {
                "dimension": d,
                "title": titles.get(d, d.replace("_", " ").capitalize()),
                "vocabulary": vocab[d],
            }
            for d in dims
        ]

    sets = [
        {
            "set_id": row["set_id"],
            "position": row["position"],
            "n_images": row["n_images"],
            "images": encoded[row["set_id"]],
            "questions": questions(row["dimensions"]),
        }
        for row in key.sort("position").iter_rows(named=True)
    ]
    template = resource(*FORM_TEMPLATE)
    return render_template(
        template.name,
        template.parent,
        sample_id=key["sample_id"][0],
        images_per_set=images_per_set,
        n_items=sum(len(s["questions"]) for s in sets),
        sets=sets,
        instructions=list(instructions),
        ask_prevalence=ask_prevalence,
        unknown=UNKNOWN,
        unknown_text=unknown_text,
        max_chars=MAX_DESCRIPTOR_CHARS,
    )


def write_form(
    drawn: list[tuple[tuple[str, str, str], pl.DataFrame, Sequence[str]]],
    vocab: Mapping[str, tuple[str, ...] | None],
    version: str,
    seed: int,
    out_dir: str | os.PathLike,
    images_per_set: int,
    *,
    titles: Mapping[str, str],
    name: str = "contextbias-annotation",
    image_root: str | os.PathLike | None = None,
    max_side: int | None = 512,
    image_format: str = "jpeg",
    **form: object,
) -> dict[str, Path]:
    """Write ``form.html`` and ``key.parquet`` (KEY_SCHEMA) into ``out_dir`` for the sets
    ``drawn`` ((role, condition, model), image rows, dimensions), in an order drawn from
    ``seed``; ``version``: the key's schema_version; ``form``: render_form's options."""
    order = np.random.default_rng(seed).permutation(len(drawn))
    drawn = [drawn[i] for i in order]
    sample_id = stable_id(name, seed, *(i for _, g, _ in drawn for i in g["image_id"]), length=8)
    width = max(3, len(str(len(drawn))))
    root = Path(image_root) if image_root is not None else Path.cwd()
    rows, encoded = [], {}
    for pos, ((role, cond, model), g, dims) in enumerate(drawn, start=1):
        set_id = f"{sample_id}-{pos:0{width}d}"
        paths = g["image_path"].to_list()
        urls = []
        for image_id, p in zip(g["image_id"], paths, strict=True):
            path = Path(p) if Path(p).is_absolute() else root / p
            if not path.is_file():
                raise FileNotFoundError(f"image {image_id}: file {path} does not exist")
            urls.append(encode_image(path, max_side, image_format))
        encoded[set_id] = urls
        rows.append(
            {
                "set_id": set_id,
                "position": pos,
                "sample_id": sample_id,
                "role": role,
                "condition": cond,
                "model": model,
                "n_images": g.height,
                "image_ids": g["image_id"].to_list(),
                "image_paths": paths,
                "dimensions": list(dims),
                "schema_version": version,
                "seed": seed,
            }
        )
    key = pl.DataFrame(rows, schema=KEY_SCHEMA)
    html = render_form(key, encoded, vocab, images_per_set, titles, **form)  # type: ignore[arg-type]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(out / "key.parquet", key)
    write_text(out / "form.html", html)
    return {"form": out / "form.html", "key": out / "key.parquet"}


# ============================================================================ answers
def read_key(key: pl.DataFrame | str | os.PathLike) -> pl.DataFrame:
    """The key (a DataFrame or the path of key.parquet), checked."""
    frame = key if isinstance(key, pl.DataFrame) else pl.read_parquet(key)
    missing = [c for c in ("set_id", "n_images", "image_ids", "dimensions") if c not in frame]
    if missing:
        raise ValueError(f"annotation key lacks columns {missing}; is it a key.parquet?")
    if frame.height == 0:
        raise ValueError("annotation key has no sets")
    if frame["set_id"].is_duplicated().any():
        raise ValueError("annotation key has duplicate set ids")
    return frame


def key_dimensions(key: pl.DataFrame) -> list[str]:
    """The dimensions the key's sets ask, in order of first appearance."""
    return list(dict.fromkeys(d for ds in key["dimensions"].to_list() for d in ds))


def _normalise(text: str) -> str:
    return " ".join(str(text).strip().lower().split())


def normalise_label(
    text: str, vocabulary: tuple[str, ...] | None, no_answer: Collection[str] = NO_ANSWER
) -> str | None:
    """A human answer as a label: lower-cased, whitespace collapsed, ``no_answer`` spellings
    as ``unknown``; in a closed vocabulary (case-blind, spaces for underscores) its own
    spelling, None when not in it."""
    label = _normalise(text)
    if label in no_answer:
        return UNKNOWN
    if vocabulary is None:
        return label
    spelled = {v.lower(): v for v in vocabulary}
    for candidate in (label, label.replace(" ", "_")):
        if candidate in spelled:
            return spelled[candidate]
    return None


def read_answers(
    answer_csvs: Iterable[str | os.PathLike],
    key: pl.DataFrame | str | os.PathLike,
    vocab: Mapping[str, tuple[str, ...] | None],
    max_errors: int = 20,
    no_answer: Collection[str] = NO_ANSWER,
) -> pl.DataFrame:
    """The answer CSVs as one table (annotator, set_id, dimension, label, prevalence,
    source, row), validated against the key; ``vocab``: each asked dimension's closed
    vocabulary (None: a free-text descriptor). All problems, each naming file, row and
    column (up to ``max_errors`` listed), are raised together as one ValueError."""
    key = read_key(key)
    n_images = dict(zip(key["set_id"].to_list(), key["n_images"].to_list(), strict=True))
    dims = set(key_dimensions(key))
    asked = dict(zip(key["set_id"].to_list(), map(set, key["dimensions"].to_list()), strict=True))
    errors: list[str] = []
    rows: list[dict] = []
    seen: dict[tuple[str, str, str], str] = {}
    paths = [Path(p) for p in answer_csvs]
    if not paths:
        raise ValueError("no answer files given")
    for path in paths:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = [(h or "").strip() for h in (reader.fieldnames or [])]
            missing = [c for c in CSV_COLUMNS if c not in header]
            if missing:
                errors.append(
                    f"{path}: missing columns {missing} (header {header}); "
                    f"expected {', '.join(CSV_COLUMNS)}"
                )
                continue
            reader.fieldnames = header
            n_rows = 0
            for rec in reader:
                n_rows += 1
                where = f"{path}, row {reader.line_num}"

                def bad(column: str, problem: str, where: str = where) -> None:
                    errors.append(f"{where}, column '{column}': {problem}")

                annotator = (rec.get("annotator") or "").strip()
                set_id = (rec.get("set_id") or "").strip()
                dimension = (rec.get("dimension") or "").strip()
                raw_label = rec.get("label") or ""
                raw_prev = (rec.get("prevalence") or "").strip()
                ok = True
                if not annotator:
                    bad("annotator", "empty")
                    ok = False
                if set_id not in n_images:
                    bad("set_id", f"unknown set id {set_id!r} (not in this sample's key)")
                    ok = False
                if dimension not in dims:
                    bad("dimension", f"{dimension!r} was not asked; asked: {sorted(dims)}")
                    ok = False
                elif set_id in asked and dimension not in asked[set_id]:
                    bad("dimension", f"{dimension!r} was not asked of set {set_id}")
                    ok = False
                label = None
                if dimension in dims:
                    if not raw_label.strip():
                        bad("label", f"empty; write {UNKNOWN!r} for not visible")
                        ok = False
                    else:
                        label = normalise_label(raw_label, vocab.get(dimension), no_answer)
                        if label is None:
                            bad(
                                "label",
                                f"{raw_label!r} is not a {dimension} label; allowed: "
                                f"{', '.join(vocab[dimension] or ())}, {UNKNOWN}",
                            )
                            ok = False
                        elif len(label) > MAX_DESCRIPTOR_CHARS:
                            bad("label", f"longer than {MAX_DESCRIPTOR_CHARS} characters")
                            ok = False
                try:
                    prevalence = float(raw_prev)
                    if not math.isfinite(prevalence):
                        raise ValueError
                except ValueError:
                    bad("prevalence", f"{raw_prev!r} is not a number")
                    ok = False
                else:
                    top = n_images.get(set_id, 10)
                    if not 0 <= prevalence <= top:
                        bad("prevalence", f"{raw_prev} is outside 0-{top}")
                        ok = False
                if not ok:
                    continue
                item = (annotator, set_id, dimension)
                if item in seen:
                    bad(
                        "set_id", f"{annotator} answered {set_id}/{dimension} before ({seen[item]})"
                    )
                    continue
                seen[item] = where
                rows.append(
                    {
                        "annotator": annotator,
                        "set_id": set_id,
                        "dimension": dimension,
                        "label": label,
                        "prevalence": prevalence,
                        "source": str(path),
                        "row": reader.line_num,
                    }
                )
            if n_rows == 0:
                errors.append(f"{path}: no answers (only a header)")
    if errors:
        shown = "\n  ".join(errors[:max_errors])
        more = f"\n  ... and {len(errors) - max_errors} more" if len(errors) > max_errors else ""
        raise ValueError(f"{len(errors)} problems in the answer files:\n  {shown}{more}")
    return pl.DataFrame(
        rows,
        schema={
            "annotator": pl.String,
            "set_id": pl.String,
            "dimension": pl.String,
            "label": pl.String,
            "prevalence": pl.Float64,
            "source": pl.String,
            "row": pl.Int64,
        },
    )


def human_consensus(answers: pl.DataFrame) -> pl.DataFrame:
    """Majority label per item (set_id, dimension); ties go to the label with the higher
    mean slider, then alphabetically. Columns: set_id, dimension, n_annotators,
    consensus_label, consensus_votes, consensus_prevalence (mean slider of the annotators
    who chose it), tie_break (none | slider | alphabetical)."""
    item = ["set_id", "dimension"]
    per_label = answers.group_by([*item, "label"]).agg(
        pl.len().cast(pl.Int64).alias("votes"), pl.col("prevalence").mean().alias("slider")
    )
    ranked = per_label.sort(
        [*item, "votes", "slider", "label"], descending=[False, False, True, True, False]
    )
    top = (
        ranked.with_columns(
            (pl.col("votes") == pl.col("votes").max().over(item)).alias("_top"),
        )
        .group_by(item, maintain_order=True)
        .agg(
            pl.col("label").first().alias("consensus_label"),
            pl.col("votes").first().alias("consensus_votes"),
            pl.col("slider").first().alias("consensus_prevalence"),
            pl.col("_top").sum().alias("_n_top"),
            (pl.col("slider").filter(pl.col("_top")) == pl.col("slider").first())
            .sum()
            .alias("_n_top_slider"),
        )
    )
    n_ann = answers.group_by(item).agg(pl.col("annotator").n_unique().cast(pl.Int64).alias("n"))
    return (
        top.join(n_ann, on=item)
        .with_columns(
            pl.when(pl.col("_n_top") == 1)
            .then(pl.lit("none"))
            .when(pl.col("_n_top_slider") == 1)
            .then(pl.lit("slider"))
            .otherwise(pl.lit("alphabetical"))
            .alias("tie_break")
        )
        .select(
            *item,
            pl.col("n").alias("n_annotators"),
            "consensus_label",
            "consensus_votes",
            "consensus_prevalence",
            "tie_break",
        )
        .sort(item)
    )


def fill_template(
    template: pl.DataFrame, labels: pl.DataFrame, by: Sequence[str] = ()
) -> pl.DataFrame:
    """The human-label table (HUMAN_COLUMNS) of a reader sample: ``template`` filled with
    ``labels`` (item_id, attribute, label). Unanswered item x attributes are left out; an
    item with no answer leaves the sample, its stratum's (within it, its ``by`` group's)
    selection probability becoming answered / N_h. A label the template lacks is an
    error."""
    template = template.select(*HUMAN_COLUMNS, *by).cast(HUMAN_COLUMNS)
    stray = labels.join(template, on=["item_id", "attribute"], how="anti")
    if stray.height:
        raise ValueError(
            f"answers: item {stray['item_id'][0]!r} ({stray['attribute'][0]}) is not in the "
            "template; is it the template written with this form?"
        )
    filled = template.drop("label").join(
        labels.select("item_id", "attribute", "label"), on=["item_id", "attribute"]
    )
    group = ["stratum", *by]
    sizes = (
        template.group_by(group)
        .agg(
            (pl.col("item_id").n_unique() / pl.col("selection_probability").first())
            .round(0)
            .alias("_n_stratum")
        )
        .join(
            filled.group_by(group).agg(pl.col("item_id").n_unique().alias("_answered")),
            on=group,
        )
    )
    out = (
        filled.join(sizes, on=group)
        .with_columns((pl.col("_answered") / pl.col("_n_stratum")).alias("selection_probability"))
        .select(list(HUMAN_COLUMNS))
        .sort("stratum", "item_id", "attribute", "label")
    )
    return check_human_labels(out, "human labels from the answers")
