"""HTML building blocks shared by every page stereolens writes (the report, its galleries, the
annotation form): jinja2 templates filled with :class:`Section`, :class:`Figure` and
:class:`Table`. Imports no benchmark."""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import polars as pl
from markupsafe import Markup

from stereolens import templating

TEMPLATES = Path(__file__).resolve().parent / "templates"

OPEN_ROWS = 12
"""A table with more rows than this starts collapsed (details/summary)."""

DEFAULT_MAX_ROWS = 300
"""Rows a table shows in the page by default; its CSV file always has all of them."""


def environment(*search_paths: str | Path) -> jinja2.Environment:
    """The page environment over ``search_paths`` and the report's templates, filter ``num``."""
    return templating.environment(*search_paths, TEMPLATES, filters={"num": format_value})


def render_template(name: str, *search_paths: str | Path, **values: Any) -> str:
    """The template ``name`` rendered with ``values``."""
    return environment(*search_paths).get_template(name).render(**values)


def render_sections(
    sections: Sequence[Section], max_rows: int = DEFAULT_MAX_ROWS, tables_href: str = "tables"
) -> str:
    """The HTML of ``sections`` alone (as the report's page renders them)."""
    return render_template(
        "sections.html.j2", sections=sections, max_rows=max_rows, tables_href=tables_href
    )


_SLUG = re.compile(r"[^a-z0-9]+")


def slug(text: str) -> str:
    """An id / file-name part: lowercase ASCII letters, digits and dashes."""
    out = _SLUG.sub("-", str(text).lower()).strip("-")
    return out or "x"


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value: Any) -> bool:
    """A number that is neither null, NaN nor infinite."""
    return is_number(value) and math.isfinite(value)


def format_value(value: Any, digits: int = 3) -> str:
    """A cell as text: floats with ``digits`` decimals, NaN as "NaN", null as "", lists
    joined with ", ", structs as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{digits}f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(v, digits) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


NOTE_COLUMN = "interval_note"
"""The String column that says why a row's interval is null (below the size at which the
benchmark's interval covers, bench/COVERAGE.md); null where the row has one."""

_REASON = re.compile(r"\s*\([^()]*\)\s*$")


def withheld_text(note: Any, short: bool = True) -> str:
    """An ``interval_note`` as shown beside an estimate, "interval withheld: ..." (``short``:
    without its trailing parenthesised reason); "" for a null note."""
    if note is None or not str(note).strip():
        return ""
    text = str(note).strip()
    if short:
        text = _REASON.sub("", text) or text
    if text.lower().startswith("withheld"):
        return f"interval {text}"
    return f"interval withheld: {text}"


def format_interval(est: Any, lo: Any, hi: Any, digits: int = 3, note: Any = None) -> str:
    """ "est [lo, hi]" (shown as it is), "est" when an end is missing, or with a ``note``
    "est (interval withheld: ...)"."""
    text = format_value(est, digits)
    if finite(lo) and finite(hi):
        text += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    elif withheld_text(note):
        text += f" ({withheld_text(note)})"
    return text


@dataclass(frozen=True)
class Cell:
    text: str
    sort: float | str | None = None
    numeric: bool = False


@dataclass
class Figure:
    """A figure: PNG bytes and a caption that names the formula of what it shows."""

    id: str
    title: str
    caption: str
    png: bytes

    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")

    @property
    def file_name(self) -> str:
        return f"{self.id}.png"

    @property
    def anchor(self) -> str:
        return f"fig-{self.id}"


