"""`stereolens contextbias ...` subcommands."""

from __future__ import annotations

import argparse
from dataclasses import replace

FLAGS = {
    "single_label_bi": "single_label_bi",
    "bootstrap_draws": "bootstrap_draws",
    "bh_family": "bh_family",
    "robustness_cells": "robustness_cells",
}
"""argparse dest -> the contextbias.metrics key a flag sets over the preset (the flags the
issues name; every other key is set in the preset)."""


def _read_inputs(args: argparse.Namespace):
    """The schema, the checked attributes table (with its --label-column) and the images
    table (or None) that `metrics` and `correct` read."""
    from stereolens.contextbias.metrics import use_label_column
    from stereolens.contextbias.schema import AttributeSchema
    from stereolens.metrics.command import read_checked
    from stereolens.tables import ATTRIBUTES, IMAGES

    schema = AttributeSchema.load(args.schema)
    spec = replace(ATTRIBUTES, vocabularies=schema.table_vocabularies())
    read_spec = replace(spec, optional=(*spec.optional, ("canonical_label", str)))
    attributes = read_checked(
        args.attributes,
        "attributes",
        spec,
        read_spec=read_spec,
        then=lambda table: use_label_column(table, args.label_column),
    )
    images = read_checked(args.images, "images", IMAGES) if args.images else None
    return schema, attributes, images


def _metrics(args: argparse.Namespace, section: dict):
    from stereolens.contextbias.bootstrap import bootstrap_frame, level_replicates
    from stereolens.contextbias.ccs import ccs_mean, ccs_table
    from stereolens.contextbias.comparisons import model_comparisons
    from stereolens.contextbias.metrics import bi_table
    from stereolens.contextbias.robustness import robustness_summary, robustness_tests
    from stereolens.contextbias.settings import ContextBiasSettings
    from stereolens.settings import overrides

    schema, attributes, images = _read_inputs(args)
    section["metrics"].update(overrides(args, FLAGS))
    st = ContextBiasSettings.from_config(section)
    bi = bi_table(attributes, images, schema, st)
    ccs = ccs_table(attributes, images, **st.ccs_options())
    opts = st.bootstrap_options()
    boot = level_replicates(attributes, k_definition=st.k_definition, schema=schema, **opts)
    common = level_replicates(attributes, schema=schema, support="common", **opts)
    comparisons, ranks = model_comparisons(common, min_roles=st.interval_min_roles)
    robustness = robustness_tests(attributes, images, cells=st.robustness_cells, alpha=st.alpha)
    print(
        f"preset {' + '.join(args.preset)}; K = {st.k_definition}; "
        f"overall = mean of {st.overall}s; "
        f"single-label BI {st.single_label_bi:g}; bootstrap {st.replicates} replicates "
        f"({st.bootstrap_draws} draws, {st.bootstrap_interval} intervals), seed "
        f"{st.seed}; intervals from {st.interval_min_roles} roles; consistency "
        f"{st.consistency}; BH family "
        f"{st.bh_family}; robustness cells: {st.robustness_cells}, All: {st.robustness_all}"
    )
    return {
        "bi": bi,
        "ccs": ccs,
        "ccs_mean": ccs_mean(ccs),
        "robustness": robustness_summary(robustness, all_cohorts=st.robustness_all),
        "bootstrap": bootstrap_frame(boot, st.bootstrap_interval, st.interval_min_roles),
        "comparisons": comparisons,
        "ranks": ranks,
    }


def register(sub: argparse._SubParsersAction) -> None:
    """Add `stereolens contextbias metrics`, `correct`, `simulate-human-labels`,
    `reader-sample` and `human-labels`."""
    from stereolens.metrics.command import add_metrics_command

    cb = sub.add_parser("contextbias", help="ContextBias benchmark tools")
    cb_sub = cb.add_subparsers(dest="action", required=True)
    m = add_metrics_command(
        cb_sub,
        "contextbias",
        _metrics,
        example="metrics: {alpha: 0.01, replicates: 200}",
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
            "of the cohort rows, preset key metrics.overall) and model '*' rows (mean over "
            "models); "
            "ccs.parquet: per model x role x dimension x label prevalence, range, "
            "chi-squared homogeneity across CF/CA-R/CA-U (p and Benjamini-Hochberg p_bh "
            "within each model), Context Consistency Score and consistency (paper Table 2); "
            "ccs_mean.parquet: CCS averaged over models and the number of models where the "
            "label is invariant; "
            "robustness.parquet: leave-one-out chi-squared prompt robustness per model x "
            "cohort (paper Table 3, computed as the authors' released code by default); "
            "bootstrap.parquet: role-level cluster bootstrap of pooled-BI differences "
            "(CA-R - CF, CA-U - CF, CA-U - CA-R) with a bias-corrected estimate and its 95% "
            "interval (preset key metrics.bootstrap_interval, default bc-t), per "
            "model and across models, per cohort and per dimension (paper Tables 8-9); "
            "comparisons.parquet and ranks.parquet: every pair of generators (and of "
            "extractors reading the same images) on pooled BI per condition and on the CA-U "
            "- CF shift, overall and per cohort: difference, Wald interval from the paired "
            "role-bootstrap replicates, Holm over each family, ranks and groups "
            "(stereolens.metrics.compare); the compared values have one K (the closed "
            "vocabulary's size, else the labels seen by any model and extractor) and are "
            "bias-corrected (2 x the plug-in - the replicates' mean), so that a difference "
            "is not one of the labels each model happened to show (bench/COVERAGE.md). "
            "The three conditions must be named CF, CA-R and CA-U. Every setting "
            "(contextbias.metrics in the config schema) comes from --preset; the four "
            "setting flags below override it."
        ),
    )
    m.add_argument(
        "--attributes",
        required=True,
        metavar="PATH",
        help="attributes table, long form (.parquet, .csv or .jsonl)",
    )
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
        "--single-label-bi",
        choices=["0", "1"],
        help="BI of a cell with one possible label (K = 1, where 1 - H/log K is 0/0): '0' "
        "(default; the released code, hence the paper's numbers) or '1' (fully "
        "concentrated)",
    )
    m.add_argument(
        "--bootstrap-draws",
        choices=["paired", "unpaired"],
        help="roles drawn per bootstrap replicate: 'paired' (default) = one draw shared by "
        "every model and condition, so differences stay paired; 'unpaired' = a draw per "
        "model x condition, as the released code (reproduces its headline CI design)",
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
        "invariant with p = 1 (the 'All' row: preset key metrics.robustness_all). The "
        "others test each role against all other roles over the cells 'condition' (CF, "
        "CA-R, CA-U), 'variant' (condition x the `variant` column) or 'prompt' (condition x "
        "prompt_id)",
    )
    from stereolens.metrics.command import add_correct_commands

    add_correct_commands(
        cb_sub,
        "contextbias",
        _reader_inputs,
        _reader,
        _correct,
        metric="Bias Intensity (role-level, pooled, the mean over roles) and CCS",
    )
    _register_sample(cb_sub)


