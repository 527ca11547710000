"""The human sample of ContextBias's reader correction: its strata, the labels a target width
needs (`stereolens plan`), the draw as a blinded form with its template, and the answers as the
human-label table `contextbias correct` reads (docs/statistics.md, "Designing the human sample")."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from stereolens.annotation_form import fill_template, human_consensus, read_key
from stereolens.atomic import write_parquet, write_text
from stereolens.contextbias.annotation.answers import read_answers
from stereolens.contextbias.annotation.columns import DEFAULT_DIMENSIONS
from stereolens.contextbias.annotation.form import _check_dimensions, _select_images, write_form
from stereolens.contextbias.corrected import reader_table
from stereolens.contextbias.corrected_rule import printing_minimums
from stereolens.contextbias.metrics import CONDITIONS, use_label_column
from stereolens.contextbias.schema import AttributeSchema
from stereolens.metrics import human_labels as hl
from stereolens.metrics import sample_design as sd
from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE

FILES = sd.FORM_FILES
"""What export_reader_sample writes into its folder: the form and its key (the annotation
form's own contract, one image per set), the human-label template (HUMAN_COLUMNS, label
empty) and the allocation per stratum (sample_design.DESIGN_COLUMNS + model, target_width,
width, reachable)."""


def export_reader_sample(
    images: pl.DataFrame,
    attributes: pl.DataFrame,
    out_dir: str | os.PathLike,
    *,
    target_width: float = 0.05,
    disagreement: float | pl.DataFrame = 0.14,
    allocation: str = "neyman",
    share: float = 0.5,
    ci: float = 0.95,
    dimensions: Sequence[str] | None = None,
    seed: int = 0,
    schema: AttributeSchema | None = None,
    image_root: str | os.PathLike | None = None,
    max_side: int | None = 512,
    image_format: str = "jpeg",
    minimum: int | None = MIN_HUMAN_RELIABLE,
) -> dict[str, Path]:
    """Draw the human sample of the reader correction and write FILES into ``out_dir``.

    The strata are the correction's (contextbias.corrected.stratum_of: generator x role x
    condition, "model|role|condition") over the images the reader table holds (the images
    table's status ok ones); ``disagreement``: a rate for every stratum, or a table
    (model, stratum, disagreement) from a pilot (sample_design.disagreement_rates). Per
    generator sample_design.allocate_by_model gives n_h for ``target_width``, and in each
    stratum n_h images are drawn (sample_design.draw_sample, ``seed``; selection
    probability n_h / N_h), n_h raised to the largest printing minimum the stratum's images
    reach (corrected_rule.printing_minimums: the aggregate rows' and ``minimum``, the
    per-cell rows'; the count `stereolens plan` recommends; None: the width's alone). The
    form shows each drawn image as its own set of one (the annotation form's blinding, CSV
    and key: docs/methods.md, the human annotation study), so that an answer is the label of
    one image; the template lists every drawn image x asked dimension with its stratum and
    selection probability, label empty. Returns FILES' paths."""
    schema = schema or AttributeSchema.load()
    dims = tuple(dimensions) if dimensions is not None else DEFAULT_DIMENSIONS
    vocab = _check_dimensions(dims, schema)
    reader = reader_table(attributes, images)
    if "extractor" in reader.columns:
        reader = reader.filter(pl.col("extractor") == reader["extractor"].min())
    pool = _select_images(images, attributes)
    items = (
        reader.select("item_id", "stratum", "model", "role", "condition")
        .unique()
        .join(pool.select(pl.col("image_id").alias("item_id"), "image_path"), on="item_id")
    )
    if not items.height:
        raise ValueError("no image of the reader table has a usable (status ok) image file")
    strata = items.group_by("model", "stratum").agg(pl.len().cast(pl.Int64).alias("n_items"))
    strata = sd.with_disagreement(strata, disagreement, ["model", "stratum"])
    if minimum is not None:
        strata = printing_minimums(strata, minimum)
    design, summary = sd.allocate_by_model(
        strata, target_width, share=share, ci=ci, allocation=allocation
    )
    sample = sd.draw_sample(items, design, seed)
    rows = items.join(sample.select("item_id"), on="item_id", how="semi").sort("item_id")
    drawn = [
        ((r["role"], r["condition"], r["model"]), rows.filter(pl.col("item_id") == r["item_id"])
         .select(pl.col("item_id").alias("image_id"), "image_path"))
        for r in rows.iter_rows(named=True)
    ]  # fmt: skip
    out = Path(out_dir)
    paths = write_form(
        drawn, dims, vocab, schema, seed, out, 1,
        image_root=image_root, max_side=max_side, image_format=image_format,
    )  # fmt: skip
    template = sd.label_template(sample, dims)
    write_text(out / FILES["template"], template.write_csv())
    design = design.with_columns(sd.planned_widths(summary, target_width))
    write_parquet(out / FILES["design"], design)
    return {**paths, "template": out / FILES["template"], "design": out / FILES["design"]}


def human_labels_from_answers(
    answer_csvs: Iterable[str | os.PathLike],
    key: pl.DataFrame | str | os.PathLike,
    template: pl.DataFrame | str | os.PathLike,
    schema: AttributeSchema | None = None,
) -> pl.DataFrame:
    """The human-label table (human_labels.HUMAN_COLUMNS) of a filled reader-sample
    form: the answers read and checked as the agreement study reads them (answers.
    read_answers), one label per image x dimension (the annotators' consensus, study.
    human_consensus: the majority, ties by slider then alphabet; the slider, a count of one
    image, is not used), the stratum and selection probability from the template. An image
    x dimension nobody answered is left out; an image with no answer at all is left out of
    the sample and its stratum's selection probability becomes answered / N_h (N_h = n_h /
    the template's probability): the answered images are taken as a simple random sample
    of the stratum (missing at random within it). (The correction normalises the inverse
    probabilities within a stratum, so the estimate does not depend on that choice.)"""
    key = read_key(key)
    multi = key.filter(pl.col("n_images") != 1)
    if multi.height:
        raise ValueError(
            f"annotation key: set {multi['set_id'][0]} shows {multi['n_images'][0]} images; "
            "human labels of single images need a reader-sample form (one image per set: "
            "export_reader_sample)"
        )
    if not isinstance(template, pl.DataFrame):
        template = hl.read_human_labels(template)
    template = template.select(list(hl.HUMAN_COLUMNS)).cast(hl.HUMAN_COLUMNS)
    answers = read_answers(answer_csvs, key, schema)
    labels = human_consensus(answers).join(
        key.select("set_id", pl.col("image_ids").list.first().alias("item_id")), on="set_id"
    )
    return fill_template(
        template,
        labels.select(
            "item_id",
            pl.col("dimension").alias("attribute"),
            pl.col("consensus_label").alias("label"),
        ),
    )


def plan_strata(config: dict[str, Any], pilot: Path | None) -> tuple[pl.DataFrame, str, list[str]]:
    """The strata of the configured run's reader correction (model, stratum, n_items: the
    images each generator x role x condition makes, from the plug-in's job counts) with
    the disagreement rate of each (sample_design.disagreement_rates from a pilot's results
    folder, its attributes, images and human-label tables, where it has them; else the config's
    contextbias.reader_sample.disagreement). Returns the table, the rate's source and
    notes."""
    from stereolens.contextbias.layout import LAYOUT
    from stereolens.contextbias.plugin import BENCHMARK

    section = config["contextbias"]["reader_sample"]
    counts: dict[tuple[str, str], int] = {}
    for job in BENCHMARK.jobs(config, counts=True):
        w = job.wildcards
        if job.stage == "generate" and w["condition"] in CONDITIONS:
            key = (w["model"], "|".join((w["model"], w["role"], w["condition"])))
            counts[key] = counts.get(key, 0) + job.items
    strata = pl.DataFrame(
        [(m, s, n) for (m, s), n in counts.items() if n > 0],
        schema={"model": pl.String, "stratum": pl.String, "n_items": pl.Int64},
        orient="row",
    )
    default = float(section["disagreement"])
    notes: list[str] = []
    if pilot is None:
        return strata.with_columns(pl.lit(default).alias("disagreement")), "default", notes
    files = {n: LAYOUT.at(pilot, n) for n in ("attributes", "images")}
    human = config["contextbias"]["reader_correction"]["human_labels"]
    human_path = Path(human) if human else LAYOUT.at(pilot, "human_labels_simulated")
    if not all(p.is_file() for p in (*files.values(), human_path)):
        notes.append(
            f"ContextBias reader: no human labels with the pilot's tables ({human_path}); "
            f"disagreement {default:g} (contextbias.reader_sample.disagreement)"
        )
        return strata.with_columns(pl.lit(default).alias("disagreement")), "default", notes
    reader = reader_table(
        use_label_column(pl.read_parquet(files["attributes"]), "auto"),
        pl.read_parquet(files["images"]),
    )
    table, source = sd.disagreement_rates(reader, hl.read_human_labels(human_path), strata, default)
    if source == "pilot":
        source = f"pilot {human_path}"
        simulated = human_path.suffix == ".parquet" and "simulated" in pl.read_parquet_schema(
            human_path
        )
        if simulated:
            notes.append(
                f"ContextBias reader: the pilot's human labels {human_path} are SIMULATED; "
                "their disagreement is the simulation's flip fraction, not the reader's"
            )
    return table, source, notes


def labels_needed(config: dict[str, Any], pilot: Path | None) -> dict[str, Any]:
    """The planner's reader rows of ContextBias: per generator the human labels for the
    configured target width (sample_design.allocate_by_model) and those that print every
    headline row's interval (every cell, generator x role x condition, at
    reader_correction.MIN_HUMAN_RELIABLE for the per-cell BI and CCS rows and at
    corrected_rule.printing_minimums' aggregate minimum for the mean over roles and its mean
    over generators (bi_role, bi_role_mean: the same 20 a role cell; pooled BI keeps the
    per-cell rule); sample_design.printable_counts, the items of a cell
    scaling with contextbias.seeds.per_prompt), with the settings and notes."""
    section = config["contextbias"]["reader_sample"]
    strata, source, notes = plan_strata(config, pilot)
    if not strata.height:
        return {"benchmark": "contextbias", "rows": [], "notes": notes}
    strata = printing_minimums(strata)
    knob = ("contextbias.seeds.per_prompt", float(config["contextbias"]["seeds"]["per_prompt"]))
    return sd.planner_part("contextbias", "images", section, strata, source, notes, knob)
