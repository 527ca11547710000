"""`stereolens contextbias ...` subcommands."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def use_label_column(attributes, column: str):
    """The table with ``label`` taken from ``column`` ("auto" = canonical_label when the
    table has it, else label), one row per image x dimension x label."""
    import polars as pl

    if column == "auto":
        column = "canonical_label" if "canonical_label" in attributes.columns else "label"
    if column not in attributes.columns:
        raise ValueError(f"--label-column {column!r} is not a column of the attributes table")
    if column == "label":
        return attributes
    keys = [c for c in attributes.columns if c not in ("label", column)]
    return (
        attributes.with_columns(pl.col(column).alias("label"))
        .drop(column)
        .unique(subset=[*keys, "label"], keep="first", maintain_order=True)
    )


def _read(path: str, what: str, spec=None):
    """A table from parquet, CSV or JSON lines, by suffix, with ``spec``'s column types
    (see stereolens.tables.read_table)."""
    from stereolens.tables import read_table

    return read_table(path, what, spec=spec)


FLAGS = {
    "k": "k_definition",
    "overall": "overall",
    "single_label_bi": "single_label_bi",
    "replicates": "replicates",
    "bootstrap_draws": "bootstrap_draws",
    "bootstrap_interval": "bootstrap_interval",
    "interval_min_roles": "interval_min_roles",
    "seed": "seed",
    "matched_draws": "matched_draws",
    "consistency": "consistency",
    "bh_family": "bh_family",
    "robustness_cells": "robustness_cells",
    "robustness_all": "robustness_all",
}
"""argparse dest -> the setting (contextbias.metrics key) a documented flag sets."""


def settings(args: argparse.Namespace):
    """The settings of a `contextbias metrics` run: the schema's defaults under
    ``--preset``, then every flag given."""
    from stereolens.contextbias.settings import ContextBiasSettings
    from stereolens.settings import overrides, section_defaults

    section = section_defaults("contextbias", args.preset)
    section["metrics"].update(overrides(args, FLAGS))
    return ContextBiasSettings.from_config(section)


def _metrics(args: argparse.Namespace) -> int:

    from stereolens.contextbias.bootstrap import bootstrap_frame, level_replicates
    from stereolens.contextbias.ccs import ccs_mean, ccs_table
    from stereolens.contextbias.comparisons import model_comparisons
    from stereolens.contextbias.metrics import bi_table
    from stereolens.contextbias.robustness import robustness_summary, robustness_tests
    from stereolens.contextbias.schema import AttributeSchema
    from stereolens.tables import ATTRIBUTES, IMAGES, check_table, write_tables

    schema = AttributeSchema.load(args.schema)
    spec = replace(ATTRIBUTES, vocabularies=schema.table_vocabularies())
    read_spec = replace(spec, optional=(*spec.optional, ("canonical_label", str)))
    attributes = check_table(
        use_label_column(_read(args.attributes, "attributes", read_spec), args.label_column),
        spec,
        args.attributes,
    )
    images = (
        check_table(_read(args.images, "images", IMAGES), IMAGES, args.images)
        if args.images
        else None
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    st = settings(args)
    # Compute everything first, then write: a failure leaves no partial set of tables.
    bi_opts = {"overall": st.overall, "single_label_bi": st.single_label_bi}
    bi = bi_table(attributes, images, schema, st)
    ccs = ccs_table(
        attributes,
        images,
        min_count=st.ccs_min_count,
        alpha=st.alpha,
        max_range_pp=st.max_range_pp,
        consistency=st.consistency,
        bh_family=st.bh_family,
    )
    boot = level_replicates(
        attributes,
        replicates=st.replicates,
        seed=st.seed,
        k_definition=st.k_definition,
        schema=schema,
        draws=st.bootstrap_draws,
        **bi_opts,
    )
    common = level_replicates(
        attributes,
        replicates=st.replicates,
        seed=st.seed,
        schema=schema,
        draws=st.bootstrap_draws,
        support="common",
        **bi_opts,
    )
    comparisons, ranks = model_comparisons(common, min_roles=st.interval_min_roles)
    robustness = robustness_tests(attributes, images, cells=st.robustness_cells, alpha=st.alpha)
    tables = {
        "bi.parquet": bi,
        "ccs.parquet": ccs,
        "ccs_mean.parquet": ccs_mean(ccs),
        "robustness.parquet": robustness_summary(robustness, all_cohorts=st.robustness_all),
        "bootstrap.parquet": bootstrap_frame(boot, st.bootstrap_interval, st.interval_min_roles),
        "comparisons.parquet": comparisons,
        "ranks.parquet": ranks,
    }
    write_tables(out, tables)
    print(
        f"preset {args.preset}; K = {st.k_definition}; overall = mean of {st.overall}s; "
        f"single-label BI {st.single_label_bi:g}; bootstrap {st.replicates} replicates "
        f"({st.bootstrap_draws} draws, {st.bootstrap_interval} intervals), seed "
        f"{st.seed}; intervals from {st.interval_min_roles} roles; consistency "
        f"{st.consistency}; BH family "
        f"{st.bh_family}; robustness cells: {st.robustness_cells}, All: {st.robustness_all}"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    cb = sub.add_parser("contextbias", help="ContextBias benchmark tools")
    from stereolens.contextbias.intervals import BOOTSTRAP_INTERVALS

    cb_sub = cb.add_subparsers(dest="action", required=True)
    m = cb_sub.add_parser(
        "metrics",
        help="compute ContextBias metrics from an attributes table",
        description=(
            "Compute ContextBias metrics from a long attributes table (one row per image x "
            "dimension x label, columns model, role, condition, image_id, cohort, dimension, "
            "label; an `extractor` column, if present, splits every metric by extractor). "
            "Works on the workflow's results/contextbias/attributes.parquet or on your own "
            "annotations. Writes into DIR: "
            "bi.parquet: Bias Intensity 1 - H(p)/log K per model x dimension x condition, "
            "pooled over roles (aggregation 'pooled') and per role then averaged ('role'; "
            "'role_matched' at matched support; 'role_miller_madow'), with cohort rows "
            "(dimension '*': mean of the cohort's dimensions), overall rows (cohort '*': mean "
            "of the cohort rows, see --overall) and model '*' rows (mean over models); "
            "ccs.parquet: per model x role x dimension x label prevalence, range, "
            "chi-squared homogeneity across CF/CA-R/CA-U (p and Benjamini-Hochberg p_bh "
            "within each model), Context Consistency Score and consistency (paper Table 2); "
            "ccs_mean.parquet: CCS averaged over models and the number of models where the "
            "label is invariant; "
            "robustness.parquet: leave-one-out chi-squared prompt robustness per model x "
            "cohort (paper Table 3, computed as the authors' released code by default); "
            "bootstrap.parquet: role-level cluster bootstrap of pooled-BI differences "
            "(CA-R - CF, CA-U - CF, CA-U - CA-R) with a bias-corrected estimate and 95% basic "
            "bootstrap intervals (--bootstrap-interval), per "
            "model and across models, per cohort and per dimension (paper Tables 8-9); "
            "comparisons.parquet and ranks.parquet: every pair of generators (and of "
            "extractors reading the same images) on pooled BI per condition and on the CA-U "
            "- CF shift, overall and per cohort: difference, Wald interval from the paired "
            "role-bootstrap replicates, Holm over each family, ranks and groups "
            "(stereolens.metrics.compare); the compared values have one K (the closed "
            "vocabulary's size, else the labels seen by any model and extractor) and are "
            "bias-corrected (2 x the plug-in - the replicates' mean), so that a difference "
            "is not one of the labels each model happened to show (bench/COVERAGE.md). "
            "The three conditions must be named CF, CA-R and CA-U."
        ),
    )
    m.add_argument(
        "--attributes",
        required=True,
        metavar="PATH",
        help="attributes table, long form (.parquet, .csv or .jsonl)",
    )
    m.add_argument("--out", required=True, metavar="DIR", help="output directory")
    m.add_argument(
        "--label-column",
        default="auto",
        metavar="COL",
        help="column holding the labels: 'auto' (default) = canonical_label when the table "
        "has it (the workflow's canonicalised open-vocabulary labels), else label",
    )
    m.add_argument(
        "--images",
        metavar="PATH",
        help="images table (.parquet, .csv or .jsonl) with image_id, model, role, condition, "
        "status: gives the exact "
        "number of extracted images per cell (n_images, the CCS denominators); without it, "
        "only images that have at least one label are counted",
    )
    m.add_argument(
        "--schema",
        metavar="PATH",
        help="attribute schema YAML (default: the shipped v1, paper Table 6)",
    )
    m.add_argument(
        "--preset",
        default="paper",
        metavar="NAME|PATH",
        help="the settings: 'paper' (default: the paper's published numbers), 'released' "
        "(the authors' released headline bootstrap: K cell, unpaired draws, percentile "
        "intervals), or a YAML file of contextbias section keys (e.g. metrics: {alpha: 0.01}): "
        "every key of contextbias.metrics, including those without a flag (ccs_min_count, "
        "alpha, max_range_pp); the flags below override it (docs: Configuration, Presets)",
    )
    m.add_argument(
        "--k",
        choices=["model", "cell", "vocabulary"],
        help="K of BI: 'model' = labels seen for that model and dimension in any "
        "condition (default, the paper's numbers); 'cell' = labels seen in the "
        "cell (the released bootstrap); 'vocabulary' = the schema's closed "
        "vocabulary (open dimensions use 'model')",
    )
    m.add_argument(
        "--overall",
        choices=["cohort", "dimension"],
        help="the overall value (cohort '*') of BI and of the bootstrap: 'cohort' = mean of "
        "the cohort means, each cohort weighing the same (default; paper Tables 8 and 10, "
        "the released headline bootstrap); 'dimension' = mean of all dimensions (People, 21 "
        "of 30, then weighs 70%%)",
    )
    m.add_argument(
        "--single-label-bi",
        choices=["0", "1"],
        help="BI of a cell with one possible label (K = 1, where 1 - H/log K is 0/0): '0' "
        "(default; the released code, hence the paper's numbers) or '1' (fully "
        "concentrated)",
    )
    m.add_argument(
        "--replicates",
        type=_positive_int,
        metavar="B",
        help="cluster-bootstrap replicates (roles resampled with replacement); default: the "
        "preset's",
    )
    m.add_argument(
        "--bootstrap-draws",
        choices=["paired", "unpaired"],
        help="roles drawn per bootstrap replicate: 'paired' (default) = one draw shared by "
        "every model and condition, so differences stay paired; 'unpaired' = a draw per "
        "model x condition, as the released code (reproduces its headline CI design)",
    )
    m.add_argument(
        "--bootstrap-interval",
        choices=list(BOOTSTRAP_INTERVALS),
        help="the 95%% interval of bootstrap.parquet: 'bc-t' (default) = estimate_bc +- "
        "t(R - 1) x the replicates' sd x sqrt(R / (R - 1)), R = the roles (the basic interval "
        "under-covered the per-cohort shift at paper scale, 91.5%% for People over 1,000 "
        "datasets: bench/COVERAGE.md, ContextBias); 'basic' = 2 x estimate - the 97.5 and "
        "2.5 percentiles of the replicates; 'percentile' = the 2.5 and 97.5 percentiles, as "
        "the released code (its headline CI; the plug-in BI's small-sample bias enters it "
        "twice)",
    )
    m.add_argument(
        "--interval-min-roles",
        type=_positive_int,
        metavar="R",
        help="print no interval (bootstrap.parquet, comparisons.parquet: ci_low, ci_high, "
        "p-values and decisions null, interval_note says why) when the table has fewer "
        "roles than R: from 10 roles (the default) on the role bootstrap's intervals cover "
        "as at paper scale on the planner's prior world, below it they under-cover or turn "
        "vacuous (bench/COVERAGE.md); default: the preset's",
    )
    m.add_argument(
        "--seed",
        type=int,
        help="seed of the cluster bootstrap and of the matched-support subsampling; "
        "default: the preset's",
    )
    m.add_argument(
        "--matched-draws",
        type=_positive_int,
        metavar="N",
        help="subsamples averaged for per-role BI at matched support (each role's "
        "conditions cut to its smallest condition's image count); default: the preset's",
    )
    m.add_argument(
        "--consistency",
        choices=["released", "paper", "ccs"],
        help="a label is context-invariant ('consistent' in ccs.parquet, paper Table 2's "
        "Inv.): 'released' (default, the authors' tb3_pipeline.py, hence the paper's "
        "numbers) = at least ccs_min_count occurrences in total, p > alpha (a skipped test "
        "has p = 1) and range <= max_range_pp (preset keys), seen in all three conditions or "
        "not; 'paper' = p > alpha and range <= max_range_pp without the count requirement "
        "(paper Sec. 3.5 as written); 'ccs' = also only where CCS is defined",
    )
    m.add_argument(
        "--bh-family",
        choices=["tested", "all"],
        help="Benjamini-Hochberg family within each model: 'tested' (default) = the rows "
        "whose homogeneity test ran; 'all' = every row, skipped tests with p = 1",
    )
    m.add_argument(
        "--robustness-cells",
        choices=["released", "condition", "variant", "prompt"],
        help="the leave-one-out robustness test (paper Table 3): 'released' (default) = the "
        "authors' released computation: the baseline leaves out only the role's own "
        "(role, condition) cell, only the CA-R and CA-U cells are tested (df 1), every label "
        "of the model x dimension grid is tested (zero-filled), an untestable tuple counts as "
        "invariant with p = 1 (the 'All' row: see --robustness-all). The "
        "others test each role against all other roles over the cells 'condition' (CF, "
        "CA-R, CA-U), 'variant' (condition x the `variant` column) or 'prompt' (condition x "
        "prompt_id)",
    )
    m.add_argument(
        "--robustness-all",
        choices=["released", "all"],
        help="the tuples of the robustness summary's 'All' row (cohort '*'): 'released' "
        "(default) = People, Objects and Camera, as the authors' released table (its Scene "
        "entry is misspelled 'Sence', so Scene never reaches its All; paper Table 3); 'all' = "
        "every cohort, Scene included",
    )
    m.set_defaults(func=_metrics)
