"""Plotting helpers of the report (matplotlib, Agg backend): PNG bytes out, and the chart kinds
the sections draw; intervals are drawn as lines, never error bars. Imports no benchmark."""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 100
COLOURS = plt.rcParams["axes.prop_cycle"].by_key()["color"]
FLOOR_COLOUR = "#bbbbbb"


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def columns_by(
    frame, key: str | tuple[str, ...], order: Sequence, *, lenient: bool = False
) -> Callable[[str], list]:
    """``col(name)``: the ``name`` value of the frame's row for each key of ``order`` (rows
    keyed by ``key``, a column or tuple of columns; the last row counts), None where no row
    has it; ``lenient``: a missing column reads as None too (else KeyError)."""
    if isinstance(key, str):
        got = {r[key]: r for r in frame.to_dicts()}
    else:
        got = {tuple(r[k] for k in key): r for r in frame.to_dicts()}

    def col(name: str) -> list:
        if lenient:
            return [got[k].get(name) if k in got else None for k in order]
        return [got[k][name] if k in got else None for k in order]

    return col


def subplots(nrows: int = 1, ncols: int = 1, *, width: float = 6.0, height: float = 3.0, **kw):
    """A figure of nrows x ncols axes (always a 2-D array), ``width`` x ``height`` inches."""
    kw.setdefault("squeeze", False)
    return plt.subplots(nrows, ncols, figsize=(width, height), **kw)


def to_png(fig) -> bytes:
    """The figure as PNG bytes (no date: the same figure, the same bytes); the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def interval_panel(
    ax,
    labels: Sequence[str],
    estimates: Sequence[Any],
    lows: Sequence[Any],
    highs: Sequence[Any],
    *,
    floor: Sequence[Any] | None = None,
    floor_high: Sequence[Any] | None = None,
    colour: str = COLOURS[0],
    reference: float | None = None,
    xlim: tuple[float, float] | None = None,
    offset: float = 0.0,
    label: str | None = None,
) -> None:
    """One row per label (top to bottom): the estimate as a dot, its interval as a line,
    ``floor`` / ``floor_high`` as a grey bar (or a tick at floor alone), ``reference`` as a
    dashed vertical line."""
    ys = [i + offset for i in range(len(labels))]
    for i, y in enumerate(ys):
        if floor is not None and finite(floor[i]):
            top = floor_high[i] if floor_high is not None and finite(floor_high[i]) else None
            if top is not None:
                ax.fill_betweenx([y - 0.3, y + 0.3], floor[i], top, color=FLOOR_COLOUR, lw=0)
            else:
                ax.vlines(floor[i], y - 0.3, y + 0.3, color="#888888", lw=2)
        if finite(lows[i]) and finite(highs[i]):
            ax.hlines(y, lows[i], highs[i], color=colour, lw=1.6)
        if finite(estimates[i]):
            ax.plot(estimates[i], y, "o", color=colour, ms=5, label=label if i == 0 else None)
    if reference is not None:
        ax.axvline(reference, color="#555555", lw=0.8, ls="--")
    if offset == 0.0:
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylim(len(labels) - 0.5, -0.5)
    if xlim is not None:
        ax.set_xlim(*xlim)
    ax.grid(axis="x", alpha=0.3)
    ax.tick_params(axis="x", labelsize=8)


def heatmap(
    ax,
    matrix: Sequence[Sequence[Any]],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    *,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    colorbar_label: str = "",
    fig=None,
) -> None:
    """A heatmap with missing cells left blank (masked)."""
    import numpy as np

    data = np.array(
        [[float(v) if finite(v) else np.nan for v in row] for row in matrix], dtype=float
    )
    data = np.ma.masked_invalid(data) if data.size else np.ma.masked_all((1, 1))
    image = ax.imshow(data, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="none")
    ax.set_xticks(range(len(col_labels)), col_labels, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=7)
    if fig is not None:
        bar = fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01)
        bar.set_label(colorbar_label, fontsize=8)
        bar.ax.tick_params(labelsize=7)


def grouped_bars(
    ax,
    categories: Sequence[str],
    series: Sequence[tuple[str, Sequence[Any], Sequence[Any], Sequence[Any]]],
    *,
    ylim: tuple[float, float] | None = None,
    ylabel: str = "",
) -> None:
    """Bars per category, one per series (name, values, lows, highs), intervals as black lines."""
    n = max(len(series), 1)
    width = 0.8 / n
    for k, (name, values, lows, highs) in enumerate(series):
        xs = [j + (k - (n - 1) / 2) * width for j in range(len(categories))]
        ax.bar(
            xs,
            [v if finite(v) else 0.0 for v in values],
            width,
            label=name,
            color=COLOURS[k % len(COLOURS)],
        )
        for x, lo, hi in zip(xs, lows, highs, strict=True):
            if finite(lo) and finite(hi):
                ax.vlines(x, lo, hi, color="black", lw=1)
                ax.hlines([lo, hi], x - width / 4, x + width / 4, color="black", lw=1)
    ax.set_xticks(range(len(categories)), categories, rotation=20, ha="right", fontsize=8)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:
        legend(ax)


def lines(
    ax,
    categories: Sequence[str],
    series: Sequence[tuple[str, Sequence[Any]]],
    *,
    ylim: tuple[float, float] | None = None,
    ylabel: str = "",
) -> None:
    """One line per series across ordered categories (missing points skipped)."""
    for k, (name, values) in enumerate(series):
        pts = [(i, v) for i, v in enumerate(values) if finite(v)]
        if pts:
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                label=name,
                color=COLOURS[k % len(COLOURS)],
            )
    ax.set_xticks(range(len(categories)), categories, fontsize=8)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(alpha=0.3)


def legend(ax, **kw) -> None:
    """A legend when the axes have labelled artists (none: no legend, no warning)."""
    if ax.get_legend_handles_labels()[0]:
        kw.setdefault("fontsize", 7)
        ax.legend(**kw)
