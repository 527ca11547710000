"""The coverage harness (issue 20, item 1): a Row is one kind of interval the tables or the
report print, with a world of known truth that draws datasets and returns each dataset's
estimate and interval; run_rows gives coverage, its Monte Carlo error and the mean width.
Each benchmark's rows live in bench/cover/<name>.py as ``rows(scale)`` with scale one of
"test" (seconds, for tests/test_coverage.py), "demo" (config/demo.yaml's sizes) and "paper"."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SCALES = ("test", "demo", "paper")
TARGET = (0.93, 0.97)
FLOOR = 0.90
"""tests/test_coverage.py fails a row whose coverage at the "test" scale is under this."""


@dataclass(frozen=True)
class Row:
    """``draw(rng, n)`` -> (estimate, ci_low, ci_high[, notes]), float arrays of length n,
    each entry one dataset drawn from the world whose population value is ``truth`` (a float,
    or an array of length n when the truth differs by dataset); ``notes``, where given, is
    the ``interval_note`` the project's code wrote per dataset (None where it printed an
    interval): a dataset with a note is withheld, as with ``withheld`` below."""

    name: str
    benchmark: str
    interval: str
    truth: float | np.ndarray
    draw: Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray, np.ndarray]]
    note: str = ""
    withheld: str = ""
    """The project's code withholds this row's interval (null, with an ``interval_note``) on
    datasets below the benchmark's minimum size; this says which rule. Coverage is then over
    the datasets where an interval is printed, the others are counted in ``withheld``; status
    "withheld" when none is printed. Rows without it count a null interval as a miss."""
    below_minimum: str = ""
    """The interval is computed (and measured here) but the report withholds it: the design
    is below the smallest size whose coverage was measured to hold (e.g. the reader
    correction's MIN_HUMAN_RELIABLE); says which rule. tests/test_coverage.py then checks
    that minimum against the rows instead of holding this row to FLOOR."""
    reference: str = ""
    """The row measures an interval printed beside the one under test, expected to miss
    (e.g. the naive interval of the reader's labels beside the corrected one); says which.
    Shown in the status; tests/test_coverage.py does not hold it to FLOOR."""


@dataclass(frozen=True)
class Result:
    row: Row
    datasets: int
    coverage: float
    mc_error: float
    mean_width: float
    mean_bias: float
    undefined: int
    withheld: int = 0
    """datasets whose interval the code withheld (rows with ``Row.withheld``, or a draw that
    returns notes; not in ``coverage``)."""
    withheld_note: str | None = None
    """The code's ``interval_note`` of the first withheld dataset, where the draw returns them."""

    @property
    def is_withheld(self) -> bool:
        """The project's code printed no interval on any dataset, as the row expects."""
        return self.withheld == self.datasets and bool(self.row.withheld or self.withheld_note)

    @property
    def status(self) -> str:
        if self.is_withheld:
            note = self.withheld_note or self.row.withheld
            return note if note.startswith("withheld") else f"withheld ({note})"
        lo, hi = TARGET
        notes = [self.row.note] if self.coverage > hi and self.row.note else []
        if self.withheld:
            notes.append(f"{self.withheld} of {self.datasets} withheld")
        if self.row.below_minimum:
            notes.append(self.row.below_minimum)
        if self.row.reference:
            notes.append(self.row.reference)
        tail = f" ({'; '.join(notes)})" if notes else ""
        if self.coverage < lo:
            return "LOW" + tail
        return ("high" if self.coverage > hi else "ok") + tail


def modules() -> list[str]:
    """The row modules in this package, in name order."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def rows(scale: str, only: list[str] | None = None) -> list[Row]:
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, not {scale!r}")
    out: list[Row] = []
    for name in modules():
        if only and name not in only:
            continue
        out.extend(importlib.import_module(f"{__name__}.{name}").rows(scale))
    return out


def run_row(row: Row, datasets: int, seed: int = 0) -> Result:
    """Coverage of ``row`` over ``datasets`` datasets (a dataset whose interval is undefined,
    NaN, counts as not covering and is counted in ``undefined``; for a row with ``withheld``
    it is left out of the coverage and counted in ``withheld``)."""
    rng = np.random.default_rng([seed, sum(map(ord, row.name))])
    drawn = row.draw(rng, datasets)
    est, lo, hi = (np.asarray(a, dtype=float) for a in drawn[:3])
    notes = list(drawn[3]) if len(drawn) > 3 else None
    truth = np.broadcast_to(np.asarray(row.truth, dtype=float), est.shape)
    defined = np.isfinite(lo) & np.isfinite(hi)
    covered = defined & (lo <= truth) & (truth <= hi)
    if notes is not None:
        held = np.array([n is not None for n in notes], dtype=bool)
    else:
        held = ~defined if row.withheld else np.zeros(defined.shape, dtype=bool)
    withheld = int(held.sum())
    counted = ~held
    n = int(counted.sum())
    c = float(covered[counted].mean()) if n else float("nan")
    return Result(
        row=row,
        datasets=datasets,
        coverage=c,
        mc_error=float(np.sqrt(c * (1 - c) / n)) if n else float("nan"),
        mean_width=float(np.nanmean(np.where(defined, hi - lo, np.nan)))
        if defined.any()
        else np.nan,
        mean_bias=float(np.nanmean(est - truth)) if np.isfinite(est - truth).any() else np.nan,
        undefined=int((~defined).sum()),
        withheld=withheld,
        withheld_note=next((n for n in notes if n is not None), None) if notes else None,
    )


def table(results: list[Result]) -> str:
    """A markdown table of results."""
    lines = [
        "| row | interval | datasets | coverage | MC error | mean width | mean bias | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.is_withheld:
            lines.append(
                f"| {r.row.name} | {r.row.interval} | {r.datasets} | - | - | - | "
                f"{'-' if np.isnan(r.mean_bias) else f'{r.mean_bias:+.3g}'} | {r.status} |"
            )
            continue
        lines.append(
            f"| {r.row.name} | {r.row.interval} | {r.datasets} | {r.coverage:.1%} | "
            f"{r.mc_error:.1%} | {r.mean_width:.4g} | {r.mean_bias:+.3g} | {r.status} |"
        )
    return "\n".join(lines)
