"""The first screen of the report: what ran, the tiny-model warning when it applies, and one bias
profile per model across the benchmarks (rows of :data:`PROFILE_SCHEMA`).
Imports no benchmark."""

from __future__ import annotations

import importlib
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl

from stereolens.report import figures as F
from stereolens.report.html import NOTE_COLUMN, Figure, finite, format_value, withheld_text

PROFILE_SCHEMA = {
    "benchmark": pl.String,
    "benchmark_title": pl.String,
    "model": pl.String,
    "metric": pl.String,
    "label": pl.String,
    "panel": pl.String,
    "series": pl.String,
    "estimate": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "floor": pl.Float64,
    "floor_high": pl.Float64,
    "floor_label": pl.String,
    "p": pl.Float64,
    "n": pl.Int64,
    "reading": pl.String,
    "reference": pl.Float64,
    "note": pl.String,
    "interval_note": pl.String,
}
"""One headline number of one model on one benchmark. ``panel`` groups metrics into a
panel of the profile figure (``series`` tells a panel's points apart); ``floor`` /
``floor_high`` the noise floor (``floor_label``: "null" or "ceiling"); ``reference`` a
dashed line; ``interval_note``: html.NOTE_COLUMN."""

PROFILE_CAPTION = (
    "Headline numbers per model and benchmark: the estimate, its 95% interval below it, and "
    "the noise floor where the benchmark has one (LVLM 'null a-b': the mean and 95th "
    "percentile of the score under shuffled group labels, with the permutation p-value). "
    "BiasIG: S_imp = mean cosine similarity of "
    "generated and ground-truth demographic distributions per subject (paper 000 Eq. 1-2; "
    "1 = matches the ground truth; 'ceiling' = the expected S_imp of a generator sampling "
    "exactly from the ground truth at this run's sample sizes, the best this run can show), "
    "S_exp = share of images showing the protected value asked for (Eq. 3), eta = "
    "manifestation factor (Eq. 4-5; towards 1 discrimination, towards 0 ignorance); "
    "bootstrap intervals over images. ContextBias: BI shift = BI(CA-U) - BI(CF) with BI = "
    "1 - H(p)/log K (paper 002 Eq. 1), overall = mean of the cohort values, 95% role-level "
    "cluster-bootstrap interval (below 0: the unrelated context weakens role-linked "
    "attributes); invariant pairs = % of (role, label) pairs tested by chi-squared whose "
    "prevalence is context-invariant (at least 5 occurrences, p > 0.05 and range <= 5 pp), "
    "for roles like these (roles are the clusters): Wilson interval on the counts over the "
    "design effect of roles, withheld under contextbias.metrics.interval_min_roles (10). LVLM: "
    "TVD x100 of the output distribution over user groups from uniform (paper 001; 0 = the "
    "groups are treated alike), bootstrap interval over user images. Where a benchmark's "
    "design is smaller than the size at which its interval covers the truth (bench/"
    "COVERAGE.md), no interval is printed: the cell says 'interval withheld' and why."
)


def profile_frame(rows: Sequence[dict]) -> pl.DataFrame:
    """Profile rows (dicts with PROFILE_SCHEMA keys; missing keys are null) as a table."""
    return pl.DataFrame(
        [{k: r.get(k) for k in PROFILE_SCHEMA} for r in rows], schema=PROFILE_SCHEMA
    )


def _float(v) -> float | None:
    return float(v) if finite(v) else None


# ------------------------------------------------------------------ facts and warnings


def versions() -> str:
    import matplotlib
    import polars

    from stereolens import __version__

    return (
        f"stereolens {__version__}, Python {platform.python_version()}, polars "
        f"{polars.__version__}, matplotlib {matplotlib.__version__}"
    )


def tiny_model_warning(config: dict, tiny_models: Sequence[str]) -> str | None:
    """The warning the first screen carries when the run's numbers come from tiny
    random-weight models (the embedded default, or any model built from a config)."""
    if not (config["embedded_default"] or tiny_models):
        return None
    names = f" ({', '.join(sorted(tiny_models))})" if tiny_models else ""
    return (
        f"Tiny random-weight models{names}: every number in this report is meaningless. It "
        "shows that the pipeline runs end to end; point the config at real models for a "
        "real audit."
    )


# ------------------------------------------------------------------ the profile table


@dataclass
class ProfileBlock:
    """One benchmark's part of the profile: its metrics (columns) and its models (rows)."""

    title: str
    labels: list[str]
    rows: list[dict]
    """{"model", "also" (the other benchmarks the model is in), "cells"}."""


@dataclass
class ProfileView:
    """The profile as the first screen shows it: one block per benchmark, side by side
    where they fit, a model in every benchmark it ran (named under its row elsewhere)."""

    blocks: list[ProfileBlock]
    caption: str = PROFILE_CAPTION
    file_name: str = "bias-profile.csv"
    frame: pl.DataFrame = field(default_factory=lambda: profile_frame([]))

    @property
    def rows(self) -> list[dict]:
        """Every (block, model) row: one per model and benchmark."""
        return [r for b in self.blocks for r in b.rows]


def profile_digits() -> dict[str, int]:
    """Benchmark -> decimals of its profile cells: its report module's ``PROFILE_DIGITS``
    (default 3; a metric named ``*pct`` has 1 whatever the benchmark)."""
    from stereolens.benchmark import benchmarks

    return {
        p.name: getattr(importlib.import_module(p.report_sections), "PROFILE_DIGITS", 3)
        for p in benchmarks()
        if p.report_sections
    }


