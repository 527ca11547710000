"""The frame of every benchmark's `stereolens <benchmark> metrics`: the settings read once
from ``--preset``, the inputs read and checked, every table computed, then all written."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

PRESET_HELP = (
    "the settings: a shipped preset ({names}; default paper), a YAML file of {benchmark} "
    "section keys (every key the schema gives the section, e.g. {example}), or the same "
    "mapping as JSON text (what the workflow's rule passes); repeatable, each on top of "
    "the ones before it. docs: Configuration, Presets"
)


def add_preset_option(parser: argparse.ArgumentParser, benchmark: str, example: str) -> None:
    """``--preset`` (repeatable), its help naming the benchmark's shipped presets."""
    from stereolens.benchmark import benchmark as plugin

    folder = plugin(benchmark).presets
    names = sorted(p.stem for p in Path(folder).glob("*.yaml")) if folder else ["paper"]
    parser.add_argument(
        "--preset",
        action="append",
        metavar="NAME|PATH|JSON",
        help=PRESET_HELP.format(names=", ".join(names), benchmark=benchmark, example=example),
    )


def add_metrics_command(
    sub: argparse._SubParsersAction,
    benchmark: str,
    compute: Callable[[argparse.Namespace, dict[str, Any]], Mapping[str, Any]],
    *,
    help: str,
    description: str,
    example: str,
) -> argparse.ArgumentParser:
    """Add `metrics` (``--out DIR``, ``--preset``; the caller adds its inputs) to ``sub``:
    ``compute(args, section)`` returns file stem -> table, all written after it returns."""
    m = sub.add_parser("metrics", help=help, description=description)
    m.add_argument("--out", required=True, metavar="DIR", help="output directory")
    add_preset_option(m, benchmark, example)
    m.set_defaults(func=partial(run_metrics, benchmark, compute))
    return m


def run_metrics(
    benchmark: str,
    compute: Callable[[argparse.Namespace, dict[str, Any]], Mapping[str, Any]],
    args: argparse.Namespace,
) -> int:
    """Settings, compute, write: the body of every `<benchmark> metrics` run."""
    from stereolens.tables import write_tables

    tables = compute(args, preset_section(benchmark, args))
    write_tables(args.out, {f"{name}.parquet": table for name, table in tables.items()})
    return 0


def read_checked(path: str | Path, what: str, spec, *, read_spec=None, then=None, **read):
    """The table at ``path`` read with ``read_spec``'s types (default ``spec``), passed
    through ``then`` if given, and checked against ``spec``."""
    from stereolens.tables import check_table, read_table

    table = read_table(path, what, spec=read_spec or spec, **read)
    return check_table(then(table) if then else table, spec, str(path))


def add_correct_commands(
    sub: argparse._SubParsersAction,
    benchmark: str,
    add_inputs: Callable[[argparse.ArgumentParser], None],
    reader: Callable[[argparse.Namespace, dict[str, Any]], Any],
    correct: Callable[[Any, Any, dict[str, Any], argparse.Namespace], Any],
    *,
    metric: str,
) -> None:
    """Add `correct` (DIR/corrected.parquet) and `simulate-human-labels` to ``sub``:
    ``add_inputs`` adds the record inputs to both, ``reader(args, section)`` builds the
    reader table, ``correct(reader, human, section, args)`` returns (table, cells left
    out)."""
    c = sub.add_parser(
        "correct",
        help=f"{metric} corrected for the reader's errors from human labels",
        description=(
            f"The {benchmark} {metric} naive (the reader's labels) and corrected for the "
            "reader's errors (prediction-powered inference on the label shares from a "
            "human-labelled probability sample of the same items, a bootstrap over both "
            "samples), with intervals: DIR/corrected.parquet (docs/outputs.md; method and "
            "assumptions: docs/statistics.md, 'Correcting for the reader's errors'). Cells "
            "whose sampling strata have fewer than 2 human labels are left out and listed."
        ),
    )
    c.add_argument(
        "--human",
        required=True,
        metavar="PATH",
        help="human-label table (.parquet, .csv or .tsv): item_id, attribute, label, stratum, "
        "selection_probability",
    )
    c.add_argument("--out", required=True, metavar="DIR", help="output directory")
    s = sub.add_parser(
        "simulate-human-labels",
        help="a SIMULATED human-label table from the reader's labels (demonstration only)",
        description=(
            "A simulated human-label table for a demonstration of `correct` (the embedded "
            "default): a stratified simple random sample of the reader's items "
            "(reader_correction.sample_fraction per stratum, at least 2) whose labels are "
            "the reader's, a seeded reader_correction.flip_fraction of them replaced by "
            "another label; columns simulated (true) and flipped mark it. Never evidence "
            "about a reader."
        ),
    )
    s.add_argument("--out", required=True, metavar="PATH", help="the table (.parquet)")
    for p in (c, s):
        add_inputs(p)
        add_preset_option(p, benchmark, "reader_correction: {replicates: 200}")
    c.set_defaults(func=partial(_run_correct, benchmark, reader, correct))
    s.set_defaults(func=partial(_run_simulate, benchmark, reader))