@dataclass
class Table:
    """A table of the report. ``intervals`` maps an estimate column to its (low, high)
    columns, shown as "est [low, high]" (or "est (interval withheld: ...)" by NOTE_COLUMN);
    ``collapsed`` None: collapsed above OPEN_ROWS rows; ``max_rows``: rows the page shows."""

    id: str
    title: str
    caption: str
    frame: pl.DataFrame
    digits: int = 3
    intervals: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    collapsed: bool | None = None
    max_rows: int | None = None
    csv: pl.DataFrame | None = None
    """What the CSV file holds when it differs from ``frame`` (e.g. a long form of a wide
    display table)."""

    @property
    def file_name(self) -> str:
        return f"{self.id}.csv"

    @property
    def is_collapsed(self) -> bool:
        return self.frame.height > OPEN_ROWS if self.collapsed is None else self.collapsed

    def columns(self) -> list[str]:
        hidden = {c for pair in self.intervals.values() for c in pair}
        if self.intervals:
            hidden.add(NOTE_COLUMN)
        return [c for c in self.frame.columns if c not in hidden]

    def withheld_notes(self) -> list[str]:
        """The distinct full ``interval_note`` texts of the rows (in order of appearance)."""
        if NOTE_COLUMN not in self.frame.columns:
            return []
        notes = self.frame[NOTE_COLUMN].drop_nulls().unique(maintain_order=True)
        return [n for n in notes.to_list() if str(n).strip()]

    def rows(self, max_rows: int | None = None) -> list[list[Cell]]:
        limit = self.max_rows if self.max_rows is not None else max_rows
        frame = self.frame if limit is None else self.frame.head(limit)
        cols = self.columns()
        out = []
        for rec in frame.iter_rows(named=True):
            row = []
            for c in cols:
                v = rec[c]
                if c in self.intervals:
                    lo, hi = self.intervals[c]
                    text = format_interval(
                        v, rec.get(lo), rec.get(hi), self.digits, rec.get(NOTE_COLUMN)
                    )
                else:
                    text = format_value(v, self.digits)
                sort = v if finite(v) else None
                row.append(Cell(text, sort, is_number(v)))
            out.append(row)
        return out

    def shown_rows(self, max_rows: int | None = None) -> int:
        limit = self.max_rows if self.max_rows is not None else max_rows
        return self.frame.height if limit is None else min(limit, self.frame.height)

    def csv_frame(self) -> pl.DataFrame:
        return csv_ready(self.csv if self.csv is not None else self.frame)


@dataclass
class Link:
    """A link to a side page (a gallery) or file, with a line saying what is there."""

    href: str
    text: str
    note: str = ""


@dataclass
class Section:
    """A section: figures first, then its text, links and tables, then its subsections."""

    id: str
    title: str
    paragraphs: list[str | Markup] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    preformatted: list[tuple[str, str]] = field(default_factory=list)
    """(title, text) blocks shown collapsed as preformatted text (e.g. the run's config)."""
    subsections: list[Section] = field(default_factory=list)

    def walk(self) -> Iterable[Section]:
        yield self
        for s in self.subsections:
            yield from s.walk()

    def is_empty(self) -> bool:
        return not any(
            (s.paragraphs or s.warnings or s.figures or s.tables or s.links or s.preformatted)
            for s in self.walk()
        )


def csv_ready(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame with nested columns (lists, structs) as text, which CSV cannot hold."""
    exprs = []
    for name, dtype in frame.schema.items():
        if isinstance(dtype, (pl.List, pl.Array)):
            exprs.append(
                pl.col(name).cast(pl.List(pl.String)).list.join(";").alias(name)
                if dtype.inner != pl.Null
                else pl.col(name).cast(pl.String)
            )
        elif isinstance(dtype, pl.Struct):
            exprs.append(pl.col(name).struct.json_encode().alias(name))
        elif dtype == pl.Null:
            exprs.append(pl.col(name).cast(pl.String))
    return frame.with_columns(exprs) if exprs else frame


def check_ids(sections: Sequence[Section]) -> None:
    """Section, table and figure ids are unique (they name anchors and files)."""
    seen: dict[str, str] = {}
    for top in sections:
        for s in top.walk():
            for kind, ident in (
                ("section", s.id),
                *(("table", t.id) for t in s.tables),
                *(("figure", f.anchor) for f in s.figures),
            ):
                if ident in seen:
                    raise ValueError(f"report {kind} id {ident!r} is used twice ({seen[ident]})")
                seen[ident] = kind
