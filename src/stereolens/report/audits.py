"""Report sections of the per-group extractor audits (issue 15): the ContextBias extraction
validation per demographic group and the LVLM assistant's story reading per group, shown
next to the bias scores they qualify. Tables come from stereolens.metrics.group_audit
(rules audit_contextbias_extraction_by_group and audit_lvlm_story_reading)."""

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
    "error gap = the largest difference in error rate (1 - accuracy) between two groups, "
    "with a Newcombe interval; p_value = a test of equal accuracy across the groups ({test}). "
    "bias = {bias}; flag = the gap exceeds it."
)


def _flags(gaps: pl.DataFrame, what: str) -> list[str]:
    flagged = gaps.filter(pl.col("flag").fill_null(False)) if gaps.height else gaps
    if flagged.height == 0:
        return []
    lines = [
        " / ".join(str(r[k]) for k in KEYS if k in r and r[k] is not None) + ": " + r["flag_text"]
        for r in flagged.iter_rows(named=True)
    ]
    return [
        f"The {what} errs more for some groups than the bias it is used to measure: these "
        "differences alone could make or hide that bias. " + "; ".join(lines)
    ]


def _gap_table(id: str, gaps: pl.DataFrame, keys: list[str], caption: str) -> Table:
    shown = gaps.with_columns(
        pl.format("{} vs {}", pl.col("worst_group"), pl.col("best_group")).alias("worst vs best")
    ).select(*keys, "n_groups", "n_items", "worst vs best", "error_gap", "gap_low",
             "gap_high", "test", "p_value", "bias", "flag")  # fmt: skip
    return Table(
        id, "Error gap between groups", caption, shown,
        intervals={"error_gap": ("gap_low", "gap_high")}, csv=gaps,
    )  # fmt: skip


def _rates_table(id: str, rates: pl.DataFrame, keys: list[str], caption: str) -> Table:
    cols = [c for pair in RATE_INTERVALS.items() for c in (pair[0], *pair[1])]
    shown = rates.select(*keys, "group", "n_items", *cols)
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
            "No extractor error gap between groups exceeds the bias it is used to measure."
        )
    keys = ["extractor", "model", "grouping", "group_dimension"]
    if gaps.height:
        section.tables.append(
            _gap_table(
                "contextbias-validation-group-gaps",
                gaps,
                keys,
                GAP_CAPTION.format(
                    test="chi-squared; Fisher's exact test for two small groups",
                    bias="|CA-U - CF| overall BI shift of the extractor and model",
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
            "intervals, F1 with a bootstrap interval over items; model * = the generators "
            "pooled.",
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
            "No reading error gap between groups exceeds the bias it is used to measure."
        )
    if gaps.height:
        section.tables.append(
            _gap_table(
                "lvlm-story-reading-gaps",
                gaps,
                ["assistant", "axis"],
                GAP_CAPTION.format(
                    test="Cochran's Q: the same story fields read under every group",
                    bias="the smallest story TVD of the audited models on the axis, as a share",
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
            "element of a list attribute; accuracy = recall (Wilson), precision (Wilson), F1 "
            "(bootstrap over items).",
        )
    )
    return section
