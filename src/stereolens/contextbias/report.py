"""The ContextBias part of the report (paper 002): the entry points every benchmark's report
module has (``facts``, ``profile``, ``sections``, ``galleries``), the profile and the tables;
figures, studies and galleries live in the contextbias_* report modules."""

from __future__ import annotations

import json

import polars as pl

from stereolens.contextbias import report_studies
from stereolens.contextbias.invariant import interval_min_roles, invariant_share
from stereolens.contextbias.metrics import CONDITIONS, _group_keys
from stereolens.contextbias.report_figures import (
    BI_FORMULA,
    bi_condition_figure,
    bi_dimension_figure,
    bootstrap_figure,
    ccs_heatmap,
    interval_words,
    only_extractor,
    withheld_words,
)
from stereolens.contextbias.report_gallery import galleries as galleries  # entry point
from stereolens.contextbias.report_reader import READER_CAPTION, READER_HEADLINES, READER_SCOPE
from stereolens.report import reader, reader_plan
from stereolens.report.html import Section, Table
from stereolens.report.inputs import Inputs
from stereolens.report.summary import profile_frame

OTHER_ROLES = ("contextbias canonicalisation LLM",)
"""Model roles of this benchmark (its plug-in's models) that :func:`facts` does not name:
the first screen lists them under "Other models"."""

KEY = "contextbias"
TITLE = "ContextBias"
HEADLINE = "bi"
"""The table whose presence says ContextBias has results (stereolens report --results)."""
ALWAYS_WRITTEN = {
    "validation": {"enabled": False},
    "annotation": {"enabled": False, "answers": None},
}
"""The section with every optional part off: the plug-in's report tables of it are those
every run writes."""


def model_rows(config: dict) -> list[dict]:
    """Rows of the report's Models table for models outside the registry: the
    canonicalisation's sentence encoder."""
    canon = config["contextbias"]["canonicalisation"]
    if not (canon["enabled"] and canon["encoder"]):
        return []
    return [{"role": "contextbias canonicalisation encoder", "name": canon["encoder"],
             "kind": "sentence encoder", "backend": "sentence-transformers",
             "model": canon["encoder"], "revision": "", "weights": "",
             "settings": json.dumps({"threshold": canon["threshold"]})}]  # fmt: skip


NOT_SHOWN = {"generators": [], "extractors": [], "canonicalisation": {"encoder": None}}
"""What a report without the run's config assumes where :func:`infer_config` names nothing:
no models, and an encoder the tables do not name (the Models table lists none)."""


def infer_config(inputs: Inputs) -> dict:
    """The section naming what the tables hold, for a report without the run's config."""
    section: dict = {}
    images = inputs.get("images", columns=["model", "extractor"])
    if images is not None:
        section["generators"] = sorted(images["model"].unique().to_list())
        if "extractor" in images.columns:
            section["extractors"] = sorted(images["extractor"].drop_nulls().unique().to_list())
    return section


def enabled(inputs: Inputs, config: dict) -> bool:
    return inputs.has("bi")


def primary_extractor(inputs: Inputs, config: dict) -> str | None:
    """The extractor whose numbers the bias profile shows: the first one the config lists
    (the paper's GPT-5-mini in config/config.yaml), else the first in the tables."""
    bi = inputs.get("bi")
    if bi is None or "extractor" not in bi.columns or bi.is_empty():
        return None
    listed = config["contextbias"]["extractors"]
    present = sorted(bi["extractor"].unique().to_list())
    return next((e for e in listed if e in present), present[0] if present else None)


# ------------------------------------------------------------------ facts and profile


def facts(inputs: Inputs, config: dict) -> list[str]:
    """Lines for the first screen: the models, then the scale."""
    cb = config["contextbias"]
    prompts, images = inputs.get("prompts"), inputs.get("images")
    gens, exts = cb["generators"], cb["extractors"]
    lines = [f"generators {', '.join(gens)}" + (f"; extractors {', '.join(exts)}" if exts else "")]
    scale = []
    if prompts is not None:
        scale.append(
            f"{prompts['role'].n_unique()} roles x 3 conditions, {prompts.height:,} prompts"
        )
    if images is not None and images.height:
        n_img = images["image_id"].n_unique()
        bad = images.filter(pl.col("status") != "ok").height
        scale.append(f"{n_img:,} images ({bad:,} extractions discarded)")
    if scale:
        lines.append("; ".join(scale))
    return lines


