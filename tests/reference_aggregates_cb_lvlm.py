"""Earlier implementations of the ContextBias and LVLM aggregate stages, kept to pin the
production code (tests/test_aggregates.py on a synthetic run, test_workflow.py's
_same_as_reference on the demo's own shards): the in-memory merges and metrics that the
streamed, per-model code replaced. Nothing in src/ uses them.

- :func:`merge_extractions_reference`: the ContextBias extraction merge, a dict per label
  row (stereolens.contextbias.merge);
- :func:`merge_tables` and :func:`story_attribute_rows`: the LVLM merge of the per-job files
  in memory (stereolens.lvlm.merge);
- :func:`compute_all_reference`: the LVLM metrics from the whole responses table in memory
  (stereolens.lvlm.metrics.compute_all).

They call the production modules' helpers through the module (``CM.``, ``LMet.``, ``S.``),
so that a helper the tests patch is the one looked up at call time.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from stereolens.atomic import read_jsonl
from stereolens.contextbias import merge as CM
from stereolens.contextbias.schema import AttributeSchema
from stereolens.lvlm import metrics as LMet
from stereolens.lvlm import scores as S
from stereolens.lvlm.refusal import label_refusals, load_rules, refusal_rates
from stereolens.lvlm.settings import LVLMSettings

ADDED_COLUMNS = ("images_per_group",)
"""Columns the stages gained after these references were written (issue 20's minimum sizes:
the LVLM refusals' ``images_per_group``); the comparisons leave them out."""


# ---------------------------------------------------------------- ContextBias merge
def merge_extractions_reference(
    paths: list[str | Path], schema: AttributeSchema
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The earlier merge (a dict per label row): the reference the tests compare
    stereolens.contextbias.merge.merge_extractions and its per-part merge with."""
    image_rows, attr_rows = [], []
    for rec in [rec for path in paths for rec in read_jsonl(path)]:
        labels = schema.labels(rec["attributes"]) if rec.get("status") == "ok" else []
        image_rows.append({**{k: rec.get(k) for k in CM.IMAGE_COLUMNS}, "n_labels": len(labels)})
        base = {
            k: rec.get(k)
            for k in (
                "extractor",
                "model",
                "role",
                "condition",
                "variant",
                "prompt_id",
                "seed",
                "image_id",
            )
        }
        attr_rows.extend(
            {**base, "cohort": c, "dimension": d, "label": lab} for c, d, lab in labels
        )
    images = pl.DataFrame(image_rows, schema=CM.IMAGE_COLUMNS)
    dup = images.filter(pl.struct("extractor", "image_id").is_duplicated())
    if dup.height:
        raise ValueError(
            f"{dup.height} images appear twice in the extraction files "
            f"(e.g. {dup['image_id'][0]}); a shard was listed twice"
        )
    attributes = pl.DataFrame(attr_rows, schema=CM.ATTRIBUTE_COLUMNS)
    return attributes.sort(CM.KEY_COLUMNS + ["dimension", "label"]), images.sort(CM.KEY_COLUMNS)


# ---------------------------------------------------------------- LVLM merge
def story_attribute_rows(records: list[dict[str, Any]]) -> pl.DataFrame:
    """One row per extracted (attribute, value) of the assistant's story records."""
    rows = [
        {
            **{k: r[k] for k in ("model", "setting", "axis", "group", "image_id", "prompt_id")},
            "attribute": a,
            "value": v,
        }
        for r in records
        if r.get("status") == "ok"
        for a, v in r.get("pairs") or []
    ]
    schema = {
        c: pl.String
        for c in (
            "model",
            "setting",
            "axis",
            "group",
            "image_id",
            "prompt_id",
            "attribute",
            "value",
        )
    }
    return pl.DataFrame(rows, schema=schema)


def merge_tables(
    response_records: list[dict[str, Any]],
    refusal_tables: list[pl.DataFrame],
    story_records: list[dict[str, Any]],
    judgement_tables: list[pl.DataFrame],
) -> dict[str, pl.DataFrame]:
    """responses (with refusal labels joined), story_attributes (one row per value, plus
    story_status per story in ``stories``) and term_judgements."""
    keys = ["model", "setting", "task", "axis", "group", "image_id", "prompt_id"]
    responses = pl.DataFrame(response_records, infer_schema_length=None)
    if refusal_tables:
        labels = pl.concat([t for t in refusal_tables if t.height], how="diagonal_relaxed")
        if labels.height:
            responses = responses.join(labels, on=keys, how="left")
    stories = (
        pl.DataFrame(story_records, infer_schema_length=None).drop("pairs")
        if story_records
        else pl.DataFrame()
    )
    judged = [t for t in judgement_tables if t.height]
    return {
        "responses": responses,
        "story_attributes": story_attribute_rows(story_records),
        "stories": stories,
        "term_judgements": pl.concat(judged, how="diagonal_relaxed") if judged else pl.DataFrame(),
    }


# ---------------------------------------------------------------- LVLM metrics
def _dense_story_units(sub, responses, groups, min_count, formula):
    """stereolens.lvlm.scores._story_units as the earlier code scored stories: dense
    (units, values) counts and every value's TVD, not only the values that reach min_count
    in some replicate."""
    units, codes, prompts, per_prompt = S._story_counts(sub, responses, groups)
    per_prompt = [(has, c.toarray()) for has, c in per_prompt]
    weighted = formula == "story_tvd"

    def score(m, b):
        out = np.full((b, len(prompts)), np.nan)
        for j, (has, c) in enumerate(per_prompt):
            n_gv = S._grouped(m, c, b, len(groups))  # [B, G, K]
            n_g = S._grouped(m, has, b, len(groups))  # [B, G]
            n_v = n_gv.sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                rate = n_gv / n_g[:, :, None]
                tvd = S.tvd_from_uniform(rate / rate.sum(axis=1, keepdims=True), axis=1)
            keep = (n_v >= min_count) & np.isfinite(tvd)
            w = n_v * keep if weighted else keep.astype(float)
            wsum = w.sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[:, j] = np.where(wsum > 0, (np.where(keep, tvd, 0) * w).sum(1) / wsum, np.nan)
        return out

    strata = units["stratum"].rank("dense").to_numpy().astype(np.int64) - 1
    keys = units["image_id"].cast(pl.String).to_numpy()
    return S._Units(codes, strata, False, len(codes), len(groups), prompts, score, keys)


def compute_all_reference(
    responses: pl.DataFrame,
    story_attributes: pl.DataFrame | None = None,
    term_judgements: pl.DataFrame | None = None,
    *,
    min_count: int = 5,
    replicates: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    phrases=None,
    permutations: int = 1000,
    formulas: dict[str, str] | None = None,
) -> dict[str, pl.DataFrame]:
    """stereolens.lvlm.metrics.compute_all as the earlier code computed it from the whole
    table in memory (exam answers scored row by row, story value counts dense, refusal rates
    from the labelled rows): the reference of the tests."""
    from statsmodels.stats.proportion import proportion_confint

    responses = LMet._with_setting(responses)
    exam = responses.filter(pl.col("task") == "exam").with_columns(
        pl.col("correct").fill_null(False).cast(pl.Boolean)
    )
    cols = ["model", "setting", "axis", "group", "image_id", "prompt_id"]
    cols += ["stratum"] if "stratum" in responses.columns else []
    rows = {
        "story": responses.filter(pl.col("task") == "story").select(cols),
        "exam": exam,
    }
    sparse_units, S._story_units = S._story_units, _dense_story_units
    try:
        overall, per_prompt = LMet.scores(
            rows,
            story_attributes,
            term_judgements,
            replace(
                LVLMSettings.preset(),
                min_count=min_count,
                replicates=replicates,
                seed=seed,
                level=level,
                permutations=permutations,
                formulas=formulas or {},
            ),
        )
    finally:
        S._story_units = sparse_units
    labelled = responses
    if "refusal" not in labelled.columns:
        labelled = label_refusals(labelled, rules=load_rules(phrases))
    overall_r = refusal_rates(labelled, by=("model", "setting", "task")).with_columns(
        pl.lit("*").alias("axis"), pl.lit("*").alias("group")
    )
    grouped = refusal_rates(labelled, by=("model", "setting", "task", "axis", "group"))
    table = pl.concat([overall_r, grouped], how="diagonal_relaxed")
    # the design effect of the user image, from the labelled rows image by image
    deffs = []
    for r in table.iter_rows(named=True):
        cell = labelled.filter(
            (pl.col("model") == r["model"])
            & (pl.col("setting") == r["setting"])
            & (pl.col("task") == r["task"])
            & ((pl.col("axis") == r["axis"]) | (r["axis"] == "*"))
            & ((pl.col("group") == r["group"]) | (r["group"] == "*"))
        )
        per = refusal_rates(cell, by=("axis", "group", "image_id"))
        m = (per["n"] - per["n_empty"]).to_numpy().astype(float)
        y = per["n_refusal"].to_numpy().astype(float)
        p = y.sum() / m.sum() if m.sum() else 0.0
        deffs.append(
            max(1.0, float(((y - p * m) ** 2).sum() / (p * (1 - p) * m.sum())))
            if 0 < p < 1
            else 1.0
        )
    table = table.with_columns(pl.Series("deff", deffs))
    valid = (table["n"] - table["n_empty"]).to_numpy()
    lo, hi = proportion_confint(
        table["n_refusal"].to_numpy() / table["deff"].to_numpy(),
        np.maximum(valid, 1) / table["deff"].to_numpy(),
        alpha=0.05,
        method="wilson",
    )
    order = ["model", "setting", "task", "axis", "group"]
    refusal_table = (
        table.with_columns(
            pl.Series("ci_low", np.where(valid > 0, 100 * lo, np.nan)),
            pl.Series("ci_high", np.where(valid > 0, 100 * hi, np.nan)),
        )
        .select(*order, pl.exclude(order))
        .sort(order)
    )
    keys = ["model", "setting", "axis", "group"]
    agg = [pl.len().alias("n"), pl.col("correct").sum().alias("n_correct")]
    accuracy = (
        pl.concat(
            [
                exam.group_by([*keys, "subject"]).agg(agg),
                exam.group_by(keys)
                .agg(agg)
                .with_columns(pl.lit("*").alias("subject"))
                .select(*keys, "subject", "n", "n_correct"),
            ]
        )
        .with_columns((100.0 * pl.col("n_correct") / pl.col("n")).alias("accuracy"))
        .sort([*keys, "subject"])
        if exam.height
        else pl.DataFrame()
    )
    return {
        "scores": overall,
        "prompt_scores": per_prompt,
        "refusals": refusal_table,
        "exam_accuracy": accuracy,
        "story_skew": LMet.story_skew(story_attributes, rows, min_count=min_count)
        if story_attributes is not None
        else pl.DataFrame(),
    }
