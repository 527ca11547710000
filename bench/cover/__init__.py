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
    """``draw(rng, n)`` -> (estimate, ci_low, ci_high), float arrays of length n, each entry
    one dataset drawn from the world whose population value is ``truth`` (a float, or an
    array of length n when the truth differs by dataset); or (estimate, ci_low, ci_high,
    notes) with the table's ``interval_note`` per dataset (None where the interval is
    printed): a row whose every dataset's interval is withheld has status "withheld"."""

    name: str
    benchmark: str
    interval: str
    truth: float | np.ndarray
    draw: Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray, np.ndarray]]
    note: str = ""


@dataclass(frozen=True)
class Result:
    row: Row
    datasets: int
    coverage: float
    mc_error: float
    mean_width: float
    mean_bias: float
    undefined: int
    withheld: str | None = None

    @property
    def status(self) -> str:
        if self.withheld:
            return self.withheld
        lo, hi = TARGET
        if self.coverage < lo:
            return "LOW"
        if self.coverage > hi:
            return "high" + (f" ({self.row.note})" if self.row.note else "")
        return "ok"


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
    NaN, counts as not covering and is counted in ``undefined``)."""
    rng = np.random.default_rng([seed, sum(map(ord, row.name))])
    drawn = row.draw(rng, datasets)
    notes = list(drawn[3]) if len(drawn) > 3 else [None] * datasets
    est, lo, hi = (np.asarray(a, dtype=float) for a in drawn[:3])
    truth = np.broadcast_to(np.asarray(row.truth, dtype=float), est.shape)
    defined = np.isfinite(lo) & np.isfinite(hi)
    covered = defined & (lo <= truth) & (truth <= hi)
    c = float(covered.mean())
    return Result(
        row=row,
        datasets=datasets,
        coverage=c,
        mc_error=float(np.sqrt(c * (1 - c) / datasets)),
        mean_width=float(np.nanmean(np.where(defined, hi - lo, np.nan)))
        if defined.any()
        else np.nan,
        mean_bias=float(np.nanmean(est - truth)),
        undefined=int((~defined).sum()),
        withheld=notes[0] if notes and all(n is not None for n in notes) else None,
    )


def table(results: list[Result]) -> str:
    """A markdown table of results."""
    lines = [
        "| row | interval | datasets | coverage | MC error | mean width | mean bias | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cov = "-" if r.withheld else f"{r.coverage:.1%}"
        err = "-" if r.withheld else f"{r.mc_error:.1%}"
        width = "-" if r.withheld else f"{r.mean_width:.4g}"
        lines.append(
            f"| {r.row.name} | {r.row.interval} | {r.datasets} | {cov} | "
            f"{err} | {width} | {r.mean_bias:+.3g} | {r.status} |"
        )
    return "\n".join(lines)