def profile(inputs: Inputs, config: dict) -> pl.DataFrame:
    """Per generator: the overall BI shift CA-U - CF with its role-bootstrap interval, and
    the share of context-invariant (role, label) pairs with its interval over roles
    (contextbias.invariant.invariant_share: Wilson on the counts over the design effect of
    roles; withheld under contextbias.metrics.interval_min_roles roles)."""
    extractor = primary_extractor(inputs, config)
    several = len(config["contextbias"]["extractors"]) > 1
    title = f"{TITLE}, extractor {extractor}" if extractor and several else TITLE
    rows = []
    boot = inputs.get("bootstrap")
    ccs = inputs.get("ccs", columns=["extractor", "model", "role", "consistent"])
    models = []
    if boot is not None:
        b = only_extractor(boot, extractor).filter(
            (pl.col("model") != "*")
            & (pl.col("cohort") == "*")
            & (pl.col("dimension") == "*")
            & (pl.col("comparison") == "CA-U - CF")
        )
        for r in b.sort("model").iter_rows(named=True):
            models.append(r["model"])
            rows.append(
                {
                    "model": r["model"],
                    "metric": "bi_shift",
                    "label": "BI shift CA-U - CF",
                    "panel": "BI shift CA-U - CF",
                    "estimate": r["estimate"],
                    "ci_low": r["ci_low"],
                    "ci_high": r["ci_high"],
                    "reading": "0 = context changes nothing",
                    "reference": 0.0,
                    "interval_note": r.get("interval_note"),
                }
            )
    if ccs is not None and not ccs.is_empty():
        c = only_extractor(ccs, extractor)
        share = invariant_share(c, min_roles=interval_min_roles(config))
        for r in share.sort("model").iter_rows(named=True):
            note = f"{r['k']} of {r['n']} pairs, {r['roles']} roles"
            rows.append(
                {
                    "model": r["model"],
                    "metric": "invariant_pct",
                    "label": "context-invariant pairs %",
                    "panel": "context-invariant pairs %",
                    "estimate": r["estimate"],
                    "ci_low": r["ci_low"],
                    "ci_high": r["ci_high"],
                    "n": r["n"],
                    "reading": "% of tested (role, label) pairs",
                    "note": note,
                    "interval_note": r["interval_note"],
                }
            )
    for r in rows:
        r.update(benchmark=KEY, benchmark_title=title)
    return profile_frame(rows)


# ------------------------------------------------------------------ tables


def _bi_tables(bi: pl.DataFrame) -> list[Table]:
    keys = _group_keys(bi)
    if bi.is_empty():
        return [
            Table("contextbias-bi", "Bias Intensity", "No attributes were extracted: no BI.", bi)
        ]
    pooled = bi.filter(pl.col("aggregation") == "pooled")
    wide = pooled.filter(pl.col("dimension") == "*").pivot(
        on="condition", index=keys + ["cohort"], values="bi"
    )
    wide = wide.select(keys + ["cohort"] + [c for c in CONDITIONS if c in wide.columns])
    if {"CF", "CA-U"} <= set(wide.columns):
        wide = wide.with_columns((pl.col("CA-U") - pl.col("CF")).alias("CA-U - CF"))
    agg = bi.filter((pl.col("dimension") == "*") & (pl.col("model") == "*")).pivot(
        on="condition", index=keys[:-1] + ["aggregation", "cohort"], values="bi"
    )
    agg = agg.select(
        keys[:-1] + ["aggregation", "cohort"] + [c for c in CONDITIONS if c in agg.columns]
    )
    dims = pooled.filter(pl.col("dimension") != "*").pivot(
        on="condition", index=keys + ["cohort", "dimension"], values="bi"
    )
    dims = dims.select(
        keys + ["cohort", "dimension"] + [c for c in CONDITIONS if c in dims.columns]
    )
    return [
        Table(
            "contextbias-bi-cohort",
            "Pooled BI per cohort and condition (paper Fig. 3)",
            f"{BI_FORMULA} over label counts pooled across roles; cohort '*' = the mean of the "
            "cohort values; model '*' = the mean over models; CA-U - CF the shift the "
            "profile reports.",
            wide.sort(keys + ["cohort"]),
        ),
        Table(
            "contextbias-bi-aggregations",
            "BI pooled over roles vs averaged per role (paper Table 10, App. E.2)",
            "Mean over models: pooled = one distribution over all roles; role = mean of the "
            "per-role BI; role_matched = per role at matched support (subsampled to the "
            "smallest cell); role_miller_madow = per role with the Miller-Madow entropy "
            "correction H + (K_obs - 1)/(2n).",
            agg.sort(pl.all()),
        ),
        Table(
            "contextbias-bi-dimension",
            "Pooled BI per dimension and condition (paper Fig. 4)",
            f"{BI_FORMULA} per dimension, every model and their mean ('*').",
            dims.sort(keys + ["cohort", "dimension"]),
        ),
    ]


