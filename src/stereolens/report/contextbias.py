"""The ContextBias part of the report (paper 002): headline numbers for the bias profile,
the section (figures first: BI by condition, BI per dimension, the bootstrap
differences, CCS per role and label; then the tables) and the image galleries.

Entry points (the same in every benchmark module of the report): ``facts``, ``profile``,
``sections`` and ``galleries``, each taking the report's :class:`Inputs` and the config.
"""

from __future__ import annotations

import polars as pl

from stereolens.report import figures as F
from stereolens.report.audits import extraction_group_section
from stereolens.report.galleries import Card, GalleryPage, GallerySettings, Group, ImageRef, draw
from stereolens.report.html import Figure, Section, Table
from stereolens.report.inputs import Inputs
from stereolens.report.summary import profile_frame

KEY = "contextbias"
TITLE = "ContextBias"
CONDITIONS = ["CF", "CA-R", "CA-U"]
COHORT_ORDER = ["people", "objects", "camera", "scene"]
BI_FORMULA = "BI = 1 - H(p)/log K (paper Eq. 1), H the Shannon entropy of the label shares p"


def enabled(inputs: Inputs, config: dict) -> bool:
    return inputs.has("bi")


def _keys(frame: pl.DataFrame) -> list[str]:
    return (["extractor"] if "extractor" in frame.columns else []) + ["model"]


def primary_extractor(inputs: Inputs, config: dict) -> str | None:
    """The extractor whose numbers the bias profile shows: the first one the config lists
    (the paper's GPT-5-mini in config/config.yaml), else the first in the tables."""
    bi = inputs.get("bi")
    if bi is None or "extractor" not in bi.columns or bi.is_empty():
        return None
    listed = (config.get("contextbias") or {}).get("extractors") or []
    present = sorted(bi["extractor"].unique().to_list())
    return next((e for e in listed if e in present), present[0] if present else None)


def _only_extractor(frame: pl.DataFrame, extractor: str | None) -> pl.DataFrame:
    if extractor is None or "extractor" not in frame.columns:
        return frame
    return frame.filter(pl.col("extractor") == extractor)


def _cohorts(values) -> list[str]:
    got = [c for c in values if c != "*"]
    ordered = [c for c in COHORT_ORDER if c in got] + sorted(
        c for c in got if c not in COHORT_ORDER
    )
    return ordered


# ------------------------------------------------------------------ facts and profile


def facts(inputs: Inputs, config: dict) -> list[str]:
    """Lines for the first screen: the models, then the scale."""
    cb = config.get("contextbias") or {}
    prompts, images = inputs.get("prompts"), inputs.get("images")
    gens = cb.get("generators") or (
        sorted(images["model"].unique().to_list()) if images is not None else []
    )
    exts = cb.get("extractors") or []
    lines = [f"generators {', '.join(gens)}" + (f"; extractors {', '.join(exts)}" if exts else "")]
    scale = []
    if prompts is not None:
        scale.append(
            f"{prompts['role'].n_unique()} roles x 3 conditions, {prompts.height:,} prompts"
        )
    if images is not None and images.height:
        n_img = images["image_id"].n_unique()
        bad = images.filter(pl.col("status") != "ok").height
        scale.append(f"{n_img:,} images ({bad:,} extractions discarded)")
    if scale:
        lines.append("; ".join(scale))
    return lines


def _wilson(k: int, n: int) -> tuple[float | None, float | None]:
    if n <= 0:
        return None, None
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(k, n, alpha=0.05, method="wilson")
    return 100.0 * float(lo), 100.0 * float(hi)


