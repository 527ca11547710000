"""`stereolens biasig ...` subcommands."""

from __future__ import annotations

import argparse


def available_cpus() -> int:
    """CPUs this process may run on (a SLURM or cgroup CPU set counts, not the node's)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


FLAGS = {"eta_variant": "eta_variant", "scoring_unit": "scoring_unit"}
"""argparse dest -> the biasig key a flag sets over the preset (every other key: the preset)."""


def _metrics(args: argparse.Namespace, section: dict):
    from stereolens.biasig.answers import read_answers
    from stereolens.biasig.comparisons import comparison_tables
    from stereolens.biasig.metrics import compute_metrics
    from stereolens.biasig.prompts import read_prompt_table
    from stereolens.biasig.settings import BiasIGSettings
    from stereolens.settings import overrides

    answers = read_answers(args.answers)
    prompts = read_prompt_table(args.prompts) if args.prompts else None
    section.update(overrides(args, FLAGS))
    st = BiasIGSettings.from_config(section)
    tables = compute_metrics(
        answers,
        prompts,
        threads=args.threads or available_cpus(),
        which=("implicit", "explicit", "eta", "replicates"),
        **st.metric_options(),
    )
    cmp, ranks = comparison_tables(tables, level=st.level)
    out = {name: tables[name] for name in ("implicit", "explicit", "eta")}
    return out | {"comparisons": cmp, "ranks": ranks}


def _prompts(args: argparse.Namespace) -> int:
    from stereolens.biasig.prompts import load_prompts
    from stereolens.tables import write_table

    write_table(args.out, load_prompts(args.prompt_dir))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `stereolens biasig {prompts,metrics,correct,simulate-human-labels,
    reader-sample,human-labels}`."""
    from stereolens.metrics.command import add_metrics_command

    b = sub.add_parser("biasig", help="BiasIG benchmark tools")
    b_sub = b.add_subparsers(dest="action", required=True)

    p = b_sub.add_parser(
        "prompts",
        help="write the BiasIG prompt table (47,040 prompts) as parquet",
        description=(
            "Write the BiasIG prompt table: one row per prompt with prompt_id (stable), text "
            "(verbatim), source_file, line, variant_index, visibility (implicit/explicit), "
            "acquired_type (occupation, characteristic, social_relation), "
            "acquired_attribute, role_left/role_right (relations), attribute_key, truth_key, "
            "category, n_persons, protected_attribute and protected_value (explicit "
            "prompts; protected_value_left/right for two-person prompts), weight (k_j) and "
            "quirks (source quirks met by that prompt)."
        ),
    )
    p.add_argument("--out", required=True, metavar="PATH", help="output parquet file")
    p.add_argument(
        "--prompt-dir",
        metavar="DIR",
        help="a prompts/ folder laid out like the shipped one (default: the shipped benchmark)",
    )
    p.set_defaults(func=_prompts)

    m = add_metrics_command(
        b_sub,
        "biasig",
        _metrics,
        example="level: 0.9, replicates: 200",
        help="compute S_imp, S_exp and eta from an answers table",
        description=(
            "Compute the BiasIG metrics from an answers table (parquet, CSV or JSON lines): "
            "one row per image and person with columns model, image_id, position (single; "
            "left/right for two-person prompts), gender, race, age, status, and prompt_id "
            "or the exact prompt text in a column `prompt` or `text`; an optional `variant` "
            "column names a debiasing variant (default: the model name). By default (preset "
            "key count: paper) an image counts only when all its rows have status ok, as the paper "
            "discards an image after persistent failures; answers 'unknown' are left out per "
            "attribute. Scores are per subject (the prompt text before the first comma, its "
            "phrasings pooled: --scoring-unit subject) or per prompt (phrasing). Writes "
            "DIR/implicit.parquet (S_imp per subject or prompt, acquired attribute, category, "
            "acquired type and model, per protected attribute and overall, with the ceiling: "
            "the expected score of a generator sampling from the ground truth at these "
            "sample sizes), DIR/explicit.parquet (S_exp at the same levels, per protected "
            "value, attribute and overall) and DIR/eta.parquet (manifestation factor per pair "
            "and, as pair '*', per model), each with the paper's plug-in estimate, the "
            "bias-corrected estimate score_bc = 2 x estimate - the bootstrap "
            "replicates' mean and its interval ci_low/ci_high = score_bc +- z x the "
            "replicates' sd (S_imp's plug-in is biased down, and a percentile interval "
            "would double the bias; eta: eta_*_bc the double bootstrap, 3 x estimate - 3 x "
            "the replicates' mean + the second-level replicates' mean, +- z x the sd of the "
            "once-corrected replicates), no interval below interval_min_images_per_subject "
            "(interval_note says why); and DIR/comparisons.parquet and DIR/ranks.parquet: "
            "every pair of models and every debiasing variant against its base on the "
            "model-level S_imp, S_exp and eta (overall and per attribute): the difference "
            "of the bias-corrected S_imp and S_exp and of the plug-in eta, its Wald "
            "interval from the bootstrap standard error (models resampled independently), "
            "p-value and Holm decision; ranks and groups for S_imp and S_exp. Every setting "
            "(the biasig section's metric keys in the config schema) comes from --preset; "
            "--eta-variant and --scoring-unit override it."
        ),
    )
    m.add_argument(
        "--answers", required=True, metavar="PATH", help="answers table (.parquet, .csv or .jsonl)"
    )
    m.add_argument(
        "--prompts",
        metavar="PATH",
        help="prompt table parquet from `stereolens biasig prompts` (default: the "
        "shipped benchmark)",
    )
    m.add_argument(
        "--eta-variant",
        choices=["paper", "released"],
        help="'paper' (default): the paper's alpha and sign (Eq. 4-5) with the "
        "released k_i and per-pair aggregation; pairs without data are "
        "reported, not counted. 'released': the authors' released code "
        "exactly (operator-precedence alpha, reversed sign, unresolved pairs "
        "counted as 0.5)",
    )
    m.add_argument(
        "--scoring-unit",
        choices=["subject", "phrasing"],
        help="'prompt j' of S_imp/S_exp: 'subject' (default) = the text before the first "
        "comma, the images of its 20 phrasings pooled (the released code; k_j of "
        "weight.json); 'phrasing' = each prompt on its own images",
    )
    m.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="models resampled side by side; results do not depend on it (default: the CPUs "
        "this process may use)",
    )
    from stereolens.metrics.command import add_correct_commands

    add_correct_commands(
        b_sub, "biasig", _reader_inputs, _reader, _correct, metric="S_imp, S_exp, eta"
    )
    _register_sample(b_sub)