def _bootstrap_tables(boot: pl.DataFrame) -> list[Table]:
    cols = [
        c
        for c in (
            "extractor",
            "model",
            "cohort",
            "dimension",
            "comparison",
            "estimate",
            "ci_low",
            "ci_high",
            "estimate_bc",
            "interval_note",
        )
        if c in boot.columns and (c != "interval_note" or boot[c].is_not_null().any())
    ]
    reps = boot["replicates"][0] if boot.height else 0
    how = interval_words(boot)
    withheld = withheld_words(boot)
    iv = {"estimate": ("ci_low", "ci_high")}
    overall = boot.filter((pl.col("model") == "*") & (pl.col("dimension") == "*"))
    per_model = boot.filter(
        (pl.col("model") != "*")
        & (pl.col("dimension") == "*")
        & (pl.col("comparison") == "CA-U - CF")
    )
    camera = boot.filter(
        (pl.col("model") == "*") & (pl.col("cohort") == "camera") & (pl.col("dimension") != "*")
    )
    return [
        Table(table_id, title, note, rows.select(cols).sort(pl.all()), intervals=iv)
        for table_id, title, note, rows in (
            (
                "contextbias-bootstrap-overall",
                "BI differences across generators (paper Table 8)",
                f"Delta BI (the plug-in estimate, the paper's number) with 95% {how}, {reps} "
                "role-level cluster-bootstrap replicates; estimate_bc = 2 x estimate - the "
                "replicates' mean (bias-corrected)." + withheld,
                overall,
            ),
            (
                "contextbias-bootstrap-model",
                "CA-U - CF per generator (paper Table 9)",
                f"Delta BI = BI(CA-U) - BI(CF) per generator and cohort with 95% {how}; "
                "estimate_bc bias-corrected." + withheld,
                per_model,
            ),
            (
                "contextbias-bootstrap-camera",
                "Camera cohort per dimension (paper App. E.1)",
                "Opposing shifts of the camera dimensions that the cohort mean hides." + withheld,
                camera,
            ),
        )
    ]


def _robustness_caption(robustness: pl.DataFrame) -> str:
    cells = robustness["cells"][0] if robustness.height and "cells" in robustness.columns else None
    pooled = (
        robustness["all_cohorts"][0]
        if robustness.height and "all_cohorts" in robustness.columns
        else "released"
    )
    all_row = (
        "cohort '*' (the paper's All) covers People, Objects and Camera, as the released "
        "table (its Scene entry is misspelled, so Scene never reaches its All)"
        if pooled == "released"
        else "cohort '*' pools every cohort, Scene included (not the paper's All)"
    )
    if cells == "released":
        return (
            "Prompt robustness as the authors' released code computes it (paper Table 3): per "
            "(model, role, label) of the model x dimension label grid, the CA-R and CA-U cells "
            "against the label's share among all the model's other images (only the cell "
            "itself left out), chi-squared with df 1; an untestable tuple counts as invariant "
            f"with p = 1. pct_invariant = % of tuples with p > 0.05, mean p, CF prevalence %; "
            f"{all_row}."
        )
    return (
        f"Leave-one-out chi-squared over the cells '{cells}': share of tested (role, label) "
        "tuples whose distribution over the cells matches the other roles' (p > 0.05), mean "
        f"p, CF prevalence (not the paper's Table 3 computation; see --robustness-cells); "
        f"{all_row}."
    )