def profile(inputs: Inputs, config: dict) -> pl.DataFrame:
    """Per generator: the overall BI shift CA-U - CF with its role-bootstrap interval, and
    the share of context-invariant (role, label) pairs with a Wilson interval."""
    extractor = primary_extractor(inputs, config)
    several = len((config.get("contextbias") or {}).get("extractors") or []) > 1
    title = f"{TITLE}, extractor {extractor}" if extractor and several else TITLE
    rows = []
    boot = inputs.get("bootstrap")
    ccs = inputs.get("ccs", columns=["extractor", "model", "consistent"])
    models = []
    if boot is not None:
        b = _only_extractor(boot, extractor).filter(
            (pl.col("model") != "*")
            & (pl.col("cohort") == "*")
            & (pl.col("dimension") == "*")
            & (pl.col("comparison") == "CA-U - CF")
        )
        for r in b.sort("model").iter_rows(named=True):
            models.append(r["model"])
            rows.append(
                {
                    "model": r["model"],
                    "metric": "bi_shift",
                    "label": "BI shift CA-U - CF",
                    "panel": "BI shift CA-U - CF",
                    "estimate": r["estimate"],
                    "ci_low": r["ci_low"],
                    "ci_high": r["ci_high"],
                    "reading": "0 = context changes nothing",
                    "reference": 0.0,
                }
            )
    if ccs is not None and not ccs.is_empty():
        c = _only_extractor(ccs, extractor).filter(pl.col("consistent").is_not_null())
        agg = c.group_by("model").agg(pl.col("consistent").sum().alias("k"), pl.len().alias("n"))
        for r in agg.sort("model").iter_rows(named=True):
            lo, hi = _wilson(int(r["k"]), int(r["n"]))
            rows.append(
                {
                    "model": r["model"],
                    "metric": "invariant_pct",
                    "label": "context-invariant pairs %",
                    "panel": "context-invariant pairs %",
                    "estimate": 100.0 * r["k"] / r["n"] if r["n"] else None,
                    "ci_low": lo,
                    "ci_high": hi,
                    "n": int(r["n"]),
                    "reading": "% of tested (role, label) pairs",
                    "note": f"{int(r['k'])} of {int(r['n'])} pairs",
                }
            )
    for r in rows:
        r.update(benchmark=KEY, benchmark_title=title)
    return profile_frame(rows)


# ------------------------------------------------------------------ figures


