"""The ContextBias human annotation study (paper Sec. 4.3 and App. D.2): a blinded annotation
form, and agreement between annotators and with the extraction pipeline.

- :func:`export_annotation_sample` draws image sets (role x condition x generator, N images
  each), hides which is which and writes a self-contained HTML form plus a separate key;
- :func:`read_answers` reads and validates the CSV files the form saves;
- :func:`pipeline_set_labels` gives the pipeline's answer to the same questions;
- :func:`agreement_report` computes raw agreement, pairwise Cohen's kappa, Fleiss' kappa
  with a percentile bootstrap CI, the human consensus and its agreement with the pipeline;
- :func:`write_agreement_tables` writes the report as parquet files.

An *item* is one question about one set: (set_id, dimension). Every answer is a label (a
schema label, a brief descriptor for open vocabularies, or ``unknown`` = not visible) plus a
0-N prevalence slider (how many of the set's N images show that label).

Kappa values come from statsmodels (:func:`statsmodels.stats.inter_rater.cohens_kappa` and
:func:`~statsmodels.stats.inter_rater.fleiss_kappa`); the bootstrap replicates of Fleiss'
kappa use the same formula vectorised over replicates. A kappa is null where it is undefined
(chance agreement 1: every answer used one and the same label).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
import os
from collections.abc import Iterable, Sequence
from itertools import combinations
from pathlib import Path

import numpy as np
import polars as pl

from stereolens.atomic import write_parquet, write_text
from stereolens.contextbias.schema import NOT_LABELS, AttributeSchema
from stereolens.ids import stable_id
from stereolens.paths import resource

CONDITIONS = ("CF", "CA-R", "CA-U")
DEFAULT_DIMENSIONS = (
    "gender_presentation",
    "age_range",
    "skin_tone",
    "hair_color",
    "facial_hair_present",
    "eyewear_present",
    "head_covering_present",
    "framing",
    "clothing_garment",
)
"""Attributes a person can check on a 10-image set at a glance."""

FORM_TEMPLATE = ("contextbias", "annotation_form.v1.html")
UNKNOWN = "unknown"
UNKNOWN_TEXT = "unknown / not visible"
CSV_COLUMNS = ("annotator", "set_id", "dimension", "label", "prevalence")
MAX_DESCRIPTOR_CHARS = 60
ALL = "*"
"""dimension "*" marks the overall rows: items of all dimensions pooled."""
PIPELINE = "pipeline"
CONSENSUS = "consensus"

QUESTIONS = {
    "gender_presentation": "Gender presentation",
    "age_range": "Age range",
    "skin_tone": "Skin tone",
    "hair_color": "Hair colour",
    "facial_hair_present": "Facial hair present?",
    "eyewear_present": "Eyewear present?",
    "head_covering_present": "Head covering present?",
    "framing": "Framing of the shot",
    "clothing_garment": "Most visible garment (brief descriptor)",
}

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
"""key.parquet, one row per set. position = place of the set in the form (1-based);
image_ids / image_paths in the order the form shows them; dimensions = the questions asked
(the same for every set)."""

PAIR_COLUMNS = {
    "dimension": pl.String,
    "kind": pl.String,
    "rater_a": pl.String,
    "rater_b": pl.String,
    "n_items": pl.Int64,
    "agreement": pl.Float64,
    "kappa": pl.Float64,
}
"""agreement_pairs.parquet: one row per dimension ("*" = all pooled) and pair of raters.
kind: human-human (two annotators), human-pipeline (an annotator vs the pipeline),
consensus-pipeline (the human consensus vs the pipeline). n_items = items both answered
(consensus-pipeline: items answered by every annotator); agreement = share of those items
with the same label; kappa = Cohen's kappa (null where undefined)."""