def _consistency_words(metrics: dict) -> str:
    """The configured context-invariance rule in words (contextbias.metrics.consistency)."""
    from stereolens.contextbias.ccs import consistency_rule

    return consistency_rule(metrics["consistency"])


def _ccs_tables(inputs: Inputs, metrics: dict) -> list[Table]:
    rule = _consistency_words(metrics)
    out = []
    ccs_mean = inputs.get("ccs_mean")
    if ccs_mean is not None:
        top = ccs_mean.filter(
            pl.col("ccs_mean").is_not_null() & pl.col("ccs_mean").is_not_nan()
        ).sort(["ccs_mean", "role", "dimension", "label"], descending=[True, False, False, False])
        out.append(
            Table(
                "contextbias-ccs-top",
                "Labels with the highest cross-generator mean CCS (paper Tables 2 and 11)",
                "CCS = Prev% / (1 + range pp); n_invariant = generators where the label is "
                f"context-invariant ({rule}); n_ccs = generators where "
                "CCS is defined. Labels where CCS is undefined everywhere are left out (the "
                "CSV of the full table has them).",
                top,
                max_rows=100,
                csv=ccs_mean,
            )
        )
    ccs = inputs.get("ccs")
    if ccs is not None:
        keep = [
            c
            for c in ("extractor", "model", "role", "cohort", "dimension", "label",
                      "prevalence_pct", "range_pp", "chi2", "df", "p", "p_bh", "ccs", "consistent")
            if c in ccs.columns
        ]  # fmt: skip
        out.append(
            Table(
                "contextbias-ccs",
                "CCS and the chi-squared test per model, role and label",
                "Per model x role x dimension x label: prevalence %, range pp across "
                "conditions, chi-squared homogeneity test of the three conditions (df, p, "
                "Benjamini-Hochberg p_bh within the model), CCS (null where undefined), "
                f"consistent = {rule}. Sorted by CCS.",
                ccs.select(keep).sort(
                    ["ccs", "model", "role", "dimension", "label"],
                    descending=[True, False, False, False, False],
                    nulls_last=True,
                ),
                max_rows=100,
                csv=ccs,
            )
        )
    robustness = inputs.get("robustness")
    if robustness is not None:
        out.append(
            Table(
                "contextbias-robustness",
                "Prompt robustness (paper Table 3)",
                _robustness_caption(robustness),
                robustness.sort(pl.all()),
            )
        )
    return out


def _extraction_tables(images: pl.DataFrame) -> list[Table]:
    by = [c for c in ("extractor", "model") if c in images.columns]
    status = (
        images.group_by(by)
        .agg(
            pl.col("image_id").n_unique().alias("images"),
            (pl.col("status") == "ok").sum().alias("ok"),
            (pl.col("status") != "ok").sum().alias("discarded"),
            pl.col("attempts").mean().alias("mean_attempts")
            if "attempts" in images.columns
            else pl.lit(None).alias("mean_attempts"),
        )
        .with_columns((100.0 * pl.col("discarded") / pl.col("images")).alias("discarded_pct"))
        .sort(by)
    )
    out = [
        Table(
            "contextbias-extraction-status",
            "Extraction status per extractor and generator",
            "images: generated images; discarded: images without a valid answer after the "
            "configured number of attempts (their attributes are not counted); "
            "discarded_pct = discarded / images x 100.",
            status,
            digits=2,
        )
    ]
    failed = images.filter(pl.col("status") != "ok")
    if failed.height:
        reasons = (
            failed.with_columns(pl.col("reason").str.replace_all(r"\d+", "N").alias("reason"))
            .group_by("reason")
            .agg(pl.len().alias("images"))
            .sort(["images", "reason"], descending=[True, False])
        )
        out.append(
            Table(
                "contextbias-discard-reasons",
                "Why images were discarded",
                "Discard reasons with numbers replaced by N, most frequent first.",
                reasons,
            )
        )
    return out


