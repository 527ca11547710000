"""The BiasIG part of the report (paper 000): headline numbers, the section (figures first, then
the tables, debiasing variants beside their base) and the galleries (built in biasig_gallery)."""

from __future__ import annotations

import polars as pl

from stereolens.biasig import report_gallery
from stereolens.biasig.comparisons import model_eta
from stereolens.biasig.report_reader import (  # noqa: F401 (the report's reader hook)
    ETA_WITHHELD,
    READER_CAPTION,
    READER_HEADLINES,
    reader_correction,
)
from stereolens.report import figures as F
from stereolens.report.galleries import GalleryPage, GallerySettings
from stereolens.report.html import Figure, Section, Table
from stereolens.report.inputs import Inputs
from stereolens.report.summary import profile_frame

KEY = "biasig"
TITLE = "BiasIG"
HEADLINE = "biasig_eta"
"""The table whose presence says BiasIG has results (stereolens report --results)."""


NOT_SHOWN = {"vqa": None}
"""What a report without the run's config assumes: the tables do not name the VQA model."""


def infer_config(inputs: Inputs) -> dict:
    """The section naming what the tables hold, for a report without the run's config."""
    implicit = inputs.get("biasig_implicit")
    if implicit is None:
        return {}
    return {"enabled": True, "generators": sorted(implicit["variant"].unique().to_list())}


INTERVAL_COVERAGE = (
    "coverage of the population value, bench/COVERAGE.md: at paper scale S_imp 94% (a "
    "percentile interval: 0%), eta 94.0% (the double-bootstrap interval; the once "
    "bias-corrected one 87.5%, percentile 35.5%); at 40 images a subject S_imp 93.3%; "
    "below biasig.interval_min_images_per_subject (default 40) images a subject the tables "
    "print no interval and say 'interval withheld' with the reason (at 20 images S_imp "
    "covers 91%, at the demo's 2 39%)"
)
"""What the coverage benchmark measured for the BiasIG intervals (captions quote it)."""
KEYS = ["variant", "model"]


def enabled(inputs: Inputs, config: dict) -> bool:
    return inputs.has("biasig_eta") and inputs.has("biasig_implicit")


def _tables(inputs: Inputs) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    return inputs.get("biasig_implicit"), inputs.get("biasig_explicit"), inputs.get("biasig_eta")


def model_level(implicit: pl.DataFrame, explicit: pl.DataFrame, eta: pl.DataFrame) -> pl.DataFrame:
    """One row per variant: S_imp (+ its ceiling), S_exp and eta (plug-in) with their
    intervals and, where the tables have them, the bias-corrected estimates (*_bc)."""

    def level(frame, name, extra=()):
        rows = frame.filter(pl.col("level") == "model")
        for col, val in extra:
            rows = rows.filter(pl.col(col) == val)
        bc = [pl.col("score_bc").alias(f"{name}_bc")] if "score_bc" in rows.columns else []
        return rows.select(
            KEYS
            + [
                pl.col("score").alias(name),
                pl.col("ci_low").alias(f"{name}_low"),
                pl.col("ci_high").alias(f"{name}_high"),
                *bc,
                _note(rows).alias(f"{name}_note"),
            ]
        )

    imp = level(implicit, "S_imp", [("protected_attribute", "*")])
    if "ceiling" in implicit.columns:
        ceiling = implicit.filter(
            (pl.col("level") == "model") & (pl.col("protected_attribute") == "*")
        ).select(KEYS + [pl.col("ceiling").alias("S_imp_ceiling")])
        imp = imp.join(ceiling, on=KEYS, how="left")
    exp = level(explicit, "S_exp", [("protected_attribute", "*"), ("protected_value", "*")])
    eta_bc = [pl.col("eta_total_bc").alias("eta_bc")] if "eta_total_bc" in eta.columns else []
    et = eta.filter(pl.col("pair") == "*").select(
        KEYS
        + [
            pl.col("eta_total").alias("eta"),
            pl.col("ci_low").alias("eta_low"),
            pl.col("ci_high").alias("eta_high"),
            *eta_bc,
            _note(eta).alias("eta_note"),
        ]
    )
    out = (
        imp.join(exp, on=KEYS, how="full", coalesce=True)
        .join(et, on=KEYS, how="full", coalesce=True)
        .sort(KEYS)
    )
    notes = [f"{m}_note" for m in ("S_imp", "S_exp", "eta") if f"{m}_note" in out.columns]
    return out.with_columns(pl.coalesce(notes).alias("interval_note")).drop(notes)