def preset_section(benchmark: str, args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark's config section with its defaults under ``args.preset`` (default paper)."""
    from stereolens.settings import DEFAULT_PRESET, section_defaults, stacked_presets

    args.preset = args.preset or [DEFAULT_PRESET]
    return section_defaults(benchmark, stacked_presets(benchmark, args.preset))


def _run_correct(benchmark, reader, correct, args: argparse.Namespace) -> int:
    """Settings, the reader and human tables, correct, write corrected.parquet."""
    from stereolens.metrics.human_labels import read_human_labels
    from stereolens.tables import write_tables

    section = preset_section(benchmark, args)
    human = read_human_labels(args.human)
    table, left_out = correct(reader(args, section), human, section, args)
    opts = section["reader_correction"]
    print(
        f"{benchmark}: {table.height} corrected rows from {human['item_id'].n_unique()} "
        f"human-labelled items; lam {opts['lam']}, off-simplex {opts['off_simplex']}, "
        f"{opts['replicates']} replicates ({opts['interval']}), seed {opts['seed']}"
    )
    if left_out.height:
        print(f"left out {left_out.height} cells with fewer than 2 human labels in a stratum:")
        print(left_out)
    write_tables(args.out, {"corrected.parquet": table})
    return 0


def add_sample_commands(
    sub: argparse._SubParsersAction,
    benchmark: str,
    add_inputs: Callable[[argparse.ArgumentParser], None],
    run_sample: Callable[[argparse.Namespace], int],
    human_labels: Callable[[argparse.Namespace], Any],
    *,
    form: str,
    pilot: tuple[str, str],
    example: str,
    unit: str,
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """Add `reader-sample` (``run_sample``) and `human-labels` (``human_labels(args)``) to
    ``sub``; returns the two parsers for the caller's own options."""
    p = sub.add_parser(
        "reader-sample",
        help=f"draw the human sample of the reader correction: {form}, the human-label "
        "template and the allocation (docs/statistics.md, 'Designing the human sample')",
    )
    add_inputs(p)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the forms and files")
    add_preset_option(p, benchmark, example)
    p.add_argument(
        "--pilot-human",
        metavar="PATH",
        help=f"a pilot's human-label table of {pilot[0]}: its disagreement per stratum (the "
        f"worst attribute; {pilot[1]} pooled rate where a stratum has fewer than 20 pairs)",
    )
    p.set_defaults(func=run_sample)
    h = sub.add_parser(
        "human-labels",
        help="the human-label table (item_id, attribute, label, stratum, "
        "selection_probability) of filled reader-sample forms, for "
        f"`{benchmark} correct --human` ({benchmark}.reader_correction.human_labels)",
    )
    h.add_argument("--answers", nargs="+", required=True, metavar="CSV", help="saved answers")
    h.add_argument("--template", required=True, metavar="PATH", help="human_labels_template.csv")
    h.add_argument("--out", required=True, metavar="PATH", help=".parquet or .csv to write")
    h.set_defaults(func=partial(_run_human_labels, human_labels, unit))
    return p, h


def _run_human_labels(human_labels, unit: str, args: argparse.Namespace) -> int:
    from stereolens.atomic import write_parquet_or_csv

    table = human_labels(args)
    write_parquet_or_csv(args.out, table)
    print(f"{table.height} human labels of {table['item_id'].n_unique()} {unit}: {args.out}")
    return 0


def print_allocation(paths: Mapping[str, Any], by: list[str], describe, noun: str) -> None:
    """What `reader-sample` drew, one line per ``by`` group of its allocation table
    (``describe(key, part, state)`` words it), then the files it wrote."""
    import polars as pl

    allocation = pl.read_parquet(paths["design"])
    for key, part in allocation.group_by(*by, maintain_order=True):
        state = "" if part["reachable"].all() else f" (target width not reachable: all {noun})"
        print(describe(key, part, state))
    print("\n".join(f"{k}: {v}" for k, v in paths.items()))


SIMULATE_SETTINGS = (
    "reader_correction.sample_fraction",
    "reader_correction.flip_fraction",
    "reader_correction.seed",
)
"""The reader_correction keys `simulate-human-labels` reads (all the workflow's simulate
rules pass, so other correction settings do not redraw the simulated labels)."""


def _run_simulate(benchmark, reader, args: argparse.Namespace) -> int:
    from stereolens.metrics.corrected_tables import simulate_human_labels
    from stereolens.tables import write_table

    section = preset_section(benchmark, args)
    opts = section["reader_correction"]
    table = simulate_human_labels(
        reader(args, section), opts["sample_fraction"], opts["flip_fraction"], opts["seed"]
    )
    print(
        f"SIMULATED human labels: {table['item_id'].n_unique()} items, "
        f"{table.filter('flipped').height} labels flipped (flip_fraction "
        f"{opts['flip_fraction']}, seed {opts['seed']})"
    )
    write_table(args.out, table)
    return 0


def correction_options(section: dict[str, Any]) -> dict[str, Any]:
    """corrected_metric's keywords from a section's reader_correction keys."""
    opts = section["reader_correction"]
    return {k: opts[k] for k in ("replicates", "seed", "lam", "off_simplex", "interval")}


def check_reader_correction(section: dict, benchmark: str) -> None:
    """human_labels and simulate exclude each other; a human-label table must exist."""
    if section["human_labels"] and section["simulate"]:
        from stereolens.validation import ConfigError

        raise ConfigError(
            f"{benchmark}.reader_correction: human_labels and simulate are both set; "
            "simulate (a demonstration) is for runs without human labels: drop one"
        )
    path = section["human_labels"]
    if path and not Path(path).is_file():
        from stereolens.validation import ConfigError

        raise ConfigError(
            f"{benchmark}.reader_correction.human_labels: {path} is not a file "
            "(a .parquet, .csv or .tsv human-label table; docs/statistics.md)"
        )


def corrects_reader(section: dict) -> bool:
    """The benchmark writes its corrected table (human labels given or simulated)."""
    rc = section["reader_correction"]
    return bool(rc["human_labels"] or rc["simulate"])


def reader_report_paths(key: str, layout) -> dict[str, str]:
    """The report's names of a benchmark's corrected table and simulated human labels
    (``<key>_corrected``, ``<key>_human_labels_simulated``; stereolens.report.reader)."""
    return {
        f"{key}_corrected": layout.corrected,
        f"{key}_human_labels_simulated": layout.human_labels_simulated,
    }


def reader_report_skip(key: str, section: dict) -> set[str]:
    """The names of :func:`reader_report_paths` a run with this config section does not write."""
    skip = set() if corrects_reader(section) else {f"{key}_corrected"}
    if not section["reader_correction"]["simulate"]:
        skip.add(f"{key}_human_labels_simulated")
    return skip
