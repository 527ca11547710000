"""The ContextBias figures of the report: BI by condition and cohort, BI per dimension, the
bootstrap differences and the CCS heatmap; with the constants (conditions, cohort order, the
BI formula) and frame helpers the section's tables and galleries share with them.
"""

from __future__ import annotations

import polars as pl

from stereolens.contextbias.metrics import CONDITIONS, _group_keys
from stereolens.report import figures as F
from stereolens.report.html import Figure

COHORT_ORDER = ["people", "objects", "camera", "scene"]
BI_FORMULA = "BI = 1 - H(p)/log K (paper Eq. 1), H the Shannon entropy of the label shares p"


def interval_words(boot: pl.DataFrame) -> str:
    """The bootstrap.parquet interval in words, from its interval column (a table without
    the column has percentile intervals)."""
    kind = boot["interval"][0] if boot.height and "interval" in boot.columns else "percentile"
    if kind == "bc-t":
        return (
            "bias-corrected t intervals (estimate_bc +- t(R - 1) x the replicates' sd x "
            "sqrt(R / (R - 1)), R = the roles)"
        )
    if kind == "basic":
        return "basic bootstrap intervals (2 x estimate - the 97.5 and 2.5 percentiles)"
    return "percentile intervals"


def withheld_words(frame: pl.DataFrame | None) -> str:
    """'' when every interval of ``frame`` is printed, else the sentence saying which are
    withheld and why (its interval_note)."""
    if frame is None or "interval_note" not in frame.columns:
        return ""
    notes = frame["interval_note"].drop_nulls().unique().sort().to_list()
    if not notes:
        return ""
    return " No 95% interval is printed here: " + "; ".join(notes) + "."


def only_extractor(frame: pl.DataFrame, extractor: str | None) -> pl.DataFrame:
    """The rows of one extractor (all rows when there is none or no extractor column)."""
    if extractor is None or "extractor" not in frame.columns:
        return frame
    return frame.filter(pl.col("extractor") == extractor)


def _cohorts(values) -> list[str]:
    got = [c for c in values if c != "*"]
    ordered = [c for c in COHORT_ORDER if c in got] + sorted(
        c for c in got if c not in COHORT_ORDER
    )
    return ordered


def bi_condition_figure(bi: pl.DataFrame) -> Figure | None:
    """Pooled BI by condition, one panel per cohort and overall, one line per model."""
    rows = bi.filter((pl.col("dimension") == "*") & (pl.col("aggregation") == "pooled"))
    if rows.is_empty():
        return None
    cohorts = _cohorts(rows["cohort"].unique().to_list()) + ["*"]
    fig, axes = F.subplots(1, len(cohorts), width=2.9 * len(cohorts), height=2.8, sharey=True)
    keys = _group_keys(rows)
    for ax, cohort in zip(axes[0], cohorts, strict=True):
        sub = rows.filter(pl.col("cohort") == cohort)
        series = []
        for key, g in sub.group_by(keys, maintain_order=True):
            by = dict(zip(g["condition"].to_list(), g["bi"].to_list(), strict=True))
            series.append((" / ".join(map(str, key)), [by.get(c) for c in CONDITIONS]))
        F.lines(ax, CONDITIONS, series, ylim=(0, 1))
        ax.set_title("overall (mean of cohorts)" if cohort == "*" else cohort, fontsize=9)
    axes[0][0].set_ylabel("pooled BI", fontsize=8)
    F.legend(axes[0][-1], loc="best")
    return Figure(
        id="contextbias-bi-condition",
        title="Bias Intensity by condition and cohort (paper Fig. 3)",
        caption=(
            f"{BI_FORMULA}, over label counts pooled across roles; a cohort's value is the "
            "mean over its dimensions, overall the mean of the cohort values; one line per "
            "extractor / generator ('*' = the mean over generators). Higher = more "
            "concentrated (stereotyped) attributes."
        ),
        png=F.to_png(fig),
    )


def bi_dimension_figure(bi: pl.DataFrame) -> Figure | None:
    """Pooled BI per dimension (rows, grouped by cohort) and condition (colours), mean over
    generators (paper Fig. 4)."""
    rows = bi.filter(
        (pl.col("dimension") != "*")
        & (pl.col("aggregation") == "pooled")
        & (pl.col("model") == "*")
    )
    if rows.is_empty():
        return None
    extractors = (
        rows["extractor"].unique().sort().to_list() if "extractor" in rows.columns else [None]
    )
    extractor = extractors[0]
    rows = only_extractor(rows, extractor)
    order = []
    for cohort in _cohorts(rows["cohort"].unique().to_list()):
        dims = rows.filter(pl.col("cohort") == cohort)["dimension"].unique().sort().to_list()
        order += [(cohort, d) for d in dims]
    labels = [f"{d} ({c})" for c, d in order]
    fig, axes = F.subplots(1, 1, width=7.5, height=0.22 * len(order) + 1.2)
    ax = axes[0][0]
    for k, cond in enumerate(CONDITIONS):
        got = {
            (r["cohort"], r["dimension"]): r["bi"]
            for r in rows.filter(pl.col("condition") == cond).iter_rows(named=True)
        }
        vals = [got.get(o) for o in order]
        F.interval_panel(
            ax,
            labels,
            vals,
            [None] * len(vals),
            [None] * len(vals),
            colour=F.COLOURS[k],
            offset=(k - 1) * 0.25,
            label=cond,
        )
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(0, 1)
    ax.set_xlabel("pooled BI (mean over generators)", fontsize=8)
    F.legend(ax, loc="lower right")
    return Figure(
        id="contextbias-bi-dimension",
        title="Bias Intensity per dimension and condition (paper Fig. 4)",
        caption=(
            f"{BI_FORMULA} per attribute dimension over label counts pooled across roles, "
            "K per the run's K definition; the mean over generators"
            + (f", extractor {extractor}" if extractor else "")
            + "; one colour per condition (CF context-free, CA-R role-related, CA-U "
            "unrelated context)."
        ),
        png=F.to_png(fig),
    )


