"""Report sections of the per-group extractor audits (issue 15, item 4), shown next to the
bias scores they qualify: after the ContextBias extraction validation and after the LVLM
scores. HTML fragments (the report's own CSS classes: table, caption, warning)."""

from __future__ import annotations

import html

import polars as pl


def _table(frame: pl.DataFrame, caption: str, digits: int = 3) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    body = []
    for row in frame.iter_rows():
        cells = []
        for v in row:
            if isinstance(v, float):
                v = "" if v != v else f"{v:.{digits}f}"
            cells.append(f"<td>{html.escape('' if v is None else str(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f"<table><caption>{html.escape(caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _interval(frame: pl.DataFrame, col: str) -> pl.Expr:
    lo, hi = f"{col}_low", f"{col}_high"
    return (
        pl.when(pl.col(col).is_not_null())
        .then(
            pl.format(
                "{} [{}, {}]",
                pl.col(col).round(3),
                pl.col(lo).round(3),
                pl.col(hi).round(3),
            )
        )
        .otherwise(pl.lit(""))
        .alias(col)
    )


def _flags(gaps: pl.DataFrame, what: str) -> list[str]:
    flagged = gaps.filter(pl.col("flag"))
    if flagged.height == 0:
        return [
            f"<p>No {what} error gap between groups exceeds the bias it is used to measure.</p>"
        ]
    items = "".join(
        f"<li>{html.escape(' / '.join(str(r[k]) for k in r if k in KEYS and r[k] is not None))}: "
        f"{html.escape(r['flag_text'])}</li>"
        for r in flagged.iter_rows(named=True)
    )
    return [
        f"<div class='warning'>The {what} errs more for some groups than the bias it is used "
        f"to measure: these differences alone could make or hide that bias.<ul>{items}</ul></div>"
    ]


KEYS = ("extractor", "model", "grouping", "group_dimension", "assistant", "axis")


def _gap_table(gaps: pl.DataFrame, keys: list[str], caption: str) -> str:
    shown = gaps.with_columns(
        pl.format(
            "{} [{}, {}]", pl.col("error_gap").round(3), pl.col("gap_low").round(3),
            pl.col("gap_high").round(3),
        ).alias("error gap [95% CI]"),
        pl.format("{} vs {}", pl.col("worst_group"), pl.col("best_group")).alias("worst vs best"),
    ).select(*keys, "n_groups", "n_items", "worst vs best", "error gap [95% CI]", "test",
             "p_value", "bias", "flag")  # fmt: skip
    return _table(shown, caption)


def extraction_group_sections(by_group: pl.DataFrame, gaps: pl.DataFrame) -> list[str]:
    """ContextBias: extraction validation per demographic group, and its flags."""
    out = ["<h3>Extraction validation per demographic group</h3>"]
    if by_group.height == 0:
        return out + [
            "<p>No validation item carries a gender, skin tone or age group (no stated "
            "demographic and none read in the images).</p>"
        ]
    out += _flags(gaps, "extractor")
    keys = ["extractor", "model", "grouping", "group_dimension"]
    rates = by_group.select(
        *keys, "group", "n_items", _interval(by_group, "accuracy"),
        _interval(by_group, "precision"), _interval(by_group, "f1"),
    )  # fmt: skip
    if gaps.height:
        out.append(
            _gap_table(
                gaps,
                keys,
                "Largest difference in error rate (1 - accuracy) between two groups, with a "
                "Newcombe interval, and a test of equal accuracy across the groups (chi-squared; "
                "Fisher's exact test for two small groups). bias = |CA-U - CF| overall BI shift "
                "of the extractor and model; flag = the gap exceeds it.",
            )
        )
    out.append(
        _table(
            rates,
            "Per group: grouping 'stated' = the demographic the validation prompt states (how "
            "well that demographic is read); 'shown' = the label the extractor reads for the "
            "person in the same image (accuracy on the other dimensions). Accuracy = recall "
            "with Wilson intervals, precision (contradicting labels of exclusive dimensions) "
            "with Wilson intervals, F1 with a bootstrap interval over items; model * = the "
            "generators pooled.",
        )
    )
    return out


def story_reading_sections(rates: pl.DataFrame, gaps: pl.DataFrame) -> list[str]:
    """LVLM: the assistant's story reading per group on the labelled sample."""
    out = ["<h3>The assistant's story reading per group</h3>"]
    if rates.height == 0:
        return out + ["<p>No reading of the labelled sample.</p>"]
    out += _flags(gaps, "assistant's story reading")
    if gaps.height:
        out.append(
            _gap_table(
                gaps,
                ["assistant", "axis"],
                "Largest difference in reading error between two groups (Newcombe interval) "
                "and Cochran's Q test (the same story fields read under every group). bias = "
                "the smallest story TVD of the audited models on the axis, as a share; flag = "
                "the gap exceeds it.",
            )
        )
    out.append(
        _table(
            rates.select(
                "assistant",
                "axis",
                "group",
                "n_items",
                _interval(rates, "accuracy"),
                _interval(rates, "precision"),
                _interval(rates, "f1"),
            ),  # fmt: skip
            "The labelled sample (resources/lvlm/story_reading.v1.yaml): each story read once "
            "per gender x race group, the main character shown by an explicit descriptor and "
            "pronouns, the text otherwise identical. An item = a scalar attribute or one true "
            "element of a list attribute; accuracy = recall (Wilson), precision (Wilson), F1 "
            "(bootstrap over items).",
        )
    )
    return out


def audit_sections(inputs: dict, which: str) -> list[str]:
    """The sections whose tables ``inputs`` names (``which``: contextbias or lvlm)."""

    def read(name):
        path = inputs.get(name)
        return pl.read_parquet(path) if path else None

    if which == "contextbias":
        by_group, gaps = read("validation_by_group"), read("validation_group_gaps")
        return [] if by_group is None or gaps is None else extraction_group_sections(by_group, gaps)
    rates, gaps = read("story_reading"), read("story_reading_gaps")
    return [] if rates is None or gaps is None else story_reading_sections(rates, gaps)