def _cell(r: dict, digits: dict[str, int]) -> ProfileCell:
    d = 1 if r["metric"].endswith("pct") else digits.get(r["benchmark"], 3)
    sub = ""
    if finite(r["floor"]):
        sub = f"{r['floor_label'] or 'floor'} {r['floor']:.{d}f}"
        if finite(r["floor_high"]):
            sub += f"-{r['floor_high']:.{d}f}"
        if finite(r["p"]):
            sub += f" · p {r['p']:.2f}"
    elif r["note"]:
        sub = r["note"]
    if finite(r["ci_low"]) and finite(r["ci_high"]):
        interval = f"[{r['ci_low']:.{d}f}, {r['ci_high']:.{d}f}]"
    else:
        note = withheld_text(r.get(NOTE_COLUMN))
        interval = f"({note})" if note else ""
    text = format_value(r["estimate"], d) if r["estimate"] is not None else "n/a"
    return ProfileCell(text, _float(r["estimate"]), interval, sub)


def profile_view(profile: pl.DataFrame) -> ProfileView:
    """One block per benchmark: rows its models (first-seen order), columns its metrics."""
    digits = profile_digits()
    by_key = {(r["model"], r["benchmark_title"], r["metric"]): r for r in profile.to_dicts()}
    titles = profile["benchmark_title"].unique(maintain_order=True).to_list()
    member = {
        m: profile.filter(pl.col("model") == m)["benchmark_title"].unique(maintain_order=True)
        for m in profile["model"].unique().to_list()
    }
    blocks = []
    for title in titles:
        part = profile.filter(pl.col("benchmark_title") == title)
        metrics = part.select("metric", "label").unique(maintain_order=True).rows()
        rows = []
        for model in part["model"].unique(maintain_order=True).to_list():
            cells = [
                _cell(by_key[(model, title, m)], digits) if (model, title, m) in by_key else None
                for m, _ in metrics
            ]
            also = [t for t in member[model].to_list() if t != title]
            rows.append({"model": model, "also": also, "cells": cells})
        blocks.append(ProfileBlock(title, [label for _, label in metrics], rows))
    return ProfileView(blocks=blocks, frame=profile)


@dataclass(frozen=True)
class ProfileCell:
    text: str
    sort: float | None
    interval: str = ""
    sub: str = ""


# ------------------------------------------------------------------ the profile figure


def profile_figure(profile: pl.DataFrame) -> Figure | None:
    """One panel per headline metric, one row per model: estimate (dot), 95% interval
    (line), noise floor (grey band from null mean to 95th percentile, or a tick)."""
    if profile.is_empty():
        return None
    panels = profile.select("benchmark_title", "panel").unique(maintain_order=True).rows()
    benches = list(dict.fromkeys(b for b, _ in panels))
    per_bench = {b: [p for bb, p in panels if bb == b] for b in benches}
    ncols = max(len(v) for v in per_bench.values())
    heights = [
        max(1, profile.filter(pl.col("benchmark_title") == b)["model"].n_unique()) for b in benches
    ]
    fig, axes = F.subplots(
        len(benches),
        ncols,
        width=min(12.0, 3.9 * ncols + 0.8),
        height=sum(0.32 * h + 0.9 for h in heights),
        gridspec_kw={"height_ratios": [h + 2.2 for h in heights]},
    )
    for i, bench in enumerate(benches):
        sub = profile.filter(pl.col("benchmark_title") == bench)
        models = sub["model"].unique(maintain_order=True).to_list()
        for j in range(ncols):
            ax = axes[i][j]
            if j >= len(per_bench[bench]):
                ax.set_visible(False)
                continue
            panel = per_bench[bench][j]
            rows = sub.filter(pl.col("panel") == panel)
            series = rows["series"].unique(maintain_order=True).to_list()
            for k, s in enumerate(series):
                part = rows.filter(
                    pl.col("series").is_null() if s is None else pl.col("series") == s
                )
                col = F.columns_by(part, "model", models)
                F.interval_panel(
                    ax,
                    models,
                    col("estimate"),
                    col("ci_low"),
                    col("ci_high"),
                    floor=col("floor"),
                    floor_high=col("floor_high"),
                    colour=F.COLOURS[k % len(F.COLOURS)],
                    offset=0.0 if len(series) == 1 else (k - (len(series) - 1) / 2) * 0.3,
                    label=s,
                )
            if len(series) > 1:
                ax.set_yticks(range(len(models)), models, fontsize=8)
                ax.set_ylim(len(models) - 0.5, -0.5)
                if j == len(per_bench[bench]) - 1:
                    F.legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0))
            refs = rows["reference"].drop_nulls()
            if len(refs):
                ax.axvline(refs[0], color="#555555", lw=0.8, ls="--")
            reading = rows["reading"].drop_nulls()
            title = panel + (f"\n({reading[0]})" if len(reading) else "")
            ax.set_title(f"{bench}: {title}", fontsize=8.5)
            if j > 0:
                ax.tick_params(axis="y", labelleft=True)
    fig.tight_layout()
    return Figure(
        id="bias-profile-figure",
        title="Bias profile per model across the benchmarks",
        caption=(
            "Each panel is one headline number (definitions and formulas in the table "
            "above): dot = estimate, line = 95% interval (drawn as it is, also when it lies "
            "wholly above or below the estimate; a dot without a line: interval withheld, "
            "the design is too small for one, see the table), grey band = the noise floor from the "
            "null mean to its 95th percentile (LVLM: shuffled group labels), grey tick = "
            "the BiasIG S_imp ceiling; dashed line at 0 for the ContextBias BI shift."
        ),
        png=F.to_png(fig),
    )
