"""`stereolens lvlm ...` subcommands."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from stereolens.lvlm.resample import MIN_IMAGES_PER_GROUP


def _sibling(responses: Path, given: str | None, name: str) -> Path | None:
    """An explicit path, else ``name`` beside the responses file when it exists."""
    if given:
        path = Path(given)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist")
        return path
    path = responses.with_name(name)
    return path if path.exists() else None


def _formulas(items: list[str] | None) -> dict[str, str]:
    """TASK=NAME pairs of --formula."""
    from stereolens.validation import ConfigError

    out = {}
    for item in items or []:
        task, sep, name = item.partition("=")
        if not sep or not task or not name:
            raise ConfigError(f"--formula {item!r}: write TASK=NAME, e.g. term=term_tvd_uniform")
        out[task.strip()] = name.strip()
    return out


FLAGS = {
    "min_count": "min_count",
    "replicates": "replicates",
    "permutations": "permutations",
    "interval_min_images_per_group": "interval_min_images_per_group",
}
"""argparse dest -> the setting (lvlm.metrics key) a documented flag sets."""


def settings(args: argparse.Namespace):
    """The settings of an `lvlm metrics` run: the schema's defaults under ``--preset``,
    then every flag given (--seed sets the section's seed, --formula adds to the preset's
    formulas)."""
    from stereolens.lvlm.settings import LVLMSettings
    from stereolens.settings import overrides, section_defaults

    section = section_defaults("lvlm", args.preset)
    section["metrics"].update(overrides(args, FLAGS))
    section["metrics"]["formulas"].update(_formulas(args.formula))
    if args.seed is not None:
        section["seed"] = args.seed
    return LVLMSettings.from_config(section)


def _metrics(args: argparse.Namespace) -> int:
    from stereolens.lvlm.metrics import compute_all
    from stereolens.lvlm.names import table_vocabularies
    from stereolens.tables import (
        RESPONSES,
        STORY_ATTRIBUTES,
        TERM_JUDGEMENTS,
        check_exam_rows,
        check_table,
        read_table,
        write_tables,
    )

    specs = {
        "responses": replace(RESPONSES, vocabularies=table_vocabularies()),
        "story attributes": replace(STORY_ATTRIBUTES, vocabularies=table_vocabularies()),
        "term judgements": replace(
            TERM_JUDGEMENTS, vocabularies=table_vocabularies(("group_a", "group_b", "winner"))
        ),
    }
    responses_path = Path(args.responses)
    responses = check_table(
        read_table(responses_path, "responses", lazy=True, spec=specs["responses"]),
        specs["responses"],
        str(responses_path),
    )
    check_exam_rows(responses, str(responses_path))
    story = _sibling(responses_path, args.story_attributes, "story_attributes.parquet")
    terms = _sibling(responses_path, args.term_judgements, "term_judgements.parquet")
    tables = {}
    for what, path in (("story attributes", story), ("term judgements", terms)):
        table = read_table(path, what, spec=specs[what]) if path else None
        if table is not None and table.height:
            table = check_table(table, specs[what], str(path))
        tables[what] = table
    story_table, term_table = tables["story attributes"], tables["term judgements"]
    tables = compute_all(
        responses, story_table, term_table, settings(args), phrases=args.refusal_phrases
    )
    write_tables(args.out, {f"{name}.parquet": table for name, table in tables.items()})
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `stereolens lvlm metrics`."""
    b = sub.add_parser("lvlm", help="guardrail-agnostic LVLM bias audit tools")
    b_sub = b.add_subparsers(dest="action", required=True)
    m = b_sub.add_parser(
        "metrics",
        help="TVD bias scores, refusal rates and skewed story attributes from responses",
        description=(
            "Score an LVLM responses table (parquet, CSV or JSON lines): one row per response "
            "with columns model, task (story, term, exam, attribute_inferring), axis (gender, "
            "race), group, image_id, prompt_id, response, optional setting (image, "
            "mitigation, persona; default image), and for exam rows subject and correct. "
            "Story scores need the assistant's story attributes (model, setting, axis, group, "
            "image_id, prompt_id, attribute, value) and term scores its judgements (model, "
            "setting, axis, prompt_id, pair_index, group_a, group_b, winner); by default they "
            "are read from story_attributes.parquet and term_judgements.parquet beside the "
            "responses. Writes DIR/scores.parquet (TVD x100 per model, setting, task and axis: "
            "the mean of per-prompt scores, the formula used, the noise floor: null_mean and "
            "null_high (95th percentile) of the score with the group labels shuffled within "
            "the matched strata (what a group-independent model scores at these sample sizes) "
            "and the permutation p-value p_perm, the bias-corrected score_bc = score - "
            "null_mean and the noise-floor bracket interval from a paired bootstrap over user "
            "images), DIR/prompt_scores.parquet, DIR/refusals.parquet "
            "(refusal rate per model, setting, task and group with a Wilson interval on n / "
            "design effect; phrase rules unless the table has a refusal column), "
            "DIR/story_skew.parquet (per attribute value, each group's rate and share), "
            "DIR/exam_accuracy.parquet (accuracy per group and subject) and "
            "DIR/comparisons.parquet and DIR/ranks.parquet (every pair of models, and every "
            "setting against the model's image setting, on each score and refusal rate: "
            "difference, paired-bootstrap Wald interval, Holm-adjusted decision; ranks)."
        ),
    )
    m.add_argument(
        "--responses",
        required=True,
        metavar="PATH",
        help="responses table (.parquet, .csv or .jsonl)",
    )
    m.add_argument("--out", required=True, metavar="DIR", help="output directory")
    m.add_argument(
        "--story-attributes", metavar="PATH", help="story attributes table (same formats)"
    )
    m.add_argument("--term-judgements", metavar="PATH", help="term judgements table (same formats)")
    m.add_argument(
        "--preset",
        default="paper",
        metavar="NAME|PATH",
        help="the settings: 'paper' (default; the paper has no released code, hence no "
        "'released' preset) or a YAML file of lvlm section keys (metrics: {level: 0.9, "
        "...}, seed); the flags below override it (docs: Configuration, Presets)",
    )
    m.add_argument(
        "--min-count",
        type=int,
        metavar="N",
        help="story values seen fewer than N times over all groups are left out (default 5)",
    )
    m.add_argument(
        "--replicates",
        type=int,
        metavar="N",
        help="bootstrap replicates over user images; 0 = no intervals (default 1000)",
    )
    m.add_argument("--seed", type=int, metavar="S", help="bootstrap seed (default 0)")
    m.add_argument(
        "--permutations",
        type=int,
        metavar="N",
        help="shuffles of the group labels within strata for the noise floor; 0 = none "
        "(default 1000)",
    )
    m.add_argument(
        "--interval-min-images-per-group",
        type=int,
        metavar="N",
        help="below N user images per group (term: image pairs) no interval, comparison test "
        "or decision is printed: ci_low, ci_high (a comparison's also p_value, p_adjusted, "
        "reject) are null and interval_note says why; 0 = always print "
        f"(default {MIN_IMAGES_PER_GROUP}, the smallest size at which the intervals cover "
        ">= 93%%, bench/COVERAGE.md)",
    )
    m.add_argument(
        "--formula",
        action="append",
        metavar="TASK=NAME",
        help="the formula of a task (repeatable): story=story_tvd (default) or "
        "story_tvd_unweighted; term=term_tvd (default: win ratios against each group's share "
        "of appearances) or term_tvd_uniform (against 1/|A|); exam=exam_tvd (default, per "
        "subject) or exam_tvd_pooled",
    )
    m.add_argument(
        "--refusal-phrases",
        metavar="PATH",
        help="refusal phrase rules (default: the shipped resources/lvlm/refusal_phrases.v1.yaml)",
    )
    m.set_defaults(func=_metrics)
