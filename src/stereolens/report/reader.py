"""The first screen's reader-correction block: per benchmark, its headline metric naive beside
corrected for the reader's errors, or the human labels still needed; filled through a report
module's optional ``reader_correction`` hook (docs/statistics.md, "In the report")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType

import polars as pl

from stereolens.report.html import Section, Table, finite, format_value
from stereolens.report.inputs import Inputs

FIRST_SCREEN_ROWS = 8
"""Headline rows per benchmark the first screen shows (flagged ones first); the section
below and the CSV have all."""

_LEAD = (
    "Naive = the benchmark's headline formula of the label shares as the reader read them, "
    "with its bootstrap interval over the audited items; corrected = the same formula of "
    "the shares corrected for the reader's errors by prediction-powered inference (PPI, "
    "lam = 1; PPI++ where reader_correction.lam is tuned; per stratum), shown at its "
    "bias-corrected estimate (estimate_bc, the centre of its interval; the plug-in is "
    "corrected_plugin) with the 95% bias-corrected normal bootstrap interval over both the "
    "reader's and the human-labelled items. The interval is printed only where every cell of "
    "the row has {minimum} or more human labels (coverage is measured from there; below it "
    "'interval withheld', neither flagged nor ranked). n human / n items count a row's cells "
    "(an item read for several attributes once per attribute). 'significance' flags a row "
    "whose naive interval excludes the no-bias value (BI 0, S_imp 1, S_exp 1, eta 0.5, TVD "
    "0) while the corrected one does not, or the reverse; 'rank' a model whose rank among "
    "the models of one metric and scope (least biased = 1, ties share the better rank) "
    "differs between naive and corrected. Definitions: docs/statistics.md, 'Correcting for "
    "the reader's errors'; measured coverage: bench/COVERAGE.md, 'Reader correction'."
)
"""The part of the caption every benchmark shares."""


def min_reliable() -> int:
    """reader_correction.MIN_HUMAN_RELIABLE (imported on use: that module imports ppi_py)."""
    from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE

    return MIN_HUMAN_RELIABLE


def caption(formulas: str = "") -> str:
    """The caption of the corrected rows, with the measured minimum: the part every
    benchmark shares, then a benchmark's own ``formulas`` line (its READER_CAPTION)."""
    return " ".join(filter(None, [_LEAD, formulas])).format(minimum=f"{min_reliable():,}")


@dataclass(frozen=True)
class Headline:
    """How a benchmark's corrected metric reads: its label, the value of no bias (the null
    its interval is judged against) and which way is less biased."""

    label: str
    null: float
    lower_is_less_biased: bool = True
    ranked: bool = True
    """Models are ranked on it (False for a direction rather than an amount of bias, e.g.
    BiasIG's eta: no rank, no rank flag)."""
    withheld: str = ""
    """Why its corrected interval is withheld where corrected.parquet's interval_reliable
    is false, in the row's note, where the metric has its own rule (BiasIG's eta: its own
    measured minimum of human labels); empty: the MIN_HUMAN_RELIABLE note."""


@dataclass
class ReaderBlock:
    """One benchmark's part: its headline ``table`` with human labels, else the ``plan``."""

    key: str
    title: str
    table: pl.DataFrame | None = None
    simulated: bool = False
    plan: str | None = None
    rows: list[dict] = field(default_factory=list)
    """The first screen's rows (at most FIRST_SCREEN_ROWS, flagged first), as text."""
    hidden: int = 0
    """Headline rows the first screen leaves to the section below."""
    flags: list[str] = field(default_factory=list)
    withheld: int = 0
    """Headline rows whose corrected interval is withheld (below MIN_HUMAN_RELIABLE)."""
    minimum: int = 0
    """MIN_HUMAN_RELIABLE: the human labels per cell from which an interval is printed."""
    n_human: int = 0
    """Distinct human-labelled items that went in (:func:`distinct_counts`)."""
    n_items: int = 0
    """Distinct items the reader read in the corrected cells."""
    formulas: str = ""
    """The benchmark's line of the caption: its corrected formulas, how they are resampled
    and their measured coverage (the benchmark report module's READER_CAPTION)."""

    @property
    def formulas_text(self) -> str:
        return self.formulas.format(minimum=f"{self.minimum:,}")

    @property
    def has_labels(self) -> bool:
        return self.table is not None

    @property
    def hidden_flags(self) -> int:
        """Flagged rows the first screen leaves to the section below."""
        return len(self.flags) - sum(bool(r["flag"]) for r in self.rows)


def distinct_counts(
    corrected: pl.DataFrame, keys: Sequence[str], where: pl.Expr | None = None
) -> tuple[int, int]:
    """(human-labelled items, items read) of a corrected table, each item once: over the
    rows ``where`` selects, the largest n_human and n_items per ``keys``, summed."""
    part = corrected if where is None else corrected.filter(where)
    if part.height == 0:
        return 0, 0
    per = part.group_by(list(keys)).agg(pl.col("n_human").max(), pl.col("n_items").max())
    return int(per["n_human"].sum()), int(per["n_items"].sum())