def _register_sample(cb_sub: argparse._SubParsersAction) -> None:
    """`stereolens contextbias reader-sample` and `human-labels` (the reader correction's
    human sample: annotation.sample_design)."""
    from stereolens.metrics.command import add_sample_commands

    p, h = add_sample_commands(
        cb_sub,
        "contextbias",
        _reader_inputs,
        _run_sample,
        _human_labels,
        form="a blinded form of one image per set, its key",
        pilot=("these images", "a generator's"),
        example="reader_sample: {target_width: 0.05, disagreement: 0.14, allocation: "
        "neyman, seed: 0}",
        unit="images",
    )
    p.add_argument("--dimensions", nargs="+", metavar="DIM", help="dimensions asked")
    p.add_argument("--image-root", metavar="DIR", help="resolve relative image paths here")
    h.add_argument("--key", required=True, metavar="PATH", help="the form's key.parquet")
    h.add_argument("--schema", metavar="PATH", help="attribute schema YAML (default: shipped)")


def _run_sample(args: argparse.Namespace) -> int:
    import polars as pl

    from stereolens.contextbias.annotation import sample_design as csd
    from stereolens.contextbias.metrics import use_label_column
    from stereolens.metrics import sample_design as sd
    from stereolens.metrics.command import preset_section, print_allocation
    from stereolens.metrics.human_labels import read_human_labels

    attributes = use_label_column(pl.read_parquet(args.attributes), args.label_column)
    images = pl.read_parquet(args.images) if args.images else None
    if images is None:
        raise SystemExit("contextbias reader-sample: --images is needed (the image paths)")
    from stereolens.contextbias.schema import AttributeSchema

    schema = AttributeSchema.load(args.schema)
    design = preset_section("contextbias", args)["reader_sample"]
    disagreement: float | pl.DataFrame = design["disagreement"]
    if args.pilot_human:
        from stereolens.contextbias.corrected import reader_table

        reader = reader_table(attributes, images)
        strata = reader.select("model", "stratum").unique()
        disagreement, _ = sd.disagreement_rates(
            reader, read_human_labels(args.pilot_human), strata, design["disagreement"]
        )
    paths = csd.export_reader_sample(
        images,
        attributes,
        args.out,
        target_width=design["target_width"],
        disagreement=disagreement,
        allocation=design["allocation"],
        dimensions=args.dimensions,
        seed=design["seed"],
        schema=schema,
        image_root=args.image_root,
    )
    print_allocation(paths, ["model"], _allocation_line, "images")
    return 0


def _allocation_line(key: tuple, part, state: str) -> str:
    return (
        f"{key[0]}: {part['n_human'].sum():,} of {part['n_items'].sum():,} images in "
        f"{part.height} strata, planned width {part['width'][0]:.4f}{state}"
    )


def _human_labels(args: argparse.Namespace):
    from stereolens.contextbias.annotation.sample_design import human_labels_from_answers
    from stereolens.contextbias.schema import AttributeSchema

    return human_labels_from_answers(
        args.answers, args.key, args.template, AttributeSchema.load(args.schema)
    )


def _reader_inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--attributes", required=True, metavar="PATH", help="attributes table (long form)"
    )
    p.add_argument("--images", metavar="PATH", help="images table (the extracted images)")
    p.add_argument("--schema", metavar="PATH", help="attribute schema YAML (default: shipped)")
    p.add_argument("--label-column", default="auto", metavar="COL", help="as `contextbias metrics`")


def _reader(args: argparse.Namespace, section: dict):
    """The reader table of `contextbias correct` (contextbias.corrected.reader_table)."""
    from stereolens.contextbias.corrected import reader_table

    schema, attributes, images = _read_inputs(args)
    args.attribute_schema = schema  # the K of k_definition vocabulary
    return reader_table(attributes, images)


def _correct(reader, human, section: dict, args: argparse.Namespace):
    from stereolens.contextbias.corrected import NOT_CORRECTED, corrected_table
    from stereolens.contextbias.settings import ContextBiasSettings
    from stereolens.metrics.command import correction_options

    for why in NOT_CORRECTED.values():
        print(f"contextbias: {why}")
    return corrected_table(
        reader,
        human,
        k_definition=section["metrics"]["k_definition"],
        single_label_bi=float(section["metrics"]["single_label_bi"]),
        schema=args.attribute_schema,
        min_count=ContextBiasSettings.from_config(section).ccs_min_count,
        overall=ContextBiasSettings.from_config(section).overall,
        **correction_options(section),
    )
