"""The human sample of BiasIG's reader correction, sized (`stereolens plan`): its strata,
the correction's "variant|model|<scoring unit>" split by person (the cells are unit x
person x attribute, each needing 2 human labels), and the human labels a target width
needs per generator (stereolens.metrics.sample_design; docs/statistics.md, "Designing the
human sample")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from stereolens.metrics import sample_design as sd


def plan_strata(config: dict[str, Any]) -> pl.DataFrame:
    """The configured run's strata: model (the generator's registry name, the reader
    table's variant), stratum (generator x scoring unit x person: the correction stratifies
    by unit, and each person of a unit is a cell that needs its own 2 human labels) and
    n_items (the unit's prompts x images_per_prompt: the reader table's items of that
    person)."""
    from stereolens.biasig.answers import scoring_table
    from stereolens.biasig.plugin import selection

    bg = config["biasig"]
    prompts = scoring_table(selection(config), bg["scoring_unit"]).with_columns(
        pl.when(pl.col("n_persons") == 2)
        .then(pl.lit(["left", "right"]))
        .otherwise(pl.lit(["single"]))
        .alias("position")
    )
    units = (
        prompts.explode("position")
        .group_by("unit", "position")
        .agg((pl.len() * bg["images_per_prompt"]).cast(pl.Int64).alias("n"))
    )
    return pl.concat(
        [
            units.select(
                pl.lit(g).alias("model"),
                pl.concat_str(pl.lit(f"{g}|"), "unit", pl.lit("|"), "position").alias("stratum"),
                pl.col("n").alias("n_items"),
            )
            for g in bg["generators"]
        ]
    ).sort("model", "stratum")


def labels_needed(config: dict[str, Any], pilot: Path | None) -> dict[str, Any]:
    """The planner's reader rows of BiasIG: per generator the human labels (images x
    persons) for biasig.reader_sample.target_width at biasig.reader_sample.disagreement
    (a pilot's rate is not read for BiasIG yet: noted)."""
    section = config["biasig"]["reader_sample"]
    strata = plan_strata(config).with_columns(
        pl.lit(float(section["disagreement"])).alias("disagreement")
    )
    notes = []
    if pilot is not None:
        notes.append(
            "BiasIG reader: a pilot's disagreement rate is not read for BiasIG yet; "
            f"disagreement {section['disagreement']:g} (biasig.reader_sample.disagreement)"
        )
    _, rows = sd.allocate_by_model(
        strata, float(section["target_width"]), allocation=section["allocation"]
    )
    for r in rows:
        r["disagreement_min"] = r["disagreement_max"] = float(section["disagreement"])
        r["n_human"] = r["n_human"] if r["reachable"] else None
    return {
        "benchmark": "biasig",
        "unit": "images x persons",
        "target_width": float(section["target_width"]),
        "allocation": section["allocation"],
        "disagreement_source": "default",
        "rows": rows,
        "n_human": None
        if any(r["n_human"] is None for r in rows)
        else sum(r["n_human"] for r in rows),
        "notes": notes,
    }