def bi_condition_figure(bi: pl.DataFrame) -> Figure | None:
    """Pooled BI by condition, one panel per cohort and overall, one line per model."""
    rows = bi.filter((pl.col("dimension") == "*") & (pl.col("aggregation") == "pooled"))
    if rows.is_empty():
        return None
    cohorts = _cohorts(rows["cohort"].unique().to_list()) + ["*"]
    fig, axes = F.subplots(1, len(cohorts), width=2.9 * len(cohorts), height=2.8, sharey=True)
    keys = _keys(rows)
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
    rows = _only_extractor(rows, extractor)
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
    rows = _only_extractor(rows, extractor)
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
            got = {r["model"]: r for r in sub.filter(pl.col("comparison") == comp).to_dicts()}

            def col(name, got=got):
                return [got[m][name] if m in got else None for m in models]

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
            "mean of the cohorts); dot = estimate, line = 95% percentile interval of a "
            f"role-level cluster bootstrap ({reps} replicates, roles resampled with "
            "replacement); an interval that excludes the dashed 0 line is a shift the "
            "role sample supports" + (f"; extractor {extractor}" if extractor else "") + "."
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
    rows = _only_extractor(rows, extractor).with_columns(
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


# ------------------------------------------------------------------ tables


def _bi_tables(bi: pl.DataFrame) -> list[Table]:
    keys = _keys(bi)
    if bi.is_empty():
        return [
            Table("contextbias-bi", "Bias Intensity", "No attributes were extracted: no BI.", bi)
        ]
    pooled = bi.filter(pl.col("aggregation") == "pooled")
    wide = pooled.filter(pl.col("dimension") == "*").pivot(
        on="condition", index=keys + ["cohort"], values="bi"
    )
    wide = wide.select(keys + ["cohort"] + [c for c in CONDITIONS if c in wide.columns])
    if {"CF", "CA-U"} <= set(wide.columns):
        wide = wide.with_columns((pl.col("CA-U") - pl.col("CF")).alias("CA-U - CF"))
    agg = bi.filter((pl.col("dimension") == "*") & (pl.col("model") == "*")).pivot(
        on="condition", index=keys[:-1] + ["aggregation", "cohort"], values="bi"
    )
    agg = agg.select(
        keys[:-1] + ["aggregation", "cohort"] + [c for c in CONDITIONS if c in agg.columns]
    )
    dims = pooled.filter(pl.col("dimension") != "*").pivot(
        on="condition", index=keys + ["cohort", "dimension"], values="bi"
    )
    dims = dims.select(
        keys + ["cohort", "dimension"] + [c for c in CONDITIONS if c in dims.columns]
    )
    return [
        Table(
            "contextbias-bi-cohort",
            "Pooled BI per cohort and condition (paper Fig. 3)",
            f"{BI_FORMULA} over label counts pooled across roles; cohort '*' = the mean of the "
            "cohort values; model '*' = the mean over models; CA-U - CF the shift the "
            "profile reports.",
            wide.sort(keys + ["cohort"]),
        ),
        Table(
            "contextbias-bi-aggregations",
            "BI pooled over roles vs averaged per role (paper Table 10, App. E.2)",
            "Mean over models: pooled = one distribution over all roles; role = mean of the "
            "per-role BI; role_matched = per role at matched support (subsampled to the "
            "smallest cell); role_miller_madow = per role with the Miller-Madow entropy "
            "correction H + (K_obs - 1)/(2n).",
            agg.sort(pl.all()),
        ),
        Table(
            "contextbias-bi-dimension",
            "Pooled BI per dimension and condition (paper Fig. 4)",
            f"{BI_FORMULA} per dimension, every model and their mean ('*').",
            dims.sort(keys + ["cohort", "dimension"]),
        ),
    ]


def _bootstrap_tables(boot: pl.DataFrame) -> list[Table]:
    cols = [
        c
        for c in (
            "extractor",
            "model",
            "cohort",
            "dimension",
            "comparison",
            "estimate",
            "ci_low",
            "ci_high",
        )
        if c in boot.columns
    ]
    reps = boot["replicates"][0] if boot.height else 0
    iv = {"estimate": ("ci_low", "ci_high")}
    overall = boot.filter((pl.col("model") == "*") & (pl.col("dimension") == "*"))
    per_model = boot.filter(
        (pl.col("model") != "*")
        & (pl.col("dimension") == "*")
        & (pl.col("comparison") == "CA-U - CF")
    )
    camera = boot.filter(
        (pl.col("model") == "*") & (pl.col("cohort") == "camera") & (pl.col("dimension") != "*")
    )
    return [
        Table(
            "contextbias-bootstrap-overall",
            "BI differences across generators (paper Table 8)",
            f"Delta BI with 95% percentile intervals, {reps} role-level cluster-bootstrap "
            "replicates.",
            overall.select(cols).sort(pl.all()),
            intervals=iv,
        ),
        Table(
            "contextbias-bootstrap-model",
            "CA-U - CF per generator (paper Table 9)",
            "Delta BI = BI(CA-U) - BI(CF) per generator and cohort with 95% intervals.",
            per_model.select(cols).sort(pl.all()),
            intervals=iv,
        ),
        Table(
            "contextbias-bootstrap-camera",
            "Camera cohort per dimension (paper App. E.1)",
            "Opposing shifts of the camera dimensions that the cohort mean hides.",
            camera.select(cols).sort(pl.all()),
            intervals=iv,
        ),
    ]


def _robustness_caption(robustness: pl.DataFrame) -> str:
    cells = robustness["cells"][0] if robustness.height and "cells" in robustness.columns else None
    if cells == "released":
        return (
            "Prompt robustness as the authors' released code computes it (paper Table 3): per "
            "(model, role, label) of the model x dimension label grid, the CA-R and CA-U cells "
            "against the label's share among all the model's other images (only the cell "
            "itself left out), chi-squared with df 1; an untestable tuple counts as invariant "
            "with p = 1. pct_invariant = % of tuples with p > 0.05, mean p, CF prevalence %; "
            "cohort '*' (the paper's All) covers People, Objects and Camera."
        )
    return (
        f"Leave-one-out chi-squared over the cells '{cells}': share of tested (role, label) "
        "tuples whose distribution over the cells matches the other roles' (p > 0.05), mean "
        "p, CF prevalence (not the paper's Table 3 computation; see --robustness-cells)."
    )


def _ccs_tables(inputs: Inputs) -> list[Table]:
    out = []
    ccs_mean = inputs.get("ccs_mean")
    if ccs_mean is not None:
        top = ccs_mean.filter(
            pl.col("ccs_mean").is_not_null() & pl.col("ccs_mean").is_not_nan()
        ).sort(["ccs_mean", "role", "dimension", "label"], descending=[True, False, False, False])
        out.append(
            Table(
                "contextbias-ccs-top",
                "Labels with the highest cross-generator mean CCS (paper Tables 2 and 11)",
                "CCS = Prev% / (1 + range pp); n_invariant = generators where the label is "
                "context-invariant (p > 0.05 and range <= 5 pp); n_ccs = generators where "
                "CCS is defined. Labels where CCS is undefined everywhere are left out (the "
                "CSV of the full table has them).",
                top,
                max_rows=100,
                csv=ccs_mean,
            )
        )
    ccs = inputs.get("ccs")
    if ccs is not None:
        keep = [
            c
            for c in ("extractor", "model", "role", "cohort", "dimension", "label",
                      "prevalence_pct", "range_pp", "chi2", "df", "p", "p_bh", "ccs", "consistent")
            if c in ccs.columns
        ]  # fmt: skip
        out.append(
            Table(
                "contextbias-ccs",
                "CCS and the chi-squared test per model, role and label",
                "Per model x role x dimension x label: prevalence %, range pp across "
                "conditions, chi-squared homogeneity test of the three conditions (df, p, "
                "Benjamini-Hochberg p_bh within the model), CCS (null where undefined), "
                "consistent = p > 0.05 and range <= 5 pp. Sorted by CCS.",
                ccs.select(keep).sort(
                    ["ccs", "model", "role", "dimension", "label"],
                    descending=[True, False, False, False, False],
                    nulls_last=True,
                ),
                max_rows=100,
                csv=ccs,
            )
        )
    robustness = inputs.get("robustness")
    if robustness is not None:
        out.append(
            Table(
                "contextbias-robustness",
                "Prompt robustness (paper Table 3)",
                _robustness_caption(robustness),
                robustness.sort(pl.all()),
            )
        )
    return out


def _extraction_tables(images: pl.DataFrame) -> list[Table]:
    by = [c for c in ("extractor", "model") if c in images.columns]
    status = (
        images.group_by(by)
        .agg(
            pl.col("image_id").n_unique().alias("images"),
            (pl.col("status") == "ok").sum().alias("ok"),
            (pl.col("status") != "ok").sum().alias("discarded"),
            pl.col("attempts").mean().alias("mean_attempts")
            if "attempts" in images.columns
            else pl.lit(None).alias("mean_attempts"),
        )
        .with_columns((100.0 * pl.col("discarded") / pl.col("images")).alias("discarded_pct"))
        .sort(by)
    )
    out = [
        Table(
            "contextbias-extraction-status",
            "Extraction status per extractor and generator",
            "images: generated images; discarded: images without a valid answer after the "
            "configured number of attempts (their attributes are not counted); "
            "discarded_pct = discarded / images x 100.",
            status,
            digits=2,
        )
    ]
    failed = images.filter(pl.col("status") != "ok")
    if failed.height:
        reasons = (
            failed.with_columns(pl.col("reason").str.replace_all(r"\d+", "N").alias("reason"))
            .group_by("reason")
            .agg(pl.len().alias("images"))
            .sort(["images", "reason"], descending=[True, False])
        )
        out.append(
            Table(
                "contextbias-discard-reasons",
                "Why images were discarded",
                "Discard reasons with numbers replaced by N, most frequent first.",
                reasons,
            )
        )
    return out


def _validation_section(scores: pl.DataFrame) -> Section:
    keep = [
        c
        for c in ("extractor", "model", "kind", "dimension", "n_images", "accuracy", "recall",
                  "precision", "f1", "f1_paper")
        if c in scores.columns
    ]  # fmt: skip
    stated = scores.filter(pl.col("kind") == "stated") if "kind" in scores.columns else scores
    return Section(
        "contextbias-validation",
        "Extraction validation",
        paragraphs=[
            "Images generated from the 220 explicit-attribute prompts (the attribute is stated "
            "in the prompt), scored against what the prompt states."
        ],
        tables=[
            Table(
                "contextbias-validation-model",
                "Accuracy, recall and F1 per model (paper Table 1)",
                "accuracy = correct / images; recall and precision over the stated labels; "
                "f1 = 2PR/(P+R); f1_paper = 2 acc / (1 + acc), the paper's identity.",
                stated.filter(pl.col("dimension") == "*").select(keep).sort(pl.all()),
            ),
            Table(
                "contextbias-validation-dimension",
                "Per dimension (paper Table 7)",
                "The same scores per stated dimension.",
                stated.filter(pl.col("dimension") != "*").select(keep).sort(pl.all()),
            ),
        ],
    )


def _canonical_section(mapping: pl.DataFrame) -> Section:
    section = Section("contextbias-canonicalisation", "Canonicalisation of open-vocabulary labels")
    if mapping.is_empty():
        section.paragraphs.append("Canonicalisation is off or found no open-vocabulary labels.")
        return section
    summary = (
        mapping.group_by("dimension", "decided_by")
        .agg(
            pl.len().alias("raw_labels"),
            pl.col("cluster_id").n_unique().alias("clusters"),
            pl.col("core_label").n_unique().alias("core_labels"),
        )
        .sort(pl.all())
    )
    section.tables += [
        Table(
            "contextbias-canonical-summary",
            "Raw labels, clusters and core labels per dimension",
            "Raw labels, embedding clusters (cosine similarity >= threshold) and final core "
            "labels per dimension and deciding step; review and override with "
            "results/contextbias/canonical_mapping.csv.",
            summary,
        ),
        Table(
            "contextbias-canonical-mapping",
            "The mapping, most frequent raw labels first",
            "Every raw label with its cluster, canonical and core label and the step that "
            "decided it.",
            mapping.sort(["count", "dimension", "raw_label"], descending=[True, False, False]),
            max_rows=100,
        ),
    ]
    return section


def sections(inputs: Inputs, config: dict) -> list[Section]:
    """The ContextBias section: figures first, then the settings, the tables, and the
    validation, canonicalisation and agreement subsections."""
    if not enabled(inputs, config):
        return []
    cb = config.get("contextbias") or {}
    metrics = cb.get("metrics") or {}
    bi = inputs.get("bi")
    boot = inputs.get("bootstrap")
    ccs_mean = inputs.get("ccs_mean")
    figures = [
        f
        for f in (
            bi_condition_figure(bi),
            bi_dimension_figure(bi),
            bootstrap_figure(boot) if boot is not None else None,
            ccs_heatmap(ccs_mean) if ccs_mean is not None else None,
        )
        if f is not None
    ]
    main = Section(
        "contextbias",
        "ContextBias: do role-linked attributes persist when the context changes?",
        figures=figures,
        paragraphs=[
            "Each role is prompted context-free (CF), in a role-related context (CA-R) and "
            "in an unrelated context (CA-U); a VLM extracts 30 attribute dimensions of every "
            "image. " + "; ".join(facts(inputs, config)) + ".",
            "Settings: K definition {k}; CCS defined for labels seen in all three conditions "
            "and at least 5 times; context-invariant when p > 0.05 and range <= 5 pp; "
            "bootstrap {b} replicates, seed {s}; matched-support draws {d}.".format(
                k=metrics.get("k_definition", "model"),
                b=metrics.get("replicates", 1000),
                s=metrics.get("seed", 0),
                d=metrics.get("matched_draws", 20),
            ),
        ],
    )
    images = inputs.get("images")
    main.tables += _bi_tables(bi)
    if boot is not None:
        main.tables += _bootstrap_tables(boot)
    main.tables += _ccs_tables(inputs)
    if images is not None:
        main.tables += _extraction_tables(images)
    validation = inputs.get("validation")
    if validation is not None:
        main.subsections.append(_validation_section(validation))
    by_group, group_gaps = inputs.get("validation_by_group"), inputs.get("validation_group_gaps")
    if by_group is not None and group_gaps is not None:
        main.subsections.append(extraction_group_section(by_group, group_gaps))
    mapping = inputs.get("mapping")
    if mapping is not None:
        main.subsections.append(_canonical_section(mapping))
    study = Section("contextbias-agreement", "Human agreement study")
    if inputs.has("annotation_form"):
        study.paragraphs.append(
            "A blinded annotation form is in results/contextbias/annotation/form.html "
            "(answers save to CSV; list them under contextbias.annotation.answers)."
        )
    agreement = inputs.get("agreement")
    if agreement is not None:
        study.tables.append(
            Table(
                "contextbias-agreement-summary",
                "Agreement of the annotators and of the pipeline (paper Sec. 4.3)",
                "Raw agreement, Fleiss' kappa with bootstrap CI, and human consensus vs pipeline.",
                agreement,
            )
        )
    if not study.is_empty():
        main.subsections.append(study)
    return [main]


# ------------------------------------------------------------------ galleries


def _attribute_lines(attrs: pl.DataFrame) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(image_id, extractor) -> [(dimension, labels)], canonical labels after an arrow."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    if attrs.is_empty():
        return out
    if "extractor" not in attrs.columns:
        attrs = attrs.with_columns(pl.lit("").alias("extractor"))
    text = pl.col("label")
    if "canonical_label" in attrs.columns:
        text = (
            pl.when(pl.col("canonical_label").is_not_null() & (pl.col("canonical_label") != text))
            .then(text + " -> " + pl.col("canonical_label"))
            .otherwise(text)
        )
    lines = (
        attrs.with_columns(text.alias("_text"))
        .sort("image_id", "extractor", "dimension", "label")
        .group_by("image_id", "extractor", "dimension", maintain_order=True)
        .agg(pl.col("_text").str.join(", "))
    )
    for image_id, ext, dim, labels in lines.iter_rows():
        out.setdefault((image_id, ext or ""), []).append((dim, labels))
    return out


def galleries(inputs: Inputs, config: dict, settings: GallerySettings) -> list[GalleryPage]:
    """One page per generator: per role x condition, ``contextbias_per_set`` images drawn
    at random (discarded ones included at their rate), each with its prompt, seed,
    extraction status per extractor (with the reason when discarded) and its attributes."""
    images = inputs.get("images")
    if images is None or images.is_empty() or "image_path" not in images.columns:
        return []
    n = settings.contextbias_per_set
    one = images.unique(subset="image_id", keep="first", maintain_order=True)
    sample = draw(one, ["model", "role", "condition"], "image_id", n, settings.seed)
    ids = sample["image_id"].to_list()
    status = images.filter(pl.col("image_id").is_in(ids))
    attrs = pl.DataFrame()
    scan = inputs.scan("attributes")
    if scan is not None:
        cols = [c for c in ("image_id", "extractor", "dimension", "label", "canonical_label")
                if c in inputs.schema("attributes")]  # fmt: skip
        attrs = scan.select(cols).filter(pl.col("image_id").is_in(ids)).collect()
    lines = _attribute_lines(attrs)
    prompts = inputs.get("prompts")
    text = (
        dict(zip(prompts["prompt_id"].to_list(), prompts["text"].to_list(), strict=True))
        if prompts is not None and "text" in prompts.columns
        else {}
    )
    totals = {
        (m, r, c): k for m, r, c, k in one.group_by("model", "role", "condition").len().iter_rows()
    }
    by_image: dict[str, list[dict]] = {}
    for r in status.iter_rows(named=True):
        by_image.setdefault(r["image_id"], []).append(r)
    order = {c: i for i, c in enumerate(CONDITIONS)}
    sample = sample.with_columns(
        pl.col("condition").replace_strict(order, default=len(order)).alias("_order")
    ).sort("model", "role", "_order", maintain_order=True)
    pages = []
    for (model,), part in sample.group_by(["model"], maintain_order=True):
        groups = []
        for (role, cond), g in part.group_by(["role", "condition"], maintain_order=True):
            cards = []
            for r in g.iter_rows(named=True):
                recs = by_image.get(r["image_id"], [r])
                bad = [x for x in recs if x.get("status") != "ok"]
                fields = [
                    ("prompt", text.get(r.get("prompt_id"), "")),
                    ("seed", str(r.get("seed"))),
                    ("image", str(r["image_id"])),
                ]
                for x in recs:
                    ext = x.get("extractor") or ""
                    state = x.get("status") or ""
                    if state != "ok" and x.get("reason"):
                        state += f": {x['reason']}"
                    fields.append((f"{ext} status".strip(), state))
                    fields += [
                        (f"{ext} {d}".strip(), v) for d, v in lines.get((r["image_id"], ext), [])
                    ]
                headline = f"seed {r.get('seed')}"
                if bad:
                    reason = bad[0].get("reason") or ""
                    headline += f": {reason[:140]}" + ("..." if len(reason) > 140 else "")
                cards.append(
                    Card(
                        badge="discarded" if bad else "ok",
                        headline=headline,
                        fields=fields,
                        image=ImageRef(inputs.image_path(r["image_path"]), r.get("image_sha256")),
                        alt=f"{model} {role} {cond} seed {r.get('seed')}",
                        css="discarded" if bad else "",
                        details_label="prompt, attributes",
                    )
                )
            total = totals.get((model, role, cond), len(cards))
            groups.append(Group(f"{role} / {cond}", cards, note=f"{len(cards)} of {total} images"))
        n_bad = sum(c.badge == "discarded" for g in groups for c in g.cards)
        pages.append(
            GalleryPage(
                name=f"contextbias-{model}",
                title=f"ContextBias images of {model}",
                groups=groups,
                paragraphs=[
                    f"Per role and condition, up to {n} images drawn at random (stable seed "
                    f"{settings.seed}); discarded images appear at their rate, with the reason. "
                    "Click 'prompt, attributes' under an image for its prompt, seed and what "
                    "each extractor read from it (raw label -> canonical label)."
                ],
                summary=f"{len(groups)} role x condition sets, {sum(len(g.cards) for g in groups)} "
                f"images ({n_bad} discarded)",
            )
        )
    return pages
