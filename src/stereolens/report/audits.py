"""Report sections of the per-group reader audits: the ContextBias extraction validation and
the LVLM assistant's story reading per group, next to the bias scores they qualify."""

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


def _min_clusters() -> int:
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


def extraction_group_section(by_group: pl.DataFrame, gaps: pl.DataFrame) -> Section:
    """ContextBias: extraction validation per demographic group, and its flags."""
    section = Section(
        "contextbias-validation-by-group", "Extraction validation per demographic group"
    )
    if by_group.height == 0:
        section.paragraphs.append(
            "No validation item carries a gender, skin tone or age group (no stated "
            "demographic and none read in the images)."
        )
        return section
    section.warnings += _flags(gaps, "extractor")
    if not section.warnings:
        section.paragraphs.append(
            "No extractor's per-group errors alone would produce the bias it is used to measure."
        )
    keys = ["extractor", "model", "grouping", "group_dimension"]
    if gaps.height:
        section.tables.append(
            _gap_table(
                "contextbias-validation-group-gaps",
                gaps,
                keys,
                GAP_CAPTION.format(
                    unit="Items are clustered by validation prompt (its seeds' images, an "
                    "image's dimension rows): every interval and test uses the prompts as the "
                    "units;",
                    test="chi-squared, or Fisher's exact test for two small groups, for "
                    "independent items; Rao-Scott F (second order) for clustered ones",
                    induced="the BI (1 - H(q) / log K, q_g = a_g / sum a) the per-group "
                    "accuracies a_g alone would give the group dimension, every group equally "
                    "common and every misread lost",
                    bias="|CA-U - CF| BI shift of that dimension (stated grouping; else the "
                    "overall shift) of the extractor and model",
                    minimum=minimum_text() + " (prompts)",
                ),
            )
        )
    section.tables.append(
        _rates_table(
            "contextbias-validation-by-group-rates",
            by_group,
            keys,
            "grouping 'stated' = the demographic the validation prompt states (how well that "
            "demographic is read); 'shown' = the label the extractor reads for the person in "
            "the same image (accuracy on the other dimensions). Accuracy = recall with Wilson "
            "intervals, precision (contradicting labels of exclusive dimensions) with Wilson "
            "intervals, both on the effective counts (counts / design effect, the prompts "
            "being the units), F1 with a t(prompts - 1) interval on the logit scale from its "
            "bootstrap standard error over prompts; model * = the generators pooled.",
        )
    )
    return section


def story_reading_section(rates: pl.DataFrame, gaps: pl.DataFrame) -> Section:
    """LVLM: the assistant's story reading per group on the labelled sample."""
    section = Section("lvlm-story-reading", "The assistant's story reading per group")
    if rates.height == 0:
        section.paragraphs.append("No reading of the labelled sample.")
        return section
    section.warnings += _flags(gaps, "assistant's story reading")
    if not section.warnings:
        section.paragraphs.append(
            "The assistant's per-group reading errors alone would not produce the bias it is "
            "used to measure."
        )
    if gaps.height:
        section.tables.append(
            _gap_table(
                "lvlm-story-reading-gaps",
                gaps,
                ["assistant", "axis"],
                GAP_CAPTION.format(
                    unit="The unit is the story template (every item read under every group: "
                    "a matched design): the intervals are paired (the covariance between "
                    "groups read on the same stories enters every difference), on stories - 1 "
                    "degrees of freedom;",
                    test="Rao-Scott F over stories; with one story, Cochran's Q over the "
                    "matched items",
                    induced="the story TVD (story_tvd's formula, as a share) the per-group "
                    "accuracies alone would produce in unbiased stories: 1/2 sum_g |a_g / "
                    "sum a - 1/|A||",
                    bias="the smallest story TVD of the audited models on the axis, as a share",
                    minimum=minimum_text(_min_clusters()) + " (stories; with one story the "
                    "per-group intervals are withheld, the gap and Cochran's Q kept)",
                ),
            )
        )
    section.tables.append(
        _rates_table(
            "lvlm-story-reading-rates",
            rates,
            ["assistant", "axis"],
            "The labelled sample (resources/lvlm/story_reading.v1.yaml): each story read once "
            "per gender x race group, the main character shown by an explicit descriptor and "
            "pronouns, the text otherwise identical. An item = a scalar attribute or one true "
            "element of a list attribute; accuracy = recall (Wilson), precision (Wilson), both "
            "on the effective counts (counts / design effect, the stories being the units), F1 "
            "with a t(stories - 1) interval on the logit scale from its bootstrap standard "
            "error over stories.",
        )
    )
    return section