SUMMARY_COLUMNS = {
    "dimension": pl.String,
    "n_items": pl.Int64,
    "n_complete": pl.Int64,
    "n_annotators": pl.Int64,
    "raw_agreement": pl.Float64,
    "mean_pairwise_agreement": pl.Float64,
    "mean_pairwise_kappa": pl.Float64,
    "fleiss_kappa": pl.Float64,
    "fleiss_ci_low": pl.Float64,
    "fleiss_ci_high": pl.Float64,
    "ci_level": pl.Float64,
    "replicates": pl.Int64,
    "valid_replicates": pl.Int64,
    "extractor": pl.String,
    "pipeline_agreement": pl.Float64,
    "pipeline_kappa": pl.Float64,
    "prevalence_mae": pl.Float64,
}
"""agreement_summary.parquet: one row per dimension plus "*" (all items pooled; labels are
kept apart by dimension). n_items = questions in the key (sets x dimensions); n_complete =
items every annotator answered, the items of raw_agreement, Fleiss' kappa and the pipeline
columns. raw_agreement = share of complete items where all annotators chose the same label;
mean_pairwise_agreement / mean_pairwise_kappa = mean over annotator pairs (agreement_pairs,
kind human-human). fleiss_ci_low/high = percentile bootstrap over complete items
(``replicates`` draws, ``valid_replicates`` of them with a defined kappa). extractor = the
pipeline compared; pipeline_agreement / pipeline_kappa = human consensus vs pipeline label;
prevalence_mae = mean |consensus prevalence - pipeline prevalence| over items where the
labels match."""

CONSENSUS_COLUMNS = {
    "set_id": pl.String,
    "position": pl.Int64,
    "role": pl.String,
    "condition": pl.String,
    "model": pl.String,
    "dimension": pl.String,
    "n_images": pl.Int64,
    "n_annotators": pl.Int64,
    "complete": pl.Boolean,
    "consensus_label": pl.String,
    "consensus_votes": pl.Int64,
    "consensus_prevalence": pl.Float64,
    "tie_break": pl.String,
    "extractor": pl.String,
    "pipeline_label": pl.String,
    "pipeline_prevalence": pl.Int64,
    "match": pl.Boolean,
}
"""consensus_vs_pipeline.parquet: one row per item with at least one answer. consensus_label
= majority vote; ties go to the label with the higher mean slider, then alphabetically
(tie_break: none | slider | alphabetical); consensus_prevalence = mean slider of the
annotators who chose the consensus label; complete = every annotator answered the item.
pipeline_label / pipeline_prevalence: see :func:`pipeline_set_labels`."""

ANNOTATOR_COLUMNS = {
    "annotator": pl.String,
    "n_answers": pl.Int64,
    "coverage": pl.Float64,
    "unknown_share": pl.Float64,
    "mean_prevalence": pl.Float64,
}
"""agreement_annotators.parquet (quality control, App. D.2): answers per annotator, the
share of the key's items answered, the share answered unknown, the mean slider."""

TABLE_FILES = {
    "agreement_pairs": "agreement_pairs.parquet",
    "agreement_summary": "agreement_summary.parquet",
    "consensus_vs_pipeline": "consensus_vs_pipeline.parquet",
    "agreement_annotators": "agreement_annotators.parquet",
}


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


def _encode_image(path: Path, max_side: int | None, image_format: str) -> str:
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


def _question_html(
    set_id: str, dimension: str, vocabulary: tuple[str, ...] | None, n_images: int
) -> str:
    esc = html.escape
    title = esc(QUESTIONS.get(dimension, dimension.replace("_", " ").capitalize()))
    if vocabulary:
        options = "".join(
            f'<option value="{esc(v)}">{esc(v.replace("_", " "))}</option>' for v in vocabulary
        )
        field = (
            '<select class="label"><option value="">choose...</option>'
            f'{options}<option value="{UNKNOWN}">{esc(UNKNOWN_TEXT)}</option></select>'
        )
    else:
        field = (
            f'<input class="label" type="text" maxlength="{MAX_DESCRIPTOR_CHARS}" '
            'size="28" placeholder="brief descriptor, or unknown">'
        )
    return (
        f'<fieldset class="item" data-set="{esc(set_id)}" data-dimension="{esc(dimension)}">'
        f"<legend>{title}</legend>"
        f"<label>Label {field}</label>"
        f'<label>Images showing it <input class="prevalence" type="range" min="0" '
        f'max="{n_images}" step="1" value="0"> <output>0</output> of {n_images}</label>'
        "</fieldset>"
    )