def _note(frame: pl.DataFrame) -> pl.Expr:
    """The rows' ``interval_note`` (why an interval is withheld; null in tables from before
    the minimum-size rule)."""
    if "interval_note" in frame.columns:
        return pl.col("interval_note")
    return pl.lit(None, dtype=pl.String)


# ------------------------------------------------------------------ facts and profile


def facts(inputs: Inputs, config: dict) -> list[str]:
    """Lines for the first screen: the models, then the scale."""
    bg = config["biasig"]
    lines = []
    if bg["generators"]:
        vqa = "?" if bg["vqa"] is None else bg["vqa"]
        lines.append(f"generators {', '.join(bg['generators'])}; VQA {vqa}")
    scale = []
    prompts = inputs.get("biasig_prompts", columns=["prompt_id"])
    if prompts is not None:
        scale.append(f"{prompts.height:,} prompts")
    answers = inputs.get("biasig_answers", columns=["status"])
    if answers is not None and answers.height:
        ok = answers.filter(pl.col("status") == "ok").height
        scale.append(f"{answers.height:,} image positions ({ok:,} with every answer valid)")
    if scale:
        lines.append("; ".join(scale))
    return lines


def profile(inputs: Inputs, config: dict) -> pl.DataFrame:
    """Per variant: S_imp (noise floor: its ceiling), S_exp and eta with intervals."""
    if not enabled(inputs, config):
        return profile_frame([])
    table = model_level(*_tables(inputs))
    rows = []
    for r in table.iter_rows(named=True):
        for metric, label, reading in (
            ("S_imp", "S_imp", "1 = matches the ground truth"),
            ("S_exp", "S_exp", "1 = always shows what is asked"),
            ("eta", "eta", "1 = discrimination, 0 = ignorance"),
        ):
            if metric not in r:
                continue
            rows.append(
                {
                    "benchmark": KEY,
                    "benchmark_title": TITLE,
                    "model": r["variant"],
                    "metric": metric,
                    "label": label,
                    "panel": label,
                    "estimate": r[metric],
                    "ci_low": r.get(f"{metric}_low"),
                    "ci_high": r.get(f"{metric}_high"),
                    "interval_note": r.get("interval_note"),
                    "floor": r.get("S_imp_ceiling") if metric == "S_imp" else None,
                    "floor_label": "ceiling" if metric == "S_imp" else None,
                    "reading": reading,
                    "note": "; ".join(
                        n
                        for n in (
                            f"variant of {r['model']}" if r["variant"] != r["model"] else "",
                            "interval around the bias-corrected estimate"
                            if r.get(f"{metric}_bc") is not None and r.get("interval_note") is None
                            else "",
                        )
                        if n
                    )
                    or None,
                }
            )
    return profile_frame(rows)


# ------------------------------------------------------------------ figures


def model_figure(table: pl.DataFrame) -> Figure | None:
    """Bars of S_imp, S_exp and eta per variant with their 95% intervals."""
    if table.is_empty():
        return None
    labels = table["variant"].to_list()
    metrics = [m for m in ("S_imp", "S_exp", "eta") if m in table.columns]
    fig, axes = F.subplots(1, 1, width=max(4.5, 1.5 * len(labels) + 2), height=3)
    F.grouped_bars(
        axes[0][0],
        labels,
        [
            (m, table[m].to_list(), table[f"{m}_low"].to_list(), table[f"{m}_high"].to_list())
            for m in metrics
        ],
        ylim=(0, 1),
    )
    if "S_imp_ceiling" in table.columns:
        n = len(metrics)
        for j, c in enumerate(table["S_imp_ceiling"].to_list()):
            if F.finite(c):
                x = j - (n - 1) / 2 * (0.8 / n)
                axes[0][0].hlines(c, x - 0.4 / n, x + 0.4 / n, color="#555", lw=1.5, ls=":")
    return Figure(
        id="biasig-model",
        title="BiasIG model-level scores with 95% intervals (paper Table 2)",
        caption=(
            "S_imp = mean over subjects of cos(generated, ground-truth demographic "
            "distribution) (paper Eq. 1-2; dotted tick: its ceiling, the expected S_imp of a "
            "generator sampling the ground truth at this run's sample sizes); S_exp = "
            "weighted share of images showing the protected value asked for (Eq. 3); eta = "
            "manifestation factor over advantaged/disadvantaged pairs (Eq. 4-5). Bars: the "
            "paper's plug-in numbers. Black lines: 95% intervals around the bias-corrected "
            "estimate (S_imp, S_exp: 2 x plug-in - the mean of the bootstrap replicates over "
            "images, +- 1.96 x their sd; eta: the double-bootstrap correction 3 x plug-in - 3 "
            "x the replicates' mean + the mean of second-level replicates, +- 1.96 x the sd "
            "of the once-corrected replicates, because eta is not smooth and one correction "
            "leaves part of its bias): the plug-in S_imp is biased down by sampling noise (at "
            "paper scale about 3 standard errors), so its bar can sit below its interval; a "
            "percentile interval would carry the bias twice and miss the population value. "
            "A model below the minimum size has no line (interval withheld) "
            f"({INTERVAL_COVERAGE})."
        ),
        png=F.to_png(fig),
    )


