"""The human sample of BiasIG's reader correction, drawn: the stratified images, a blinded form
asking each person's gender, race and age, its template and allocation, and the answers as the
human-label table `biasig correct` reads (docs/statistics.md, "Designing the human sample")."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import polars as pl

from stereolens import annotation_form as af
from stereolens.atomic import read_jsonl, write_parquet, write_text
from stereolens.biasig.answers import scoring_table
from stereolens.biasig.corrected import reader_table
from stereolens.biasig.formulas import POSITIONS
from stereolens.biasig.sample_design import printing_minimum
from stereolens.biasig.truth import ATTRIBUTES, VALUES_BY_ATTRIBUTE
from stereolens.metrics import human_labels as hl
from stereolens.metrics import sample_design as sd

FILES = sd.FORM_FILES
"""What export_reader_sample writes: the form and its key (stereolens.annotation_form), the
human-label template and the allocation (DESIGN_COLUMNS)."""
DESIGN_COLUMNS = (
    "variant", "model", "stratum", "position", "n_items", "disagreement", "n_planned",
    "n_human", "selection_probability", "target_width", "width", "reachable",
)  # fmt: skip
"""design.parquet, one row per planned stratum (generator x scoring unit x person): variant
(the generator), stratum (the correction's "variant|model|<unit>"), n_items (N_h: the unit's
images), n_planned (the allocation's n_h), n_human (the images drawn: the largest n_planned
of the unit's persons), selection_probability (n_human / N_h), width (the planned width of
a label share over the generator's images x persons, for n_planned)."""
VOCABULARY_VERSION = "biasig-vqa-v1"
"""The key's schema_version: the answers are the VQA reader's values (biasig.truth)."""
CANNOT_TELL = "cannot tell"
TITLES = {"gender": "Gender", "race": "Race", "age": "Age"}
SIDES = {"left": "Person on the left", "right": "Person on the right"}


def dimension_of(position: str, attribute: str) -> str:
    """The form's question of a person's attribute: the attribute ("gender") for a
    one-person image, "<position>.<attribute>" ("left.gender") for two."""
    return attribute if position == "single" else f"{position}.{attribute}"


def vocabulary() -> dict[str, tuple[str, ...]]:
    """Every question's closed vocabulary: the VQA reader's values of its attribute."""
    return {dimension_of(p, a): VALUES_BY_ATTRIBUTE[a] for p in POSITIONS for a in ATTRIBUTES}


def titles() -> dict[str, str]:
    out = dict(TITLES)
    for p, side in SIDES.items():
        out.update({dimension_of(p, a): f"{side}: {t.lower()}" for a, t in TITLES.items()})
    return out


def image_files(images: str | os.PathLike | pl.DataFrame) -> pl.DataFrame:
    """(variant, image_id, image_path) of the generated images: ``images`` is a BiasIG
    images folder (its finished shards' metadata.jsonl) or a table (DataFrame, parquet or
    CSV) with image_id, image_path and optionally variant."""
    if isinstance(images, pl.DataFrame) or not Path(images).is_dir():
        table = images if isinstance(images, pl.DataFrame) else _read_table(Path(images))
        missing = [c for c in ("image_id", "image_path") if c not in table.columns]
        if missing:
            raise ValueError(f"images table lacks columns {missing}; it needs image_id, image_path")
        cols = [c for c in ("variant", "image_id", "image_path") if c in table.columns]
        return table.select(cols).unique()
    rows = []
    for meta in sorted(Path(images).glob("*/*/*/*/metadata.jsonl")):
        if meta.parent.name.endswith((".partial", ".stale")):
            continue
        variant = meta.parents[3].name
        for r in read_jsonl(meta):
            rows.append(
                (r.get("model") or variant, r["image_id"], str(meta.parent / r["image_file"]))
            )
    schema = {"variant": pl.String, "image_id": pl.String, "image_path": pl.String}
    return pl.DataFrame(rows, schema=schema, orient="row").unique()


def _read_table(path: Path) -> pl.DataFrame:
    if path.suffix == ".parquet":
        return pl.read_parquet(path)
    if path.suffix in (".csv", ".tsv"):
        sep = "\t" if path.suffix == ".tsv" else ","
        return pl.read_csv(path, separator=sep, infer_schema=False)
    raise ValueError(f"{path}: give the BiasIG images folder or a .parquet / .csv images table")


def reader_images(reader: pl.DataFrame) -> pl.DataFrame:
    """One row per image of the reader table, with the positions of its persons."""
    return (
        reader.select("variant", "model", "unit", "visibility", "stratum", "position", "item_id")
        .unique()
        .with_columns(
            pl.when(pl.col("position") == "single")
            .then(pl.col("item_id"))
            .otherwise(pl.col("item_id").str.replace(r":(left|right)$", ""))
            .alias("image_id")
        )
        .group_by("variant", "model", "unit", "visibility", "stratum", "image_id")
        .agg(pl.col("position").unique().sort().alias("positions"))
        .sort("stratum", "image_id")
    )


def plan_design(
    images: pl.DataFrame,
    target_width: float,
    disagreement: float | pl.DataFrame,
    *,
    allocation: str = "neyman",
    share: float = 0.5,
    ci: float = 0.95,
    minimum: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """The allocation (DESIGN_COLUMNS) over ``images`` (reader_images): per generator x unit
    x person n_h from sample_design.allocate_by_model for ``target_width`` at
    ``disagreement`` (a rate or a (stratum, disagreement) table), raised by ``minimum`` to
    the largest reachable printing minimum; n_human = the largest n_h of its persons."""
    strata = (
        images.explode("positions")
        .rename({"positions": "position"})
        .group_by("variant", "model", "unit", "stratum", "position")
        .agg(pl.len().cast(pl.Int64).alias("n_items"))
    )
    strata = sd.with_disagreement(strata, disagreement, ["stratum"])
    if minimum is not None:
        strata = strata.join(minimum, on=["unit", "position"], how="left")
    strata = strata.with_columns(
        pl.concat_str("stratum", pl.lit("\x1f"), "position").alias("_planned")
    )
    design, summary = sd.allocate_by_model(
        strata.select(
            pl.col("variant").alias("model"), pl.col("_planned").alias("stratum"),
            "n_items", "disagreement",
            *(["minimum", "minimums"] if minimum is not None else []),
        ),
        target_width, share=share, ci=ci, allocation=allocation,
    )  # fmt: skip
    return (
        strata.join(
            design.select(
                pl.col("stratum").alias("_planned"), pl.col("n_human").alias("n_planned")
            ),
            on="_planned",
        )
        .with_columns(pl.col("n_planned").max().over("stratum").alias("n_human"))
        .with_columns(
            (pl.col("n_human") / pl.col("n_items")).alias("selection_probability"),
            *sd.planned_widths(summary, target_width, group="variant"),
        )
        .select(DESIGN_COLUMNS)
        .sort("variant", "stratum", "position")
    )


def export_reader_sample(
    answers: pl.DataFrame,
    prompts: pl.DataFrame,
    images: str | os.PathLike | pl.DataFrame,
    out_dir: str | os.PathLike,
    *,
    target_width: float = 0.05,
    disagreement: float | pl.DataFrame = 0.14,
    allocation: str = "neyman",
    seed: int = 0,
    count: str = "paper",
    scoring_unit: str = "subject",
    share: float = 0.5,
    ci: float = 0.95,
    image_root: str | os.PathLike | None = None,
    max_side: int | None = 512,
    image_format: str = "jpeg",
    eta_variant: str = "paper",
    printable: bool = True,
) -> dict[str, Path]:
    """Draw the human sample of the reader correction and write FILES into ``out_dir``
    (returns their paths): plan_design's allocation over the reader table (``printable``:
    raised to the printing minimums), n_human images drawn without replacement per stratum
    (``seed``), every person of a drawn image labelled (probability n_human / N_h).
    ``images``: image_files'."""
    reader, _ = reader_table(answers, prompts, count=count, scoring_unit=scoring_unit)
    pool = reader_images(reader)
    files = image_files(images)
    on = ["variant", "image_id"] if "variant" in files.columns else ["image_id"]
    pool = pool.join(files, on=on, how="left")
    lost = pool.filter(pl.col("image_path").is_null())
    if lost.height:
        raise ValueError(
            f"{lost.height} images of the answers table have no image file in {images} "
            f"(e.g. {lost['variant'][0]} {lost['image_id'][0]}); the sample is drawn from "
            "every image the reader read: give the images folder the answers were read from"
        )
    least = None
    if printable:
        keys = (
            scoring_table(prompts, scoring_unit)
            .group_by("unit")
            .agg(pl.col("attribute_key").first())
        )
        least = (
            pool.explode("positions")
            .select("unit", "visibility", pl.col("positions").alias("position"))
            .unique()
            .join(keys, on="unit", how="left")
        )
        least = least.select("unit", "position", printing_minimum(prompts, eta_variant, least))
        least = least.with_columns(pl.col("minimums").list.max().alias("minimum"))
    design = plan_design(
        pool, target_width, disagreement, allocation=allocation, share=share, ci=ci,
        minimum=least,
    )  # fmt: skip
    per = design.select("stratum", "n_human").unique()
    sample = sd.draw_sample(pool.select(pl.col("image_id").alias("item_id"), "stratum"), per, seed)
    drawn = pool.join(sample.rename({"item_id": "image_id"}), on=["image_id", "stratum"])
    persons = drawn.explode("positions").rename({"positions": "position"})
    template = sd.label_template(
        persons.select(
            pl.when(pl.col("position") == "single")
            .then(pl.col("image_id"))
            .otherwise(pl.concat_str("image_id", pl.lit(":"), "position"))
            .alias("item_id"),
            "stratum",
            "selection_probability",
        ),
        ATTRIBUTES,
    )
    sets = [
        (
            (r["unit"].replace("\x1f", "/"), r["visibility"], r["variant"]),
            pl.DataFrame({"image_id": [r["image_id"]], "image_path": [r["image_path"]]}),
            [dimension_of(p, a) for p in POSITIONS if p in r["positions"] for a in ATTRIBUTES],
        )
        for r in drawn.sort("stratum", "image_id").iter_rows(named=True)
    ]
    n_questions = sum(len(d) for _, _, d in sets)
    instructions = (
        "Each image below shows one person, or two people side by side. For every question "
        "choose the label that describes the person it asks about (for two people: the "
        "person on the left or on the right as you look at the image), or "
        f"\u201c{CANNOT_TELL}\u201d when the image does not let you tell. Judge only what you "
        f"see. There are {len(sets)} images and {n_questions} questions in total.",
    )
    out = Path(out_dir)
    paths = af.write_form(
        sets, vocabulary(), VOCABULARY_VERSION, seed, out, 1, titles=titles(),
        name="biasig-reader-sample", image_root=image_root, max_side=max_side,
        image_format=image_format, instructions=instructions, unknown_text=CANNOT_TELL,
        ask_prevalence=False,
    )  # fmt: skip
    write_text(out / FILES["template"], template.write_csv())
    write_parquet(out / FILES["design"], design)
    return {**paths, "template": out / FILES["template"], "design": out / FILES["design"]}


def human_labels_from_answers(
    answer_csvs: Iterable[str | os.PathLike],
    key: pl.DataFrame | str | os.PathLike,
    template: pl.DataFrame | str | os.PathLike,
) -> pl.DataFrame:
    """The human-label table (human_labels.HUMAN_COLUMNS) of a filled BiasIG reader-sample
    form: annotation_form.read_answers ("cannot tell" is no label), one consensus label per
    image x person x attribute (annotation_form.human_consensus), stratum and probability
    from the template (annotation_form.fill_template)."""
    key = af.read_key(key)
    multi = key.filter(pl.col("n_images") != 1)
    if multi.height:
        raise ValueError(
            f"annotation key: set {multi['set_id'][0]} shows {multi['n_images'][0]} images; "
            "human labels of BiasIG persons need a reader-sample form (one image per set)"
        )
    if not isinstance(template, pl.DataFrame):
        template = hl.read_human_labels(template)
    answers = af.read_answers(
        answer_csvs, key, vocabulary(), no_answer=af.NO_ANSWER | {CANNOT_TELL}
    )
    consensus = af.human_consensus(answers).join(
        key.select("set_id", pl.col("image_ids").list.first().alias("image_id")), on="set_id"
    )
    split = pl.col("dimension").str.split(".")
    labels = consensus.select(
        "image_id",
        pl.when(split.list.len() == 2).then(split.list.first()).otherwise(pl.lit("single"))
        .alias("position"),
        split.list.last().alias("attribute"),
        pl.col("consensus_label").alias("label"),
    ).select(
        pl.when(pl.col("position") == "single").then(pl.col("image_id"))
        .otherwise(pl.concat_str("image_id", pl.lit(":"), "position")).alias("item_id"),
        "attribute", "label",
    )  # fmt: skip
    template = template.with_columns(
        pl.col("item_id").str.extract(r":(left|right)$").fill_null("single").alias("position")
    )
    return af.fill_template(template, labels, by=("position",))