def bootstrap_figure(boot: pl.DataFrame) -> Figure | None:
    """BI differences with their role-bootstrap intervals: one panel per cohort and
    overall, one row per generator ('*' = across generators), one colour per comparison."""
    rows = boot.filter(pl.col("dimension") == "*")
    if rows.is_empty():
        return None
    extractor = (
        rows["extractor"].unique().sort().to_list()[0] if "extractor" in rows.columns else None
    )
    rows = only_extractor(rows, extractor)
    cohorts = ["*"] + _cohorts(rows["cohort"].unique().to_list())
    models = ["*"] + sorted(m for m in rows["model"].unique().to_list() if m != "*")
    labels = ["all generators" if m == "*" else m for m in models]
    comparisons = [c for c in ("CA-R - CF", "CA-U - CF", "CA-U - CA-R") if c in rows["comparison"]]
    fig, axes = F.subplots(
        1, len(cohorts), width=2.8 * len(cohorts) + 0.8, height=0.35 * len(models) * 1.6 + 1.3,
        sharey=True,
    )  # fmt: skip
    for ax, cohort in zip(axes[0], cohorts, strict=True):
        sub = rows.filter(pl.col("cohort") == cohort)
        for k, comp in enumerate(comparisons):
            col = F.columns_by(sub.filter(pl.col("comparison") == comp), "model", models)
            F.interval_panel(
                ax, labels, col("estimate"), col("ci_low"), col("ci_high"),
                colour=F.COLOURS[k], offset=(k - (len(comparisons) - 1) / 2) * 0.25,
                label=comp, reference=0.0,
            )  # fmt: skip
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_title("overall" if cohort == "*" else cohort, fontsize=9)
    F.legend(axes[0][-1], loc="best")
    reps = int(rows["replicates"][0]) if "replicates" in rows.columns else None
    return Figure(
        id="contextbias-bootstrap",
        title="BI differences between conditions with 95% intervals (paper Tables 8-9)",
        caption=(
            "Delta BI = BI(condition a) - BI(condition b) of the cohort means (overall = "
            f"mean of the cohorts); dot = estimate, line = 95% {interval_words(rows)} of a "
            f"role-level cluster bootstrap ({reps} replicates, roles resampled with "
            "replacement); an interval that excludes the dashed 0 line is a shift the "
            "role sample supports"
            + (f"; extractor {extractor}" if extractor else "")
            + "."
            + withheld_words(rows)
        ),
        png=F.to_png(fig),
    )


def ccs_heatmap(
    ccs_mean: pl.DataFrame, max_labels: int = 30, max_roles: int = 100
) -> Figure | None:
    """Cross-generator mean CCS as a role x (dimension: label) heatmap of the labels with
    the highest mean CCS."""
    rows = ccs_mean.filter(pl.col("ccs_mean").is_not_null() & pl.col("ccs_mean").is_not_nan())
    if rows.is_empty():
        return None
    extractor = (
        rows["extractor"].unique().sort().to_list()[0] if "extractor" in rows.columns else None
    )
    rows = only_extractor(rows, extractor).with_columns(
        (pl.col("dimension") + ": " + pl.col("label")).alias("item")
    )
    top = (
        rows.group_by("item")
        .agg(pl.col("ccs_mean").max().alias("top"), pl.len().alias("n"))
        .sort(["top", "n", "item"], descending=[True, True, False])
        .head(max_labels)["item"]
        .to_list()
    )
    sub = rows.filter(pl.col("item").is_in(top))
    roles = (
        sub.group_by("role").agg(pl.col("ccs_mean").max().alias("m"))
        .sort(["m", "role"], descending=[True, False]).head(max_roles)["role"].to_list()
    )  # fmt: skip
    cell = {(r["role"], r["item"]): r["ccs_mean"] for r in sub.iter_rows(named=True)}
    matrix = [[cell.get((role, item)) for item in top] for role in roles]
    fig, axes = F.subplots(
        1, 1, width=max(5.0, 0.24 * len(top) + 2.5), height=max(2.5, 0.16 * len(roles) + 2.2)
    )
    F.heatmap(
        axes[0][0], matrix, roles, top, cmap="magma_r", vmin=0,
        colorbar_label="mean CCS over generators", fig=fig,
    )  # fmt: skip
    return Figure(
        id="contextbias-ccs-heatmap",
        title="Context Consistency Score per role and label (paper Tables 2 and 11)",
        caption=(
            "CCS = Prev% / (1 + range pp) (paper Eq. 3): Prev% the label's prevalence over "
            "the role's images in all conditions, range pp the spread of its per-condition "
            "prevalence in percentage points; defined for labels seen in all three "
            "conditions and at least 5 times; the mean over generators where defined (blank: "
            f"undefined). The {len(top)} labels with the highest CCS and the {len(roles)} "
            "roles where they are highest"
            + (f"; extractor {extractor}" if extractor else "")
            + ". High = a role-linked attribute that persists across contexts."
        ),
        png=F.to_png(fig),
    )