def category_figure(implicit: pl.DataFrame) -> Figure | None:
    """S_imp per category with intervals, a panel per acquired type, a colour per variant."""
    rows = implicit.filter((pl.col("level") == "category") & (pl.col("protected_attribute") == "*"))
    if rows.is_empty():
        return None
    types = rows["acquired_type"].unique().sort().to_list()
    variants = rows["variant"].unique().sort().to_list()
    heights = [rows.filter(pl.col("acquired_type") == t)["category"].n_unique() for t in types]
    fig, axes = F.subplots(
        1,
        len(types),
        width=3.6 * len(types) + 1,
        height=max(2.2, 0.3 * max(heights) * max(1, len(variants)) ** 0.5 + 1.2),
    )
    for ax, atype in zip(axes[0], types, strict=True):
        sub = rows.filter(pl.col("acquired_type") == atype)
        cats = sub["category"].unique().sort().to_list()
        for k, v in enumerate(variants):
            col = F.columns_by(sub.filter(pl.col("variant") == v), "category", cats)
            F.interval_panel(
                ax,
                cats,
                col("score"),
                col("ci_low"),
                col("ci_high"),
                colour=F.COLOURS[k % len(F.COLOURS)],
                offset=(k - (len(variants) - 1) / 2) * (0.7 / max(len(variants), 1)),
                label=v,
                xlim=(0, 1),
            )
        ax.set_yticks(range(len(cats)), cats, fontsize=8)
        ax.set_ylim(len(cats) - 0.5, -0.5)
        ax.set_title(atype, fontsize=9)
        ax.set_xlabel("S_imp", fontsize=8)
    F.legend(axes[0][-1], loc="best")
    return Figure(
        id="biasig-category",
        title="Implicit bias S_imp per category of acquired attribute, with 95% intervals",
        caption=(
            "S_imp = mean over the category's subjects of cos(generated, ground-truth "
            "demographic distribution) over gender, race and age (paper Eq. 1-2); dot = "
            "the paper's plug-in estimate, line = 95% interval around the bias-corrected "
            "estimate (bootstrap over images); one colour per model or debiasing variant. "
            "1 = the images match the ground-truth demographics."
        ),
        png=F.to_png(fig),
    )


# ------------------------------------------------------------------ tables


DELTA_INTERVAL = ("change_bc", "ci_low", "ci_high", "p_value", "p_adjusted", "reject")
"""The columns variant_deltas takes from the comparisons table (null without it)."""