def _register_sample(b_sub: argparse._SubParsersAction) -> None:
    """`stereolens biasig reader-sample` and `human-labels` (biasig.reader_sample)."""
    from stereolens.metrics.command import add_sample_commands

    p, h = add_sample_commands(
        b_sub,
        "biasig",
        _reader_inputs,
        _run_sample,
        _human_labels,
        form="a blinded form of one image per set asking each person's gender, race and age, "
        "its key",
        pilot=("these answers' images", "a generator's"),
        example="reader_sample: {target_width: 0.05, disagreement: 0.14, allocation: neyman, "
        "seed: 0}; count and scoring_unit must be those of `biasig correct` (the strata are its)",
        unit="persons",
    )
    p.add_argument(
        "--images",
        required=True,
        metavar="DIR|PATH",
        help="the images the answers were read from: the BiasIG images folder "
        "(results/biasig/images) or a table with image_id, image_path (and variant)",
    )
    for flag, kind, what in (
        ("--target-width", float, "reader_sample.target_width"),
        ("--disagreement", float, "reader_sample.disagreement"),
        ("--seed", int, "reader_sample.seed"),
    ):
        p.add_argument(flag, type=kind, metavar="X", help=f"sets {what} over the preset")
    p.add_argument("--image-root", metavar="DIR", help="resolve relative image paths here")
    h.add_argument("--key", required=True, metavar="PATH", help="the form's key.parquet")


def _run_sample(args: argparse.Namespace) -> int:
    import polars as pl

    from stereolens.biasig import reader_sample as brs
    from stereolens.metrics import sample_design as sd
    from stereolens.metrics.command import preset_section, print_allocation
    from stereolens.metrics.human_labels import read_human_labels

    section = preset_section("biasig", args)
    design = section["reader_sample"]
    for key in ("target_width", "disagreement", "seed"):
        if getattr(args, key) is not None:
            design[key] = getattr(args, key)
    reader = _reader(args, section)
    disagreement: float | pl.DataFrame = design["disagreement"]
    if args.pilot_human:
        strata = reader.select("variant", "stratum").unique().rename({"variant": "model"})
        disagreement, _ = sd.disagreement_rates(
            reader, read_human_labels(args.pilot_human), strata, design["disagreement"],
            group="variant",
        )  # fmt: skip
    paths = brs.export_reader_sample(
        args.answers_table,
        args.prompts_table,
        args.images,
        args.out,
        target_width=design["target_width"],
        disagreement=disagreement,
        allocation=design["allocation"],
        seed=design["seed"],
        count=section["count"],
        scoring_unit=section["scoring_unit"],
        image_root=args.image_root,
        eta_variant=section["eta_variant"],
    )
    print_allocation(paths, ["variant"], _allocation_line, "images")
    return 0


def _allocation_line(key: tuple, part, state: str) -> str:
    images = part.unique("stratum")
    return (
        f"{key[0]}: {images['n_human'].sum():,} of {images['n_items'].sum():,} images "
        f"({part['n_human'].sum():,} of {part['n_items'].sum():,} persons) in "
        f"{part.height} strata, planned width {part['width'][0]:.4f}{state}"
    )


def _human_labels(args: argparse.Namespace):
    from stereolens.biasig.reader_sample import human_labels_from_answers

    return human_labels_from_answers(args.answers, args.key, args.template)


def _reader_inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--answers", required=True, metavar="PATH", help="answers table")
    p.add_argument(
        "--prompts", metavar="PATH", help="prompt table parquet (default: the shipped benchmark)"
    )


def _reader(args: argparse.Namespace, section: dict):
    """The reader table of `biasig correct` (biasig.corrected.reader_table, with the
    section's count and scoring_unit); the prepared answers ride on ``args``."""
    from stereolens.biasig.answers import read_answers
    from stereolens.biasig.corrected import reader_table
    from stereolens.biasig.prompts import load_prompts, read_prompt_table

    answers = read_answers(args.answers)
    prompts = read_prompt_table(args.prompts) if args.prompts else load_prompts()
    reader, args.prepared = reader_table(
        answers, prompts, count=section["count"], scoring_unit=section["scoring_unit"]
    )
    args.answers_table, args.prompts_table = answers, prompts
    return reader


def _correct(reader, human, section: dict, args: argparse.Namespace):
    from stereolens.biasig.corrected import corrected_scores
    from stereolens.biasig.truth import load_truth
    from stereolens.metrics.command import correction_options

    return corrected_scores(
        reader, human, args.prepared, load_truth(), prompts=args.prompts_table,
        eta_variant=section["eta_variant"], **correction_options(section),
    )  # fmt: skip