def _excludes(low, high, null: float) -> bool | None:
    if not (finite(low) and finite(high)):
        return None
    return bool(low > null or high < null)


def _reliable(corrected: pl.DataFrame) -> pl.Expr:
    """Rows whose corrected interval may print: interval_reliable (older tables: n_human)."""
    if "interval_reliable" in corrected.columns:
        return pl.col("interval_reliable").fill_null(False)
    return pl.col("n_human") >= min_reliable()


def headline_table(
    corrected: pl.DataFrame,
    headlines: Mapping[str, Headline],
    unit: str = "model",
    scope: Sequence[str] = (),
) -> pl.DataFrame:
    """The corrected table's rows of the ``headlines`` metrics as the block shows them:
    ``unit``, ``scope`` (the other key columns), naive and corrected (estimate_bc) with
    their intervals (the corrected one withheld, with interval_note, where not
    interval_reliable or withheld_reason), whether each excludes the no-bias value, the
    ranks by naive and corrected within metric x scope, and the two flags."""
    minimum = min_reliable()
    part = corrected.filter(pl.col("metric").is_in(list(headlines)))
    # a scope column null on some metrics' rows (ContextBias's label on BI rows) is skipped
    scope_expr = (
        pl.concat_str(
            [pl.col(c).cast(pl.String) for c in scope], separator=" · ", ignore_nulls=True
        )
        if scope
        else pl.lit("")
    )
    centre = "estimate_bc" if "estimate_bc" in part.columns else "corrected"
    part = part.with_columns(
        pl.col(unit).cast(pl.String).alias("model"),
        scope_expr.alias("scope"),
        pl.col("metric").replace_strict({k: h.label for k, h in headlines.items()}).alias("label"),
        pl.col(centre).alias("_shown"),
        _reliable(part).alias("_reliable"),
    )
    rows = []
    for r in part.iter_rows(named=True):
        h = headlines[r["metric"]]
        corrected_ok = finite(r["_shown"])
        reliable = bool(r["_reliable"])
        reason = r.get("withheld_reason") or h.withheld
        note = (
            None
            if reliable or not corrected_ok
            else f"interval withheld: {reason}"
            if reason
            else f"interval withheld: {r['n_human']:,} human labels, coverage measured "
            f"from {minimum:,} per cell"
        )
        naive_ex = _excludes(r["naive_low"], r["naive_high"], h.null)
        shown = corrected_ok and reliable
        corr_ex = _excludes(r["ci_low"], r["ci_high"], h.null) if shown else None
        flag = None
        if naive_ex is not None and corr_ex is not None and naive_ex != corr_ex:
            null = format_value(h.null, 0)
            flag = (
                f"naive interval excludes {null}, corrected does not"
                if naive_ex
                else f"corrected interval excludes {null}, naive does not"
            )
        rows.append(
            {
                "model": r["model"], "metric": r["metric"], "label": r["label"],
                "scope": r["scope"], "naive": r["naive"], "naive_low": r["naive_low"],
                "naive_high": r["naive_high"],
                "corrected": r["_shown"] if corrected_ok else None,
                "ci_low": r["ci_low"] if shown else None,
                "ci_high": r["ci_high"] if shown else None,
                "corrected_plugin": r["corrected"] if finite(r["corrected"]) else None,
                "n_human": r["n_human"], "n_items": r["n_items"],
                "interval_reliable": reliable, "interval_note": note, "null": h.null,
                "naive_excludes_null": naive_ex, "corrected_excludes_null": corr_ex,
                "significance_flag": flag,
            }
        )  # fmt: skip
    schema = {
        "model": pl.String, "metric": pl.String, "label": pl.String, "scope": pl.String,
        **{c: pl.Float64 for c in ("naive", "naive_low", "naive_high", "corrected", "ci_low",
                                   "ci_high", "corrected_plugin")},
        "n_human": pl.Int64, "n_items": pl.Int64, "interval_reliable": pl.Boolean,
        "interval_note": pl.String, "null": pl.Float64,
        "naive_excludes_null": pl.Boolean, "corrected_excludes_null": pl.Boolean,
        "significance_flag": pl.String,
    }  # fmt: skip
    table = pl.DataFrame(rows, schema=schema)
    return _ranks(table, headlines)