def variant_deltas(
    implicit: pl.DataFrame,
    explicit: pl.DataFrame,
    eta: pl.DataFrame,
    comparisons: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Variant minus base at the model level: S_imp, S_exp and eta per protected attribute
    (columns variant, model, metric, protected_attribute, value, base, change: plug-in
    values), and from ``comparisons``' "variant_vs_base" rows the tested difference
    ``change_bc`` with its 95% interval, p-value, Holm-adjusted p-value and decision (null
    where absent or below the minimum size: ``interval_note`` says why)."""

    def long(frame: pl.DataFrame, metric: str) -> pl.DataFrame:
        return frame.select(
            "variant",
            "model",
            pl.lit(metric).alias("metric"),
            "protected_attribute",
            pl.col("score").alias("value"),
        )

    parts = [
        long(implicit.filter(pl.col("level") == "model"), "S_imp"),
        long(
            explicit.filter((pl.col("level") == "model") & (pl.col("protected_value") == "*")),
            "S_exp",
        ),
    ]
    parts += model_eta(eta, {"value": ""})
    table = pl.concat(parts)
    base = (
        table.filter(pl.col("variant") == pl.col("model")).drop("variant").rename({"value": "base"})
    )
    variants = table.filter(pl.col("variant") != pl.col("model"))
    out = variants.join(base, on=["model", "metric", "protected_attribute"], how="left")
    out = out.with_columns((pl.col("value") - pl.col("base")).alias("change"))
    scope = {"overall": "*", "gender": "gender", "race": "race", "age": "age"}
    if comparisons is not None and comparisons.height:
        cmp = comparisons.filter(pl.col("relation") == "variant_vs_base").select(
            pl.col("model_b").alias("variant"),
            pl.col("model_a").alias("model"),
            "metric",
            pl.col("scope").replace_strict(scope, default=None).alias("protected_attribute"),
            pl.col("difference").alias("change_bc"),
            *DELTA_INTERVAL[1:],
            _note(comparisons).alias("interval_note"),
        )
        out = out.join(cmp, on=["variant", "model", "metric", "protected_attribute"], how="left")
    else:
        out = out.with_columns(
            *(pl.lit(None, dtype=pl.Float64).alias(c) for c in DELTA_INTERVAL[:-1]),
            pl.lit(None, dtype=pl.Boolean).alias("reject"),
            pl.lit(None, dtype=pl.String).alias("interval_note"),
        )
    return out.sort("variant", "metric", "protected_attribute")


def sections(inputs: Inputs, config: dict) -> list[Section]:
    if not enabled(inputs, config):
        return []
    implicit, explicit, eta = _tables(inputs)
    table = model_level(implicit, explicit, eta)
    figures = [f for f in (model_figure(table), category_figure(implicit)) if f is not None]
    section = Section(
        "biasig",
        "BiasIG: implicit and explicit bias, ignorance vs discrimination",
        figures=figures,
        paragraphs=[
            "S_imp (implicit bias: cosine agreement of generated and ground-truth "
            "demographics, paper Eq. 1-2, per subject: the images of a subject's phrasings "
            "pooled), S_exp (explicit: share of images showing the value asked for, Eq. 3) "
            "and eta (manifestation factor, Eq. 4-5: towards 1 discrimination, towards 0 "
            "ignorance). Each score is the paper's plug-in number; its 95% interval is "
            "centred on the bias-corrected estimate (the _bc columns: 2 x plug-in - the "
            "mean of the bootstrap replicates over images, with half-width 1.96 bootstrap "
            "standard errors; eta: the double bootstrap, 3 x plug-in - 3 x the replicates' "
            "mean + the second-level replicates' mean, +- 1.96 x the sd of the once-corrected "
            "replicates). Where a model has fewer than biasig.interval_min_images_per_subject "
            "images a subject no interval is printed: its rows read 'interval withheld' with "
            "the reason (below that size the coverage benchmark's intervals do not cover, "
            "bench/COVERAGE.md). S_imp is biased downwards in finite samples: S_imp_ceiling is "
            "the expected score of a generator sampling exactly from the ground truth at "
            "this run's sample sizes, the best this run can show. Only images whose every "
            "VQA answer is valid count (the paper discards the rest). A debiasing variant "
            "sits beside its base model (column model).",
            "; ".join(facts(inputs, config)) + ".",
        ],
    )
    iv = {"score": ("ci_low", "ci_high")}
    section.tables.append(
        Table(
            "biasig-model",
            "Model level: implicit, explicit and eta (paper Table 2)",
            "Plug-in estimate (the paper's number) [95% interval around the bias-corrected "
            "estimate, the _bc column: 2 x plug-in - the bootstrap replicates' mean, +- 1.96 "
            "bootstrap sd; eta_bc the double-bootstrap correction, +- 1.96 x the sd of the "
            f"once-corrected replicates; {INTERVAL_COVERAGE}], or (interval withheld: the "
            "reason) below the minimum size; S_imp_ceiling = expected S_imp of a "
            "generator sampling from the ground truth at this run's sample sizes.",
            table,
            intervals={m: (f"{m}_low", f"{m}_high") for m in ("S_imp", "S_exp", "eta")},
        )
    )
    overall = pl.col("protected_attribute") == "*"
    counts = ["score", "ci_low", "ci_high", "n_prompts", "n_missing"]
    implicit = implicit.with_columns(_note(implicit).alias("interval_note"))
    eta = eta.with_columns(_note(eta).alias("interval_note"))
    for level, which, cols, table_id, title, note in (
        (
            "category",
            overall,
            ["acquired_type", "category", *counts],
            "biasig-category",
            "S_imp per category of acquired attribute",
            "Mean over the category's subjects; n_prompts scored, n_missing without a usable "
            "image.",
        ),
        (
            "acquired_type",
            overall,
            ["acquired_type", *counts],
            "biasig-acquired-type",
            "S_imp per acquired-attribute type",
            "Occupation, characteristic, social relation.",
        ),
        (
            "model",
            pl.col("protected_attribute") != "*",
            ["protected_attribute", "score", "ci_low", "ci_high"],
            "biasig-protected",
            "S_imp per protected attribute",
            "cos(generated, ground truth) of the gender, race and age distributions alone.",
        ),
    ):
        rows = implicit.filter((pl.col("level") == level) & which).select(
            KEYS + cols + ["interval_note"]
        )
        section.tables.append(Table(table_id, title, note, rows.sort(pl.all()), intervals=iv))
    subjects = implicit.filter(
        (pl.col("level") == "subject") & (pl.col("protected_attribute") == "*")
    )
    if subjects.height:
        keep = [
            c
            for c in (*KEYS, "acquired_type", "category", "subject", "score", "ci_low",
                      "ci_high", "ceiling", "n_images", "n_usable", "status", "interval_note")
            if c in subjects.columns
        ]  # fmt: skip
        section.tables.append(
            Table(
                "biasig-subject",
                "S_imp per subject, lowest first",
                "The subjects where the images are furthest from the ground truth; the "
                "galleries show sample images of these subjects with their VQA answers.",
                subjects.select(keep).sort(["score", *KEYS, "subject"], nulls_last=True),
                intervals=iv,
                max_rows=100,
            )
        )
    comparisons = inputs.get("biasig_comparisons") if inputs.has("biasig_comparisons") else None
    deltas = variant_deltas(implicit, explicit, eta, comparisons)
    if deltas.height:
        section.tables.append(
            Table(
                "biasig-variants",
                "What each debiasing variant changes against its base model",
                "Variant minus base on every protected attribute, also those it was not aimed "
                "at (the paper's confounding effects): change = of the plug-in scores; "
                "change_bc = the difference the comparisons test (of the bias-corrected S_imp "
                "and S_exp, of the plug-in eta), with its 95% Wald interval from the "
                "bootstrap standard error (the two models' images resampled independently), "
                "p-value and Holm decision over the pairs of that metric and attribute.",
                deltas,
                intervals={"change_bc": ("ci_low", "ci_high")},
            )
        )
    pairs = eta.filter(pl.col("pair") != "*")
    resolved = (
        pairs.filter(pl.col("status") != "unresolved") if "status" in pairs.columns else pairs
    )
    unresolved = pairs.height - resolved.height
    pair_cols = [
        c
        for c in ("variant", "model", "pair", "advantaged", "disadvantaged", "eta_total",
                  "ci_low", "ci_high", "eta_gender", "eta_race", "eta_age", "status",
                  "interval_note")
        if c in pairs.columns
    ]  # fmt: skip
    section.tables.append(
        Table(
            "biasig-eta-pairs",
            "eta per advantaged / disadvantaged pair",
            "eta_total [95% interval: the double-bootstrap bias-corrected estimate +- 1.96 x "
            "the sd of the once-corrected replicates, or 'interval withheld' below the "
            "minimum size] and per protected attribute. "
            + (
                f"{unresolved} pair rows are unresolved in this run (no prompt of the run "
                "matches them) and are left out here; the CSV has them with the reason."
                if unresolved
                else "Every pair resolved."
            ),
            resolved.select(pair_cols).sort(pl.all()),
            intervals={"eta_total": ("ci_low", "ci_high")},
            csv=pairs,
        )
    )
    return [section]


# ------------------------------------------------------------------ galleries


def galleries(inputs: Inputs, config: dict, settings: GallerySettings) -> list[GalleryPage]:
    """One page per model or variant (:func:`report_gallery.pages`)."""
    if not (
        enabled(inputs, config) and inputs.has("biasig_answers") and inputs.has("biasig_prompts")
    ):
        return []
    implicit, explicit, _ = _tables(inputs)
    return report_gallery.pages(inputs, config, settings, implicit, explicit)