def _render_form(
    key: pl.DataFrame,
    encoded: dict[str, list[str]],
    vocab: dict[str, tuple[str, ...] | None],
    images_per_set: int,
) -> str:
    dims = key["dimensions"][0].to_list()
    sections = []
    n_sets = key.height
    for row in key.sort("position").iter_rows(named=True):
        sid = row["set_id"]
        imgs = "".join(
            f'<img src="{url}" alt="image {i} of set {row["position"]}">'
            for i, url in enumerate(encoded[sid], start=1)
        )
        questions = "".join(_question_html(sid, d, vocab[d], row["n_images"]) for d in dims)
        sections.append(
            f'<section class="set" id="set-{html.escape(sid)}">'
            f'<h2>Set {row["position"]} of {n_sets} <span class="sid">{html.escape(sid)}</span>'
            f'</h2><div class="images">{imgs}</div><div class="questions">{questions}</div>'
            "</section>"
        )
    template = resource(*FORM_TEMPLATE).read_text(encoding="utf-8")
    values = {
        "{{SAMPLE_ID}}": html.escape(key["sample_id"][0]),
        "{{IMAGES_PER_SET}}": str(images_per_set),
        "{{N_SETS}}": str(n_sets),
        "{{N_ITEMS}}": str(n_sets * len(dims)),
        "{{SETS}}": "\n".join(sections),
    }
    for marker, value in values.items():
        template = template.replace(marker, value)
    return template


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
    order = np.random.default_rng(seed).permutation(len(drawn))
    drawn = [drawn[i] for i in order]
    sample_id = stable_id(
        "contextbias-annotation", seed, *(i for _, g in drawn for i in g["image_id"]), length=8
    )
    width = max(3, len(str(len(drawn))))
    root = Path(image_root) if image_root is not None else Path.cwd()
    rows, encoded = [], {}
    for pos, ((role, cond, model), g) in enumerate(drawn, start=1):
        set_id = f"{sample_id}-{pos:0{width}d}"
        paths = g["image_path"].to_list()
        urls = []
        for image_id, p in zip(g["image_id"], paths, strict=True):
            path = Path(p) if Path(p).is_absolute() else root / p
            if not path.is_file():
                raise FileNotFoundError(f"image {image_id}: file {path} does not exist")
            urls.append(_encode_image(path, max_side, image_format))
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
                "schema_version": schema.version,
                "seed": seed,
            }
        )
    key = pl.DataFrame(rows, schema=KEY_SCHEMA)
    form = _render_form(key, encoded, vocab, images_per_set)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(out / "key.parquet", key)
    write_text(out / "form.html", form)
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


def _key_dimensions(key: pl.DataFrame) -> list[str]:
    return list(dict.fromkeys(d for ds in key["dimensions"].to_list() for d in ds))


def _normalise(text: str) -> str:
    return " ".join(str(text).strip().lower().split())


def normalise_label(text: str, vocabulary: tuple[str, ...] | None) -> str | None:
    """A human answer as a label: lower-cased, whitespace collapsed; unknown, none, not
    visible and "unknown / not visible" become ``unknown``. For a closed vocabulary spaces
    may stand for underscores ("young adult"); returns None when the label is not in it."""
    label = _normalise(text)
    if label in NOT_LABELS or label in ("not visible", UNKNOWN_TEXT, "n/a"):
        return UNKNOWN
    if vocabulary is None:
        return label
    if label in vocabulary:
        return label
    underscored = label.replace(" ", "_")
    return underscored if underscored in vocabulary else None


