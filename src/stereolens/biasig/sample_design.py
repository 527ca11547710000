"""The human sample of BiasIG's reader correction, sized (`stereolens plan`): its strata (unit x
person x attribute cells, 2 human labels each) and the labels a target width needs per generator
(stereolens.metrics.sample_design; docs/statistics.md, "Designing the human sample")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from stereolens.metrics import sample_design as sd


def plan_strata(config: dict[str, Any]) -> pl.DataFrame:
    """The configured run's strata: model (the generator, the reader table's variant),
    stratum (generator x scoring unit x person), n_items (the unit's prompts x
    images_per_prompt), minimums (:func:`printing_minimum`) and minimum, their largest."""
    from stereolens.biasig.answers import scoring_table
    from stereolens.biasig.plugin import selection

    bg = config["biasig"]
    table = selection(config)
    prompts = scoring_table(table, bg["scoring_unit"]).with_columns(
        pl.when(pl.col("n_persons") == 2)
        .then(pl.lit(["left", "right"]))
        .otherwise(pl.lit(["single"]))
        .alias("position")
    )
    units = (
        prompts.explode("position")
        .group_by("unit", "position")
        .agg(
            (pl.len() * bg["images_per_prompt"]).cast(pl.Int64).alias("n"),
            pl.col("visibility").first(),
            pl.col("attribute_key").first(),
        )
    )
    units = units.with_columns(printing_minimum(table, bg["eta_variant"], units)).with_columns(
        pl.col("minimums").list.max().alias("minimum")
    )
    return pl.concat(
        [
            units.select(
                pl.lit(g).alias("model"),
                pl.concat_str(pl.lit(f"{g}|"), "unit", pl.lit("|"), "position").alias("stratum"),
                pl.col("n").alias("n_items"),
                "minimum",
                "minimums",
            )
            for g in bg["generators"]
        ]
    ).sort("model", "stratum")


def printing_minimum(prompts: pl.DataFrame, eta_variant: str, units: pl.DataFrame) -> pl.Series:
    """Per unit x person of ``units`` (visibility, attribute_key, position) the human labels
    from which the report prints each headline row ('*') using it, one per row: explicit
    corrected.score_minimum("s_exp", "*"), implicit corrected.cell_minimum("s_imp", "*", the
    implicit persons), and formulas.ETA_MIN_HUMAN_RELIABLE on a side of an eta pair."""
    from stereolens.biasig.corrected import cell_minimum, score_minimum
    from stereolens.biasig.formulas import ETA_MIN_HUMAN_RELIABLE
    from stereolens.biasig.pairs import resolve_pairs
    from stereolens.biasig.truth import load_truth

    pairs = resolve_pairs(prompts, load_truth(), eta_variant)
    sides = pl.concat(
        [
            pairs.select(
                pl.col(f"{side}_key").alias("attribute_key"),
                pl.col(f"{side}_position").alias("position"),
            )
            for side in ("advantaged", "disadvantaged")
        ]
    ).drop_nulls()
    persons = units.filter(pl.col("visibility") == "implicit").height  # a generator's
    implicit = cell_minimum("s_imp", "*", persons)
    side = pl.struct("attribute_key", "position").is_in(
        sides.select(pl.struct("attribute_key", "position")).to_series().implode()
    )
    return units.select(
        pl.when(pl.col("visibility") != "implicit")
        .then(pl.concat_list(pl.lit(score_minimum("s_exp", "*"))))
        .when(side)
        .then(pl.concat_list(pl.lit(implicit), pl.lit(ETA_MIN_HUMAN_RELIABLE)))
        .otherwise(pl.concat_list(pl.lit(implicit)))
        .cast(pl.List(pl.Int64))
        .alias("minimums")
    ).to_series()


def pilot_rates(
    config: dict[str, Any], pilot: Path, strata: pl.DataFrame, default: float
) -> tuple[pl.DataFrame, str, list[str]]:
    """``strata`` with the disagreement rates of a pilot's results folder (its answers,
    prompts and human labels, else its simulated ones; sample_design.disagreement_rates by
    generator, else the pilot's pooled rate); the source and notes."""
    from stereolens.biasig.answers import read_answers
    from stereolens.biasig.corrected import reader_table
    from stereolens.biasig.layout import LAYOUT
    from stereolens.biasig.prompts import load_prompts, read_prompt_table
    from stereolens.metrics.human_labels import read_human_labels

    bg = config["biasig"]
    answers_path, prompts_path = LAYOUT.at(pilot, "answers"), LAYOUT.at(pilot, "prompts")
    human = bg["reader_correction"]["human_labels"]
    human_path = Path(human) if human else LAYOUT.at(pilot, "human_labels_simulated")
    if not (answers_path.is_file() and human_path.is_file()):
        note = (
            f"BiasIG reader: no answers and human labels in the pilot ({answers_path}, "
            f"{human_path}); disagreement {default:g} (biasig.reader_sample.disagreement)"
        )
        return strata.with_columns(pl.lit(default).alias("disagreement")), "default", [note]
    answers = read_answers(answers_path)
    prompts = read_prompt_table(prompts_path) if prompts_path.is_file() else load_prompts()
    reader, _ = reader_table(answers, prompts, count=bg["count"], scoring_unit=bg["scoring_unit"])
    table, source = sd.disagreement_rates(
        reader, read_human_labels(human_path), strata, default, group="variant"
    )
    notes = []
    if source == "pilot":
        source = f"pilot {human_path}"
        if human_path.suffix == ".parquet" and "simulated" in pl.read_parquet_schema(human_path):
            notes.append(
                f"BiasIG reader: the pilot's human labels {human_path} are SIMULATED; their "
                "disagreement is the simulation's flip fraction, not the reader's"
            )
    return table, source, notes


def labels_needed(config: dict[str, Any], pilot: Path | None) -> dict[str, Any]:
    """The planner's reader rows of BiasIG: per generator the human labels (images x
    persons) for biasig.reader_sample.target_width at biasig.reader_sample.disagreement,
    or at a pilot's rates (:func:`pilot_rates`)."""
    section = config["biasig"]["reader_sample"]
    default = float(section["disagreement"])
    strata = plan_strata(config)
    if pilot is None:
        strata, source, notes = (
            strata.with_columns(pl.lit(default).alias("disagreement")),
            "default",
            [],
        )
    else:
        strata, source, notes = pilot_rates(config, pilot, strata, default)
    knob = ("biasig.images_per_prompt", float(config["biasig"]["images_per_prompt"]))
    return sd.planner_part("biasig", "images x persons", section, strata, source, notes, knob)
