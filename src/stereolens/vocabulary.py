"""Closed vocabularies of table columns and :func:`vocabulary_key`, the one rule that reads a
value as an allowed one (docs/troubleshooting.md, "Labels and groups")."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stereolens.validation import ConfigError

if TYPE_CHECKING:
    import polars as pl
# polars is imported where it is used: the Snakefile imports the attribute schema (and so
# vocabulary_key) at parse time, and a parse stays light


def vocabulary_key(value: str) -> str:
    """The one normalisation rule of a closed vocabulary: surrounding whitespace removed,
    inner runs of whitespace made one space, case ignored (" Neutral" -> "neutral")."""
    return " ".join(str(value).split()).casefold()


@dataclass(frozen=True)
class Vocabulary:
    """The closed set of values of a text column (checked by tables.check_table):
    ``allowed``, or with ``by`` one set per value of column ``by`` (None: not checked);
    ``aliases`` (vocabulary_key form) -> allowed value; ``ignore``: values passed as they
    are; ``hint``: appended to the refusal."""

    column: str
    allowed: tuple[str, ...] | Mapping[str, tuple[str, ...] | None]
    by: str | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    ignore: frozenset[str] = frozenset()
    hint: str = ""

    def values(self, by_value: str | None) -> tuple[str, ...] | None:
        """The allowed values (those of ``by_value`` of column ``by``); None = open."""
        if self.by is None:
            return tuple(self.allowed)
        return self.allowed.get(by_value)


def rows_where(frame: pl.DataFrame, test: pl.Expr) -> tuple[int, list[int]]:
    """(how many rows pass ``test``, the first five of their numbers)."""
    import polars as pl

    hit = frame.select(pl.arg_where(test.fill_null(False)))
    rows = hit.to_series()
    return rows.len(), rows.head(5).to_list()


def conform(frame: pl.DataFrame, vocab: Vocabulary):
    """(mapping {(by value, value): allowed value} of the values :func:`vocabulary_key`
    reads as an allowed one, problems): one line per value outside ``vocab``."""
    import polars as pl

    col, by = vocab.column, vocab.by if vocab.by in frame.columns else None
    keys = [by, col] if by else [col]
    seen = frame.select(keys).unique(maintain_order=True).drop_nulls(col)
    mapping: dict[tuple, str] = {}
    problems = []
    for row in seen.iter_rows():
        b, raw = row if by else (None, row[0])
        allowed = vocab.values(b) if by or vocab.by is None else None
        if allowed is None or raw in allowed:
            continue
        key = vocabulary_key(raw)
        if key in vocab.ignore:
            continue
        hits = {a for a in allowed if vocabulary_key(a) == key}
        hits |= {vocab.aliases[key]} if key in vocab.aliases else set()
        if len(hits) == 1:
            mapping[(b, raw)] = hits.pop()
            continue
        test = pl.col(col) == raw
        test = test & (pl.col(by) == b) if by else test
        n, rows = rows_where(frame, test)
        scope = f" for {by} {b}" if by else ""
        shown = ", ".join(allowed[:12]) + (", ..." if len(allowed) > 12 else "")
        why = f"could each be any of {sorted(hits)}" if hits else "are outside its vocabulary"
        problems.append(
            f"column {col}: {n} row(s) {why}, value {raw!r}{scope} (rows {rows}); allowed: "
            f"{shown} (whitespace and case are ignored); fix or drop them"
            + (f"; {vocab.hint}" if vocab.hint else "")
        )
    return mapping, problems


def apply_mapping(frame, vocab: Vocabulary, mapping: dict):
    """``frame`` (eager or lazy) with ``mapping`` of :func:`conform` applied, order kept."""
    import polars as pl

    if not mapping:
        return frame
    col = vocab.column
    if vocab.by is None or all(b is None for b, _ in mapping):
        return frame.with_columns(pl.col(col).replace({r: a for (_, r), a in mapping.items()}))
    table = pl.DataFrame(
        [(b, r, a) for (b, r), a in mapping.items()],
        schema={vocab.by: pl.String, col: pl.String, "_allowed": pl.String},
        orient="row",
    )
    joined = frame.join(
        table.lazy() if isinstance(frame, pl.LazyFrame) else table,
        on=[vocab.by, col],
        how="left",
        maintain_order="left",
    )
    return joined.with_columns(pl.coalesce("_allowed", col).alias(col)).drop("_allowed")


def conform_all(frame: pl.DataFrame, vocabularies: Sequence[Vocabulary], where: str):
    """(frame with every vocabulary's mapping applied, [(vocabulary, mapping)], problems);
    a note on stderr says which values were read as which (``where`` names the table)."""
    applied, problems = [], []
    for vocab in vocabularies:
        if vocab.column not in frame.columns:
            continue
        mapping, found = conform(frame, vocab)
        problems += found
        if mapping and not found:
            frame = apply_mapping(frame, vocab, mapping)
            applied.append((vocab, mapping))
            shown = ", ".join(f"{r!r} -> {a!r}" for (_, r), a in list(mapping.items())[:3])
            print(
                f"stereolens: note: {where}: column {vocab.column}: read {shown}"
                f"{' ...' if len(mapping) > 3 else ''} (whitespace and case ignored)",
                file=sys.stderr,
            )
    return frame, applied, problems


def conform_columns(frame: pl.DataFrame, vocabularies, where: str) -> pl.DataFrame:
    """``frame`` with each of ``vocabularies`` conformed (:func:`vocabulary_key`), else
    ConfigError naming ``where``, the column, the value and its rows."""
    frame, _, problems = conform_all(frame, vocabularies, where)
    if problems:
        more = f" (+{len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise ConfigError(f"{where}: {problems[0]}{more}")
    return frame


def conform_parquet(path, vocabularies: Sequence[Vocabulary], where: str) -> None:
    """A parquet table conformed in place, rewritten atomically only when a value was read
    as another; a value outside a vocabulary is a ConfigError."""
    import polars as pl

    from stereolens.atomic import sink_parquet

    names = pl.scan_parquet(path).collect_schema().names()
    cols = sorted({c for v in vocabularies for c in (v.column, v.by) if c and c in names})
    if not cols:
        return
    _, applied, problems = conform_all(pl.read_parquet(path, columns=cols), vocabularies, where)
    if problems:
        more = f" (+{len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise ConfigError(f"{where}: {problems[0]}{more}")
    frame = pl.scan_parquet(path)
    for vocab, mapping in applied:
        frame = apply_mapping(frame, vocab, mapping)
    if applied:
        sink_parquet(path, frame)