def read_answers(
    answer_csvs: Iterable[str | os.PathLike],
    key: pl.DataFrame | str | os.PathLike,
    schema: AttributeSchema | None = None,
    max_errors: int = 20,
) -> pl.DataFrame:
    """The answer CSVs as one table (annotator, set_id, dimension, label, prevalence,
    source, row), validated against the key.

    Every problem names the file, the row (line number, header = 1) and the column: missing
    columns, an empty annotator, a set id not in the key, a dimension not asked, a label
    outside the dimension's vocabulary or a descriptor longer than 60 characters, a
    prevalence that is not a number from 0 to the set's image count, and the same
    annotator answering one item twice. All problems (up to ``max_errors`` listed) are
    raised together as one ValueError."""
    key = read_key(key)
    schema = schema or AttributeSchema.load()
    vocab = schema.vocabulary()
    n_images = dict(zip(key["set_id"].to_list(), key["n_images"].to_list(), strict=True))
    dims = set(_key_dimensions(key))
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
                label = None
                if dimension in dims:
                    if not raw_label.strip():
                        bad("label", f"empty; write {UNKNOWN!r} for not visible")
                        ok = False
                    else:
                        label = normalise_label(raw_label, vocab.get(dimension))
                        if label is None:
                            bad(
                                "label",
                                f"{raw_label!r} is not a {dimension} label; allowed: "
                                f"{', '.join(vocab[dimension])}, {UNKNOWN}",
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


# ============================================================================ pipeline
def pipeline_set_labels(
    key: pl.DataFrame | str | os.PathLike, attributes: pl.DataFrame
) -> pl.DataFrame:
    """The pipeline's answer per set and dimension, from the long attributes table.

    pipeline_label = the label carried by the most images of the set (a label counts once
    per image); ties go to the alphabetically first label (pipeline_tie marks them).
    pipeline_prevalence = the number of the set's images with that label. When no image of
    the set has a countable label for the dimension the answer is ``unknown`` with
    prevalence = n_images (every image is unknown), matching the form's "unknown / not
    visible". n_labelled = images with any label for the dimension.

    Columns: (extractor,) set_id, dimension, n_images, n_labelled, pipeline_label,
    pipeline_prevalence, pipeline_tie; extractor when the attributes table has one (every
    extractor answers every set). Use the canonical labels for open vocabularies by
    passing a table whose ``label`` column holds them."""
    key = read_key(key)
    need = [c for c in ("image_id", "dimension", "label") if c not in attributes.columns]
    if need:
        raise ValueError(f"attributes table lacks columns {need}")
    dims = _key_dimensions(key)
    ext = ["extractor"] if "extractor" in attributes.columns else []
    members = (
        key.select("set_id", "n_images", pl.col("image_ids").alias("image_id"))
        .explode("image_id")
        .drop_nulls("image_id")
    )
    attr = (
        attributes.filter(
            pl.col("dimension").is_in(dims)
            & pl.col("label").is_not_null()
            & ~pl.col("label").str.to_lowercase().str.strip_chars().is_in(list(NOT_LABELS))
        )
        .select(*ext, "image_id", "dimension", "label")
        .unique()
    )
    if not attributes.join(members.select("image_id").unique(), on="image_id", how="semi").height:
        raise ValueError(
            "the attributes table has no rows for any image of the annotation sample; "
            "is it the table the sample was drawn from?"
        )
    joined = members.join(attr, on="image_id", how="inner")
    group = [*ext, "set_id", "dimension"]
    counts = joined.group_by([*group, "label"]).agg(pl.col("image_id").n_unique().alias("n"))
    best = (
        counts.sort([*group, "n", "label"], descending=[False] * len(group) + [True, False])
        .group_by(group, maintain_order=True)
        .agg(
            pl.col("label").first().alias("pipeline_label"),
            pl.col("n").first().alias("pipeline_prevalence"),
            (pl.col("n") == pl.col("n").max()).sum().gt(1).alias("pipeline_tie"),
        )
    )
    labelled = joined.group_by(group).agg(pl.col("image_id").n_unique().alias("n_labelled"))
    grid = key.select("set_id", "n_images").join(
        pl.DataFrame({"dimension": dims}, schema={"dimension": pl.String}), how="cross"
    )
    if ext:
        extractors = attributes.select("extractor").unique().sort("extractor")
        grid = extractors.join(grid, how="cross")
    out = (
        grid.join(best, on=group, how="left")
        .join(labelled, on=group, how="left")
        .with_columns(
            pl.col("n_labelled").fill_null(0).cast(pl.Int64),
            pl.col("pipeline_label").fill_null(UNKNOWN),
            pl.col("pipeline_prevalence").fill_null(pl.col("n_images")).cast(pl.Int64),
            pl.col("pipeline_tie").fill_null(False),
        )
    )
    return out.select(
        *ext,
        "set_id",
        "dimension",
        "n_images",
        "n_labelled",
        "pipeline_label",
        "pipeline_prevalence",
        "pipeline_tie",
    ).sort(group)


# ============================================================================ statistics
def _statsmodels():
    try:
        from statsmodels.stats import inter_rater
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the agreement report needs statsmodels: pip install 'statsmodels>=0.14,<1'"
        ) from exc
    return inter_rater


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> tuple[float, float | None]:
    """(observed agreement, Cohen's kappa) of two raters' labels on the same items.

    Kappa from statsmodels' cohens_kappa on the square contingency table; None where it is
    undefined (chance agreement 1, i.e. both raters used one and the same label)."""
    a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError("cohen_kappa needs two equally long, non-empty label sequences")
    cats, codes = np.unique(np.concatenate([a, b]).astype(str), return_inverse=True)
    ia, ib = codes[: a.size], codes[a.size :]
    table = np.zeros((cats.size, cats.size))
    np.add.at(table, (ia, ib), 1)
    agreement = float(np.trace(table) / a.size)
    expected = float(table.sum(1) @ table.sum(0)) / a.size**2
    if expected >= 1.0 - 1e-12:
        return agreement, None
    return agreement, float(_statsmodels().cohens_kappa(table, return_results=False))


