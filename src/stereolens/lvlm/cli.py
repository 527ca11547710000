"""`stereolens lvlm ...` subcommands."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

SIBLINGS = {"story attributes": "story_attributes", "term judgements": "term_judgements"}
"""The tables a responses table's folder may hold beside it, by their file stem."""


def _sibling(responses: Path, stem: str) -> Path | None:
    """``stem`` beside the responses table (.parquet, .csv or .jsonl), None if absent."""
    for suffix in (".parquet", ".csv", ".jsonl"):
        if (path := responses.with_name(stem + suffix)).exists():
            return path
    return None


def _metrics(args: argparse.Namespace, section: dict):
    from stereolens.lvlm.metrics import compute_all
    from stereolens.lvlm.names import table_vocabularies
    from stereolens.lvlm.settings import LVLMSettings
    from stereolens.metrics.command import read_checked
    from stereolens.tables import (
        RESPONSES,
        STORY_ATTRIBUTES,
        TERM_JUDGEMENTS,
        check_exam_rows,
        check_table,
        read_table,
    )

    specs = {
        "responses": replace(RESPONSES, vocabularies=table_vocabularies()),
        "story attributes": replace(STORY_ATTRIBUTES, vocabularies=table_vocabularies()),
        "term judgements": replace(
            TERM_JUDGEMENTS, vocabularies=table_vocabularies(("group_a", "group_b", "winner"))
        ),
    }
    responses_path = Path(args.responses)
    responses = read_checked(responses_path, "responses", specs["responses"], lazy=True)
    check_exam_rows(responses, str(responses_path))
    tables = {}
    for what, stem in SIBLINGS.items():
        path = _sibling(responses_path, stem)
        table = read_table(path, what, spec=specs[what]) if path else None
        if table is not None and table.height:  # an empty table: the task did not run
            table = check_table(table, specs[what], str(path))
        tables[what] = table
    return compute_all(
        responses,
        tables["story attributes"],
        tables["term judgements"],
        LVLMSettings.from_config(section),
        phrases=section["refusal_phrases"],
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add `stereolens lvlm metrics`, `correct`, `simulate-human-labels`, `reader-sample`
    and `human-labels`."""
    from stereolens.metrics.command import add_metrics_command

    b = sub.add_parser("lvlm", help="guardrail-agnostic LVLM bias audit tools")
    b_sub = b.add_subparsers(dest="action", required=True)
    m = add_metrics_command(
        b_sub,
        "lvlm",
        _metrics,
        example="metrics: {level: 0.9, formulas: {term: term_tvd_uniform}}, seed: 1, "
        "refusal_phrases: my_rules.yaml",
        help="TVD bias scores, refusal rates and skewed story attributes from responses",
        description=(
            "Score an LVLM responses table (parquet, CSV or JSON lines): one row per response "
            "with columns model, task (story, term, exam, attribute_inferring), axis (gender, "
            "race), group, image_id, prompt_id, response, optional setting (image, "
            "mitigation, persona; default image), and for exam rows subject and correct. "
            "Story scores need the assistant's story attributes (model, setting, axis, group, "
            "image_id, prompt_id, attribute, value) and term scores its judgements (model, "
            "setting, axis, prompt_id, pair_index, group_a, group_b, winner), read from "
            "story_attributes and term_judgements (.parquet, .csv or .jsonl) beside the "
            "responses table. Writes DIR/scores.parquet (TVD x100 per model, setting, task "
            "and axis: the mean of per-prompt scores, the formula used, the noise floor: "
            "null_mean and null_high (95th percentile) of the score with the group labels "
            "shuffled within the matched strata (what a group-independent model scores at "
            "these sample sizes) "
            "and the permutation p-value p_perm, the bias-corrected score_bc = score - "
            "null_mean and the noise-floor bracket interval from a paired bootstrap over user "
            "images), DIR/prompt_scores.parquet, DIR/refusals.parquet "
            "(refusal rate per model, setting, task and group with a Wilson interval on n / "
            "design effect; phrase rules unless the table has a refusal column), "
            "DIR/story_skew.parquet (per attribute value, each group's rate and share), "
            "DIR/exam_accuracy.parquet (accuracy per group and subject) and "
            "DIR/comparisons.parquet and DIR/ranks.parquet (every pair of models, and every "
            "setting against the model's image setting, on each score and refusal rate: "
            "difference, paired-bootstrap Wald interval, Holm-adjusted decision; ranks). "
            "Every setting (lvlm.metrics, the section's seed and refusal_phrases in the "
            "config schema) comes from --preset."
        ),
    )
    m.add_argument(
        "--responses",
        required=True,
        metavar="PATH",
        help="responses table (.parquet, .csv or .jsonl)",
    )
    from stereolens.metrics.command import add_correct_commands

    add_correct_commands(
        b_sub, "lvlm", _reader_inputs, _reader, _correct, metric="story and term scores"
    )
    _register_sample(b_sub)


def _register_sample(b_sub: argparse._SubParsersAction) -> None:
    """`stereolens lvlm reader-sample` and `human-labels` (the reader correction's human
    sample: lvlm.reader_sample)."""
    from stereolens.metrics.command import add_sample_commands

    p, h = add_sample_commands(
        b_sub,
        "lvlm",
        _reader_inputs,
        _run_sample,
        _human_labels,
        form="blinded text forms of the drawn stories and term pairs, their keys",
        pilot=("these items", "a model and task's"),
        example="reader_sample: {target_width: 0.05, disagreement: {story: 0.14, term: "
        "0.03}, allocation: neyman, seed: 0}",
        unit="items",
    )
    p.add_argument(
        "--prompts", metavar="PATH", help="the prompts file the assistant read with (default: "
        "the shipped prompts.v1.yaml): the story questions and the judge's choices",
    )  # fmt: skip
    h.add_argument(
        "--key",
        nargs="+",
        required=True,
        metavar="PATH",
        help="the forms' key.parquet (story/key.parquet, term/key.parquet): each answer file "
        "is read against the key its set ids belong to",
    )


def _run_sample(args: argparse.Namespace) -> int:
    from stereolens.lvlm import reader_sample as lrs
    from stereolens.lvlm.tasks import load_prompts
    from stereolens.metrics.command import preset_section, print_allocation
    from stereolens.metrics.human_labels import read_human_labels
    from stereolens.tables import read_table

    design = preset_section("lvlm", args)["reader_sample"]
    path = Path(args.responses)
    responses = read_table(path, "responses")
    story, term = (
        read_table(p, what) if (p := _sibling(path, stem)) else None
        for what, stem in SIBLINGS.items()
    )
    disagreement = dict(design["disagreement"])
    if args.pilot_human:
        from stereolens.lvlm.corrected import readers_of

        disagreement = lrs.pilot_disagreement(
            readers_of(responses, story, term), read_human_labels(args.pilot_human), disagreement
        )
    paths = lrs.export_reader_sample(
        responses,
        story,
        term,
        args.out,
        target_width=design["target_width"],
        disagreement=disagreement,
        allocation=design["allocation"],
        seed=design["seed"],
        prompts=load_prompts(args.prompts),
    )
    print_allocation(paths, ["model", "task"], _allocation_line, "items")
    return 0


def _allocation_line(key: tuple, part, state: str) -> str:
    model, task = key
    unit = "stories" if task == "story" else "judged term pairs"
    return (
        f"{model} {task}: {part['n_human'].sum():,} of {part['n_items'].sum():,} {unit} "
        f"in {part.height} strata, planned width {part['width'][0]:.4f}{state}"
    )


def _human_labels(args: argparse.Namespace):
    from stereolens.lvlm.reader_forms import human_labels_from_answers

    return human_labels_from_answers(args.answers, args.key, args.template)


def _reader_inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--responses",
        required=True,
        metavar="PATH",
        help="responses table; story_attributes and term_judgements are read beside it",
    )


def _reader(args: argparse.Namespace, section: dict):
    """The story and term reader tables of `lvlm correct` (lvlm.corrected), kept on
    ``args``; their reader_correction columns together returned (one human table holds
    the labels of both)."""
    import polars as pl

    from stereolens.lvlm.corrected import story_reader, term_reader
    from stereolens.metrics.human_labels import READER_COLUMNS
    from stereolens.tables import read_table

    path = Path(args.responses)
    responses = read_table(path, "responses", columns=["model", "task", "axis", "group",
                           "image_id", "prompt_id", "setting"])  # fmt: skip
    story, term = (_sibling(path, stem) for stem in SIBLINGS.values())
    args.story = story_reader(read_table(story, "story attributes"), responses) if story else None
    args.term = term_reader(read_table(term, "term judgements")) if term else None
    parts = [t.select(*READER_COLUMNS) for t in (args.story, args.term) if t is not None]
    if not parts:
        raise ValueError(f"no story_attributes or term_judgements beside {path}")
    return pl.concat(parts)


def _correct(reader, human, section: dict, args: argparse.Namespace):
    from stereolens.lvlm.corrected import corrected_scores
    from stereolens.metrics.command import correction_options

    metrics = section["metrics"]
    return corrected_scores(
        args.story,
        args.term,
        human,
        min_count=metrics["min_count"],
        formulas=metrics["formulas"],
        **correction_options(section),
    )
