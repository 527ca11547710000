"""The report section of a per-group reader audit (an extractor's validation, an assistant's
reading): its flags, the error gap between groups and the per-group rates."""

from __future__ import annotations

import polars as pl

from stereolens.report.html import Section, Table

KEYS = ("extractor", "model", "grouping", "group_dimension", "assistant", "axis")
RATE_INTERVALS = {
    "accuracy": ("accuracy_low", "accuracy_high"),
    "precision": ("precision_low", "precision_high"),
    "f1": ("f1_low", "f1_high"),
}

GAP_CAPTION = (
    "error gap = the largest difference in error rate (1 - accuracy) between two groups. Its "
    "interval holds for every pair of groups at once (Agresti-Caffo differences, Bonferroni-t "
    "critical value over all pairs: critical_value), so it allows for the worst and best "
    "groups being picked after looking; under no true difference it excludes 0 in at most 5% "
    "of audits (the Newcombe interval on the picked pair: 46% with 7 x 100 items). {unit} "
    "design effect = the cluster variance over the binomial one. p_value = a test of equal "
    "accuracy across the groups ({test}). induced = {induced}; bias = {bias}; flag = induced "
    ">= bias (like with like: both are plug-in values of the same formula; induced is a "
    "little above its population value under noise, like every such plug-in). Below the "
    "sizes at which they cover (bench/COVERAGE.md; stereolens.metrics.group_audit: "
    "{minimum}) an interval or p-value is withheld and interval_note says why."
)
MINIMUM = (
    "per-group intervals need {clusters} clusters per group when items are clustered, F1 "
    "needs {f1} independent items per group, the Rao-Scott test {test} clusters"
)


def minimum_text(test_clusters: int | None = None) -> str:
    """The audit's minimum sizes, as the captions state them."""
    from stereolens.metrics import group_audit as G

    return MINIMUM.format(
        clusters=G.MIN_CLUSTERS, f1=G.MIN_F1_ITEMS, test=test_clusters or G.MIN_TEST_CLUSTERS
    )


def min_clusters() -> int:
    from stereolens.metrics import group_audit as G

    return G.MIN_CLUSTERS


def _with_note(frame: pl.DataFrame) -> list[str]:
    return ["interval_note"] if "interval_note" in frame.columns else []


def _flags(gaps: pl.DataFrame, what: str) -> list[str]:
    flagged = gaps.filter(pl.col("flag").fill_null(False)) if gaps.height else gaps
    if flagged.height == 0:
        return []
    lines = [
        " / ".join(str(r[k]) for k in KEYS if k in r and r[k] is not None) + ": " + r["flag_text"]
        for r in flagged.iter_rows(named=True)
    ]
    return [
        f"The {what} errs unevenly enough across groups that these errors alone would "
        "produce at least the bias it is used to measure: they could make or hide that "
        "bias. " + "; ".join(lines)
    ]


def _gap_table(id: str, gaps: pl.DataFrame, keys: list[str], caption: str) -> Table:
    for c in ("critical_value", "cluster", "n_clusters", "design_effect", "induced_bias"):
        if c not in gaps.columns:  # an older table without the column: shown as missing
            gaps = gaps.with_columns(pl.lit(None).alias(c))
    shown = gaps.with_columns(
        pl.format("{} vs {}", pl.col("worst_group"), pl.col("best_group")).alias("worst vs best")
    ).select(*keys, "n_groups", "n_items", "worst vs best", "error_gap", "gap_low",
             "gap_high", "critical_value", "cluster", "n_clusters", "design_effect", "test",
             "p_value", "induced_bias", "bias", "flag", *_with_note(gaps))  # fmt: skip
    return Table(
        id, "Error gap between groups", caption, shown,
        intervals={"error_gap": ("gap_low", "gap_high")}, csv=gaps,
    )  # fmt: skip


def _rates_table(id: str, rates: pl.DataFrame, keys: list[str], caption: str) -> Table:
    cols = [c for pair in RATE_INTERVALS.items() for c in (pair[0], *pair[1])]
    shown = rates.select(*keys, "group", "n_items", *cols, *_with_note(rates))
    return Table(id, "Per group", caption, shown, intervals=RATE_INTERVALS, csv=rates)


def audit_section(
    ids: tuple[str, str, str],
    title: str,
    rates: pl.DataFrame,
    gaps: pl.DataFrame,
    keys: list[str],
    text: dict[str, str],
) -> Section:
    """A reader audit's section: its flags, the error gap between groups and the per-group
    rates. ``ids`` = (section, gap table, rates table); ``text``: its words by key."""
    section = Section(ids[0], title)
    if rates.height == 0:
        section.paragraphs.append(text["empty"])
        return section
    section.warnings += _flags(gaps, text["what"])
    if not section.warnings:
        section.paragraphs.append(text["fine"])
    if gaps.height:
        section.tables.append(_gap_table(ids[1], gaps, keys, text["gap_caption"]))
    section.tables.append(_rates_table(ids[2], rates, keys, text["rates_caption"]))
    return section
