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


def add_metrics_command(
    sub: argparse._SubParsersAction,
    benchmark: str,
    compute: Callable[[argparse.Namespace, dict[str, Any]], Mapping[str, Any]],
    *,
    help: str,
    description: str,
    example: str,
) -> argparse.ArgumentParser:
    """Add `metrics` with ``--out DIR`` and ``--preset`` to ``sub``; the caller adds its
    inputs. ``compute(args, section)`` (``section``: the benchmark's config section as the
    schema's defaults fill it under the preset) returns file stem -> table, and nothing is
    written before it returns, so a failure leaves no partial set of tables."""
    from stereolens.benchmark import benchmark as plugin

    folder = plugin(benchmark).presets
    names = sorted(p.stem for p in Path(folder).glob("*.yaml")) if folder else ["paper"]
    m = sub.add_parser("metrics", help=help, description=description)
    m.add_argument("--out", required=True, metavar="DIR", help="output directory")
    m.add_argument(
        "--preset",
        action="append",
        metavar="NAME|PATH|JSON",
        help=PRESET_HELP.format(names=", ".join(names), benchmark=benchmark, example=example),
    )
    m.set_defaults(func=partial(run_metrics, benchmark, compute))
    return m


def run_metrics(
    benchmark: str,
    compute: Callable[[argparse.Namespace, dict[str, Any]], Mapping[str, Any]],
    args: argparse.Namespace,
) -> int:
    """Settings, compute, write: the body of every `<benchmark> metrics` run."""
    from stereolens.settings import DEFAULT_PRESET, section_defaults, stacked_presets
    from stereolens.tables import write_tables

    args.preset = args.preset or [DEFAULT_PRESET]
    section = section_defaults(benchmark, stacked_presets(benchmark, args.preset))
    tables = compute(args, section)
    write_tables(args.out, {f"{name}.parquet": table for name, table in tables.items()})
    return 0


def read_checked(path: str | Path, what: str, spec, *, read_spec=None, then=None, **read):
    """The table at ``path`` (parquet, CSV or JSON lines, by suffix) read with the column
    types of ``read_spec`` (default ``spec``; ``read``: read_table's lazy, columns), passed
    through ``then`` if given, and checked against ``spec`` (stereolens.tables)."""
    from stereolens.tables import check_table, read_table

    table = read_table(path, what, spec=read_spec or spec, **read)
    return check_table(then(table) if then else table, spec, str(path))