def sections(inputs: Inputs, config: dict) -> list[Section]:
    """The ContextBias section: figures first, then the settings, the tables, and the
    validation, canonicalisation and agreement subsections."""
    if not enabled(inputs, config):
        return []
    metrics = config["contextbias"]["metrics"]
    bi = inputs.get("bi")
    boot = inputs.get("bootstrap")
    ccs_mean = inputs.get("ccs_mean")
    figures = [
        f
        for f in (
            bi_condition_figure(bi),
            bi_dimension_figure(bi),
            bootstrap_figure(boot) if boot is not None else None,
            ccs_heatmap(ccs_mean) if ccs_mean is not None else None,
        )
        if f is not None
    ]
    main = Section(
        "contextbias",
        "ContextBias: do role-linked attributes persist when the context changes?",
        figures=figures,
        paragraphs=[
            "Each role is prompted context-free (CF), in a role-related context (CA-R) and "
            "in an unrelated context (CA-U); a VLM extracts 30 attribute dimensions of every "
            "image. " + "; ".join(facts(inputs, config)) + ".",
            "Settings: K definition {k}; CCS defined for labels seen in all three conditions "
            "and at least 5 times; context-invariant when {c}; "
            "bootstrap {b} replicates, seed {s}; matched-support draws {d}.".format(
                c=_consistency_words(metrics),
                k=metrics["k_definition"],
                b=metrics["replicates"],
                s=metrics["seed"],
                d=metrics["matched_draws"],
            ),
        ],
    )
    images = inputs.get("images")
    main.tables += _bi_tables(bi)
    if boot is not None:
        main.tables += _bootstrap_tables(boot)
    main.tables += _ccs_tables(inputs, metrics)
    if images is not None:
        main.tables += _extraction_tables(images)
    main.subsections += report_studies.subsections(inputs)
    return [main]


# ------------------------------------------------------------------ reader correction


def reader_correction(inputs: Inputs, config: dict) -> reader.ReaderBlock | None:
    """The first screen's reader block (stereolens.report.reader): naive beside corrected
    role-level BI per generator x condition x role x dimension with the role's cohort means
    and overall value, its mean over roles (plug-in and Miller-Madow), pooled BI per
    condition x
    dimension, its cohort means and overall value, and CCS per role x dimension x label
    (the primary extractor's), else the labels to collect for the run's images
    (disagreement from the extraction audit per group)."""
    table = inputs.get("contextbias_corrected")
    if table is not None and table.height:
        # a table written before the CCS rows has no label column
        scope = tuple(c for c in READER_SCOPE if c in table.columns)
        ex = primary_extractor(inputs, config)
        if "extractor" in table.columns:
            ex = ex if ex in table["extractor"].to_list() else table["extractor"][0]
            table = table.filter(pl.col("extractor") == ex)
        return reader.corrected_block(
            KEY, TITLE, table, READER_HEADLINES,
            scope=scope,
            counts=reader.distinct_counts(
                table, ["model", "role", "condition"], pl.col("metric") == "bi"
            ),
            simulated=reader.simulated(inputs, config, KEY),
            formulas=READER_CAPTION,
        )  # fmt: skip
    images = inputs.get("images", columns=["image_id", "model", "role", "condition", "status"])
    if images is None or images.height == 0:
        return None
    if "status" in images.columns:
        images = images.filter(pl.col("status") == "ok")
    if "condition" in images.columns:
        images = images.filter(pl.col("condition") != "VAL")
    strata = [c for c in ("model", "role", "condition") if c in images.columns]
    return reader_plan.plan_block(
        KEY, TITLE, n_items=images["image_id"].n_unique(), what="images",
        disagreement=reader_plan.audit_disagreement(inputs.get("validation_by_group")),
        audit="extraction audit", n_strata=images.select(strata).n_unique() if strata else 1,
        planned=reader_plan.planner_part(config, KEY),
    )  # fmt: skip