def _ranks(table: pl.DataFrame, headlines: Mapping[str, Headline]) -> pl.DataFrame:
    """naive_rank, corrected_rank (1 = least biased within metric x scope; null for a lone
    model or no corrected value) and rank_flag; rows with a withheld interval take no part."""
    out = []
    for (metric, _), part in table.group_by("metric", "scope", maintain_order=True):
        desc = not headlines[str(metric)].lower_is_less_biased
        ok = part.filter(
            pl.col("corrected").is_not_null()
            & pl.col("naive").is_finite()
            & pl.col("interval_reliable")
            & pl.lit(headlines[str(metric)].ranked)
        )
        ranked = ok.with_columns(
            pl.col("naive").rank("min", descending=desc).cast(pl.Int64).alias("naive_rank"),
            pl.col("corrected").rank("min", descending=desc).cast(pl.Int64).alias("corrected_rank"),
        )
        if ok.height < 2:
            ranked = ranked.with_columns(
                pl.lit(None, pl.Int64).alias("naive_rank"),
                pl.lit(None, pl.Int64).alias("corrected_rank"),
            )
        k = ok.height
        ranked = ranked.with_columns(
            pl.when(pl.col("naive_rank") != pl.col("corrected_rank"))
            .then(pl.format(f"rank {{}} -> {{}} of {k}", "naive_rank", "corrected_rank"))
            .otherwise(None)
            .alias("rank_flag")
        )
        out.append(
            part.join(
                ranked.select("model", "naive_rank", "corrected_rank", "rank_flag"),
                on="model",
                how="left",
            )
        )
    if not out:
        return table.with_columns(
            pl.lit(None, pl.Int64).alias("naive_rank"),
            pl.lit(None, pl.Int64).alias("corrected_rank"),
            pl.lit(None, pl.String).alias("rank_flag"),
        )
    return pl.concat(out)


def _interval(value, low, high, digits: int) -> str:
    if value is None or not finite(value):
        return "n/a"
    text = format_value(value, digits)
    if finite(low) and finite(high):
        text += f" [{format_value(low, digits)}, {format_value(high, digits)}]"
    return text


def _screen_rows(table: pl.DataFrame, digits: int) -> tuple[list[dict], int, list[str]]:
    flagged = table.with_columns(
        (pl.col("significance_flag").is_not_null() | pl.col("rank_flag").is_not_null()).alias(
            "_flag"
        )
    ).with_row_index("_order")
    ordered = flagged.sort(["_flag", "_order"], descending=[True, False])
    rows, flags = [], []
    for r in ordered.iter_rows(named=True):
        marks = [m for m in (r["significance_flag"], r["rank_flag"]) if m]
        where = " · ".join(x for x in (r["model"], r["label"], r["scope"]) if x)
        if marks:
            flags.append(f"{where}: {'; '.join(marks)}")
        if len(rows) < FIRST_SCREEN_ROWS:
            rows.append(
                {
                    "model": r["model"],
                    "metric": r["label"],
                    "scope": r["scope"],
                    "naive": _interval(r["naive"], r["naive_low"], r["naive_high"], digits),
                    "corrected": _interval(r["corrected"], r["ci_low"], r["ci_high"], digits),
                    "corrected_note": r["interval_note"],
                    "labels": f"{r['n_human']:,} / {r['n_items']:,}",
                    "flag": "; ".join(marks),
                }
            )
    return rows, max(0, table.height - len(rows)), flags


def corrected_block(
    key: str,
    title: str,
    corrected: pl.DataFrame,
    headlines: Mapping[str, Headline],
    *,
    unit: str = "model",
    scope: Sequence[str] = (),
    counts: tuple[int, int] = (0, 0),
    simulated: bool = False,
    digits: int = 3,
    formulas: str = "",
) -> ReaderBlock:
    """A benchmark's block from its corrected table's ``headlines`` rows (``unit``, ``scope``
    as headline_table; ``counts``: :func:`distinct_counts`; ``formulas``: the caption)."""
    table = headline_table(corrected, headlines, unit=unit, scope=scope)
    rows, hidden, flags = _screen_rows(table, digits)
    withheld = int(table["interval_note"].is_not_null().sum())
    return ReaderBlock(
        key, title, table, simulated, rows=rows, hidden=hidden, flags=flags,
        withheld=withheld, minimum=min_reliable(), n_human=counts[0], n_items=counts[1],
        formulas=formulas,
    )  # fmt: skip


def blocks(inputs: Inputs, config: dict, modules: Sequence[ModuleType]) -> list[ReaderBlock]:
    """The block of every benchmark module (page order) whose reader_correction hook gives one."""
    out = []
    for mod in modules:
        hook = getattr(mod, "reader_correction", None)
        got = hook(inputs, config) if hook is not None else None
        if got is not None:
            out.append(got)
    return out


def section(found: Sequence[ReaderBlock]) -> Section | None:
    """Every headline row of every benchmark with human labels, one table each."""
    tables = [
        Table(
            f"reader-{b.key}",
            b.title + (" (SIMULATED human labels)" if b.simulated else ""),
            caption(b.formulas),
            b.table,
            intervals={"naive": ("naive_low", "naive_high"), "corrected": ("ci_low", "ci_high")},
        )
        for b in found
        if b.table is not None
    ]
    if not tables:
        return None
    return Section(
        "reader-correction",
        "Naive and corrected for the reader's errors",
        paragraphs=[
            "Each benchmark's headline metric as the reader read it beside the estimate "
            "corrected for the reader's errors from the human-labelled items, every row "
            "(the first screen shows the flagged ones first)."
        ],
        tables=tables,
    )


def simulated(inputs: Inputs, config: dict, key: str) -> bool:
    """The benchmark's human labels are simulated: ``reader_correction.simulate``, or no
    human-label table configured and ``<key>_human_labels_simulated`` in the folder."""
    rc = config[key]["reader_correction"]
    if rc["simulate"]:
        return True
    return not rc["human_labels"] and inputs.has(f"{key}_human_labels_simulated")