def fleiss_table(labels: np.ndarray) -> np.ndarray:
    """Items x categories counts from an items x raters array of labels."""
    labels = np.asarray(labels, dtype=object).astype(str)
    _, codes = np.unique(labels, return_inverse=True)
    codes = codes.reshape(labels.shape)
    k = int(codes.max()) + 1
    counts = np.zeros((labels.shape[0], k))
    np.add.at(counts, (np.repeat(np.arange(labels.shape[0]), labels.shape[1]), codes.ravel()), 1)
    return counts


def fleiss_kappa(counts: np.ndarray) -> float | None:
    """Fleiss' kappa of an items x categories count table (equal raters per item), from
    statsmodels; None where undefined (one category only)."""
    counts = np.asarray(counts, dtype=float)
    p = counts.sum(0) / counts.sum()
    if float(p @ p) >= 1.0 - 1e-12:
        return None
    return float(_statsmodels().fleiss_kappa(counts, method="fleiss"))


def fleiss_kappa_weighted(counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Fleiss' kappa for many reweightings of the items at once.

    ``weights`` (replicates x items) says how often each item enters a replicate (a
    bootstrap draw); a row of ones gives the plain Fleiss' kappa. NaN where undefined.
    Same formula as statsmodels: P_i = (sum_j n_ij^2 - m) / (m (m - 1)), P = mean P_i,
    p_j = sum_i n_ij / (N m), P_e = sum_j p_j^2, kappa = (P - P_e) / (1 - P_e)."""
    counts = np.asarray(counts, dtype=float)
    weights = np.atleast_2d(np.asarray(weights, dtype=float))
    m = counts[0].sum()
    if m < 2 or not np.allclose(counts.sum(1), m):
        raise ValueError("Fleiss' kappa needs the same number (>= 2) of ratings per item")
    total = weights.sum(1)
    p_item = ((counts**2).sum(1) - m) / (m * (m - 1))
    p_bar = weights @ p_item / total
    p_cat = (weights @ counts) / (total * m)[:, None]
    p_e = (p_cat**2).sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = (p_bar - p_e) / (1.0 - p_e)
    return np.where(p_e >= 1.0 - 1e-12, np.nan, kappa)


def bootstrap_fleiss(
    counts: np.ndarray, replicates: int, rng: np.random.Generator, level: float = 0.95
) -> tuple[float | None, float | None, int]:
    """Percentile bootstrap CI of Fleiss' kappa over items: (low, high, valid replicates).
    All replicates at once: each is a row of item multiplicities."""
    n = counts.shape[0]
    if replicates < 1 or n == 0:
        return None, None, 0
    draws = rng.integers(0, n, size=(replicates, n))
    flat = (draws + (np.arange(replicates) * n)[:, None]).ravel()
    weights = np.bincount(flat, minlength=replicates * n).reshape(replicates, n)
    kappas = fleiss_kappa_weighted(counts, weights)
    valid = kappas[np.isfinite(kappas)]
    if valid.size == 0:
        return None, None, 0
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(valid, [tail, 100 - tail])
    return float(low), float(high), int(valid.size)


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


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def agreement_report(
    answer_csvs: Iterable[str | os.PathLike],
    key: pl.DataFrame | str | os.PathLike,
    attributes: pl.DataFrame,
    replicates: int = 1000,
    seed: int = 0,
    *,
    extractor: str | None = None,
    schema: AttributeSchema | None = None,
    ci_level: float = 0.95,
) -> dict[str, pl.DataFrame]:
    """Inter-annotator agreement and human consensus vs pipeline (paper Sec. 4.3).

    Returns {"agreement_pairs", "agreement_summary", "consensus_vs_pipeline",
    "agreement_annotators"} with the columns of PAIR_COLUMNS, SUMMARY_COLUMNS,
    CONSENSUS_COLUMNS and ANNOTATOR_COLUMNS. Per dimension and overall ("*", items of all
    dimensions pooled, labels kept apart by dimension).

    Items answered by only some annotators count for the pairs that answered them; raw
    agreement, Fleiss' kappa (needs equal raters per item) and the pipeline comparison use
    the complete items. The Fleiss CI is a percentile bootstrap over items with
    ``replicates`` draws, seeded per dimension from ``seed`` (the CI of one dimension does
    not depend on which others are present). With several extractors in the attributes
    table, name the one to compare with ``extractor``.

    Open-vocabulary answers are compared as normalised text (lower case, single spaces):
    free descriptors rarely match canonical labels word for word, so their agreement is a
    lower bound."""
    if not 0 < ci_level < 1:
        raise ValueError(f"ci_level must be between 0 and 1, got {ci_level}")
    key = read_key(key)
    answers = read_answers(answer_csvs, key, schema)
    annotators = sorted(answers["annotator"].unique().to_list())
    if len(annotators) < 2:
        raise ValueError(f"agreement needs at least two annotators, got {annotators}")
    if "extractor" in attributes.columns:
        present = sorted(attributes["extractor"].unique().to_list())
        if extractor is None:
            if len(present) > 1:
                raise ValueError(f"the attributes table has extractors {present}; pass extractor=")
            extractor = present[0] if present else None
        elif extractor not in present:
            raise ValueError(f"extractor {extractor!r} is not in the attributes table {present}")
        attributes = attributes.filter(pl.col("extractor") == extractor).drop("extractor")
    pipeline = pipeline_set_labels(key, attributes)
    dims = _key_dimensions(key)
    item = ["set_id", "dimension"]

    # one column per annotator, named "@name" so that no name collides with other columns
    col = {a: f"@{a}" for a in annotators}
    wide = (
        answers.with_columns(("@" + pl.col("annotator")).alias("annotator"))
        .pivot(on="annotator", index=item, values="label")
        .sort(item)
    )
    consensus = human_consensus(answers)
    merged = (
        consensus.join(pipeline, on=item, how="left")
        .join(
            key.select(
                "set_id",
                *(c for c in ("position", "role", "condition", "model") if c in key.columns),
            ),
            on="set_id",
            how="left",
        )
        .with_columns(
            (pl.col("n_annotators") == len(annotators)).alias("complete"),
            (pl.col("consensus_label") == pl.col("pipeline_label")).alias("match"),
            pl.lit(extractor, pl.String).alias("extractor"),
        )
    )
    for c in ("position", "role", "condition", "model"):
        if c not in merged.columns:
            merged = merged.with_columns(pl.lit(None, CONSENSUS_COLUMNS[c]).alias(c))
    merged = merged.select([pl.col(c).cast(t) for c, t in CONSENSUS_COLUMNS.items()]).sort(
        ["position", "set_id", "dimension"]
    )
    wide = wide.join(merged.select(*item, "pipeline_label", "consensus_label"), on=item)

    pair_rows, summary_rows = [], []
    for dim in [*dims, ALL]:
        sub = wide if dim == ALL else wide.filter(pl.col("dimension") == dim)

        # labels kept apart by dimension, so pooled categories never mix dimensions
        def coded(column: str, sub: pl.DataFrame = sub) -> np.ndarray:
            return np.array(
                [
                    None if v is None else f"{d}\x1f{v}"
                    for d, v in zip(sub["dimension"], sub[column], strict=True)
                ],
                dtype=object,
            )

        labels = {a: coded(col[a]) for a in annotators}
        pipe = coded("pipeline_label")
        cons = coded("consensus_label")
        human_pairs = []
        for a, b in combinations(annotators, 2):
            both = np.array(
                [x is not None and y is not None for x, y in zip(labels[a], labels[b], strict=True)]
            )
            agreement, kappa = (
                cohen_kappa(labels[a][both], labels[b][both]) if both.any() else (None, None)
            )
            human_pairs.append((agreement, kappa))
            pair_rows.append((dim, "human-human", a, b, int(both.sum()), agreement, kappa))
        for a in annotators:
            has = np.array([x is not None for x in labels[a]])
            agreement, kappa = cohen_kappa(labels[a][has], pipe[has]) if has.any() else (None, None)
            pair_rows.append((dim, "human-pipeline", a, PIPELINE, int(has.sum()), agreement, kappa))

        matrix = np.column_stack([labels[a] for a in annotators])
        complete = np.array([all(x is not None for x in row) for row in matrix], dtype=bool)
        n_complete = int(complete.sum())
        raw = fleiss = low = high = None
        valid = 0
        p_agree = p_kappa = mae = None
        if n_complete:
            full = matrix[complete]
            raw = float(np.mean([len(set(row)) == 1 for row in full]))
            counts = fleiss_table(full)
            fleiss = fleiss_kappa(counts)
            rng = np.random.default_rng([seed, int(stable_id("fleiss", dim), 16) & 0xFFFFFFFF])
            low, high, valid = bootstrap_fleiss(counts, replicates, rng, ci_level)
            p_agree, p_kappa = cohen_kappa(cons[complete], pipe[complete])
            sel = merged.filter(pl.col("complete") & pl.col("match"))
            if dim != ALL:
                sel = sel.filter(pl.col("dimension") == dim)
            if sel.height:
                mae = float((sel["consensus_prevalence"] - sel["pipeline_prevalence"]).abs().mean())
        pair_rows.append(
            (dim, "consensus-pipeline", CONSENSUS, PIPELINE, n_complete, p_agree, p_kappa)
        )
        summary_rows.append(
            {
                "dimension": dim,
                "n_items": key.height * (len(dims) if dim == ALL else 1),
                "n_complete": n_complete,
                "n_annotators": len(annotators),
                "raw_agreement": raw,
                "mean_pairwise_agreement": _mean(x for x, _ in human_pairs),
                "mean_pairwise_kappa": _mean(k for _, k in human_pairs),
                "fleiss_kappa": fleiss,
                "fleiss_ci_low": low,
                "fleiss_ci_high": high,
                "ci_level": ci_level,
                "replicates": replicates,
                "valid_replicates": valid,
                "extractor": extractor,
                "pipeline_agreement": p_agree,
                "pipeline_kappa": p_kappa,
                "prevalence_mae": mae,
            }
        )

    pairs = pl.DataFrame(
        [dict(zip(PAIR_COLUMNS, r, strict=True)) for r in pair_rows], schema=PAIR_COLUMNS
    ).with_columns(pl.col("agreement", "kappa").fill_nan(None))
    summary = pl.DataFrame(summary_rows, schema=SUMMARY_COLUMNS)
    n_key_items = key.height * len(dims)
    per_annotator = (
        answers.group_by("annotator")
        .agg(
            pl.len().cast(pl.Int64).alias("n_answers"),
            (pl.col("label") == UNKNOWN).mean().alias("unknown_share"),
            pl.col("prevalence").mean().alias("mean_prevalence"),
        )
        .with_columns((pl.col("n_answers") / n_key_items).alias("coverage"))
        .select(list(ANNOTATOR_COLUMNS))
        .sort("annotator")
    )
    return {
        "agreement_pairs": pairs,
        "agreement_summary": summary,
        "consensus_vs_pipeline": merged,
        "agreement_annotators": per_annotator,
    }


def write_agreement_tables(
    report: dict[str, pl.DataFrame], out_dir: str | os.PathLike
) -> dict[str, Path]:
    """Write the tables of :func:`agreement_report` as parquet, each atomically:
    agreement_pairs, agreement_summary, consensus_vs_pipeline, agreement_annotators."""
    missing = [name for name in TABLE_FILES if name not in report]
    if missing:
        raise ValueError(f"report lacks tables {missing}")
    out = Path(out_dir)
    paths = {}
    for name, file in TABLE_FILES.items():
        write_parquet(out / file, report[name])
        paths[name] = out / file
    return paths
