"""The final HTML report: one self-contained file (figures inlined), opens from disk."""

from __future__ import annotations

import base64
import html
import io
import json
from datetime import datetime, timezone

import polars as pl

from stereolens import __version__
from stereolens.atomic import write_text

CONDITION_ORDER = ["CF", "CA-R", "CA-U"]

CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
.warning{border:2px solid #c00;background:#fee;padding:1em;font-weight:bold}
caption{caption-side:top;text-align:left;font-style:italic;padding:.3em 0}
pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:.85em}
img{max-width:100%;height:auto}
"""


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


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode()
    return f'<img alt="figure" src="data:image/png;base64,{data}">'


def _series_key(frame: pl.DataFrame) -> list[str]:
    return (["extractor"] if "extractor" in frame.columns else []) + ["model"]


def bi_condition_figure(bi: pl.DataFrame) -> str:
    """BI by condition, one panel per cohort (and all dimensions), one line per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = bi.filter((pl.col("dimension") == "*") & (pl.col("aggregation") == "pooled"))
    cohorts = [c for c in rows["cohort"].unique().sort().to_list() if c != "*"] + ["*"]
    fig, axes = plt.subplots(
        1, len(cohorts), figsize=(3.2 * len(cohorts), 3), sharey=True, squeeze=False
    )
    keys = _series_key(rows)
    for ax, cohort in zip(axes[0], cohorts, strict=True):
        sub = rows.filter(pl.col("cohort") == cohort)
        for key, g in sub.group_by(keys, maintain_order=True):
            g = g.with_columns(
                pl.col("condition")
                .replace_strict({c: i for i, c in enumerate(CONDITION_ORDER)}, default=None)
                .alias("x")
            ).sort("x")
            ax.plot(g["x"].to_list(), g["bi"].to_list(), marker="o", label=" / ".join(key))
        ax.set_xticks(range(len(CONDITION_ORDER)), CONDITION_ORDER)
        ax.set_title("all dimensions" if cohort == "*" else cohort)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("Bias Intensity (pooled)")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle("Mean pooled BI by condition (paper Fig. 3)", y=1.04)
    out = _png(fig)
    plt.close(fig)
    return out


def _models_table(config: dict) -> str:
    """The registry settings of every model the run used (what determines its outputs)."""
    from stereolens.models.registry import load_registry

    registry = load_registry(config["registry"])
    cb = config.get("contextbias", {})
    bg = config.get("biasig", {})
    rows = []
    for role, names in (
        ("generator", cb.get("generators", [])),
        ("extractor", cb.get("extractors", [])),
        ("biasig generator", bg.get("generators", []) if bg.get("enabled") else []),
        ("biasig vqa", [bg["vqa"]] if bg.get("enabled") and bg.get("vqa") else []),
    ):
        for name in names:
            fp = registry[name].fingerprint()
            settings = {
                k: v for k, v in fp.items() if k not in ("name", "backend", "model", "revision")
            }
            rows.append(
                {
                    "role": role,
                    "name": name,
                    "backend": fp["backend"],
                    "model": fp["model"],
                    "revision": fp["revision"] or "default branch",
                    "settings": json.dumps(settings, sort_keys=True, default=str),
                }
            )
    return _table(pl.DataFrame(rows), "Models of this run and their registry settings.")


def _read(inputs: dict, name: str) -> pl.DataFrame | None:
    path = inputs.get(name)
    return pl.read_parquet(path) if path else None


def _bi_sections(bi: pl.DataFrame) -> list[str]:
    keys = _series_key(bi)
    k_def = bi["k_definition"][0] if bi.height else "n/a"
    parts = [
        "<h3>Bias Intensity by cohort and condition</h3>",
        f"<p>BI = 1 - H(p)/log K (paper Eq. 1) over label counts pooled across roles; K "
        f"definition: <b>{html.escape(k_def)}</b>. Cohort values are the mean of the cohort's "
        "dimensions; cohort '*' (overall) = the mean of the cohort values, each cohort "
        "weighing the same (paper Tables 8 and 10), unless the run chose the mean of all "
        "dimensions (column overall_definition); model '*' = the mean over models.</p>",
    ]
    if not bi.height:
        return parts + ["<p>No attributes were extracted: no BI to show.</p>"]
    pooled = bi.filter(pl.col("aggregation") == "pooled")
    parts.append(bi_condition_figure(bi))
    wide = pooled.filter(pl.col("dimension") == "*").pivot(
        on="condition", index=keys + ["cohort"], values="bi"
    )
    wide = wide.select(keys + ["cohort"] + [c for c in CONDITION_ORDER if c in wide.columns])
    if {"CF", "CA-U"} <= set(wide.columns):
        wide = wide.with_columns((pl.col("CA-U") - pl.col("CF")).alias("CA-U - CF"))
    parts.append(
        _table(wide.sort(keys + ["cohort"]), "Pooled BI per cohort and condition (paper Fig. 3).")
    )
    agg = bi.filter((pl.col("dimension") == "*") & (pl.col("model") == "*")).pivot(
        on="condition", index=keys[:-1] + ["aggregation", "cohort"], values="bi"
    )
    agg = agg.select(
        keys[:-1] + ["aggregation", "cohort"] + [c for c in CONDITION_ORDER if c in agg.columns]
    )
    parts.append(
        _table(
            agg.sort(pl.all()),
            "BI pooled over roles vs averaged per role (plain, at matched support, "
            "Miller-Madow), mean over models (paper Table 10, App. E.2).",
        )
    )
    dims = pooled.filter(pl.col("dimension") != "*").pivot(
        on="condition", index=keys + ["cohort", "dimension"], values="bi"
    )
    dims = dims.select(
        keys + ["cohort", "dimension"] + [c for c in CONDITION_ORDER if c in dims.columns]
    )
    parts.append(
        _table(
            dims.filter(pl.col("model") == "*").sort(keys + ["cohort", "dimension"]),
            "Pooled BI per dimension and condition, mean over models (paper Fig. 4).",
        )
    )
    return parts


def _bootstrap_sections(boot: pl.DataFrame) -> list[str]:
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
        "<h3>Role-level cluster bootstrap of BI differences</h3>",
        _table(
            overall.select(cols).sort(pl.all()),
            f"BI differences across generators with 95% percentile CIs, {reps} replicates "
            "resampling roles (paper Table 8).",
        ),
        _table(per_model.select(cols).sort(pl.all()), "CA-U - CF per generator (paper Table 9)."),
        _table(
            camera.select(cols).sort(pl.all()),
            "Camera cohort per dimension: opposing shifts hidden by the cohort mean "
            "(paper App. E.1).",
        ),
    ]


def _ccs_sections(ccs_mean: pl.DataFrame, robustness: pl.DataFrame) -> list[str]:
    top = ccs_mean.filter(pl.col("ccs_mean").is_not_null()).sort(
        ["ccs_mean", "role", "dimension", "label"], descending=[True, False, False, False]
    )
    return [
        "<h3>Context Consistency Score</h3>",
        _table(
            top.head(25),
            "Labels with the highest cross-generator mean CCS = Prev% / (1 + range pp); "
            "n_invariant = generators where the label is context-invariant (p > 0.05 and "
            "range <= 5 pp) (paper Tables 2 and 11).",
        ),
        "<h3>Prompt robustness</h3>",
        _table(
            robustness.sort(pl.all()),
            _robustness_caption(robustness),
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


def _validation_sections(scores: pl.DataFrame) -> list[str]:
    keep = [
        c
        for c in (
            "extractor",
            "model",
            "kind",
            "dimension",
            "n_images",
            "accuracy",
            "recall",
            "precision",
            "f1",
            "f1_paper",
        )
        if c in scores.columns
    ]
    stated = scores.filter(pl.col("kind") == "stated") if "kind" in scores.columns else scores
    return [
        "<h3>Extraction validation</h3>",
        _table(
            stated.filter(pl.col("dimension") == "*").select(keep).sort(pl.all()),
            "Accuracy, recall and F1 on the 220 explicit-attribute prompts per model "
            "(paper Table 1; f1_paper = 2 acc / (1 + acc), the paper's identity).",
        ),
        _table(
            stated.filter(pl.col("dimension") != "*").select(keep).sort(pl.all()),
            "Per dimension (paper Table 7).",
        ),
    ]


def _canonical_section(mapping: pl.DataFrame) -> list[str]:
    if not mapping.height:
        return [
            "<h3>Canonicalisation</h3><p>Canonicalisation is off or found no "
            "open-vocabulary labels.</p>"
        ]
    summary = (
        mapping.group_by("dimension", "decided_by")
        .agg(
            pl.len().alias("raw_labels"),
            pl.col("cluster_id").n_unique().alias("clusters"),
            pl.col("core_label").n_unique().alias("core_labels"),
        )
        .sort(pl.all())
    )
    return [
        "<h3>Canonicalisation of open-vocabulary labels</h3>",
        _table(
            summary,
            "Raw labels, embedding clusters and final core labels per "
            "dimension and deciding step (review and override with "
            "results/contextbias/canonical_mapping.csv).",
        ),
    ]


def _finite(v) -> bool:
    return v is not None and v == v and abs(v) != float("inf")


def _biasig_figure(model_rows: pl.DataFrame) -> str:
    """Bars of S_imp, S_exp and eta per model and variant with their 95% intervals drawn as
    lines from ci_low to ci_high: an interval may lie wholly above or below its point
    estimate (S_imp and TVD-like scores are biased in finite samples), which an error bar
    cannot show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ["S_imp", "S_exp", "eta"]
    labels = model_rows["variant"].to_list()
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(labels) + 2), 3))
    width = 0.8 / len(metrics)
    for i, m in enumerate(metrics):
        vals = model_rows[m].to_list()
        xs = [j + (i - 1) * width for j in range(len(labels))]
        ax.bar(xs, [v if _finite(v) else 0 for v in vals], width, label=m)
        for x, lo, hi in zip(
            xs, model_rows[f"{m}_low"].to_list(), model_rows[f"{m}_high"].to_list(), strict=True
        ):
            if _finite(lo) and _finite(hi):
                ax.vlines(x, lo, hi, color="black", lw=1)
                ax.hlines([lo, hi], x - width / 4, x + width / 4, color="black", lw=1)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title("BiasIG model level with 95% bootstrap CIs")
    out = _png(fig)
    plt.close(fig)
    return out


def _variant_deltas(
    implicit: pl.DataFrame, explicit: pl.DataFrame, eta: pl.DataFrame
) -> pl.DataFrame:
    """Variant minus base at the model level: S_imp and S_exp per protected attribute,
    eta per attribute."""

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
    model_eta = eta.filter(pl.col("pair") == "*")
    for attr, col in (
        ("*", "eta_total"),
        ("gender", "eta_gender"),
        ("race", "eta_race"),
        ("age", "eta_age"),
    ):
        parts.append(
            model_eta.select(
                "variant",
                "model",
                pl.lit("eta").alias("metric"),
                pl.lit(attr).alias("protected_attribute"),
                pl.col(col).alias("value"),
            )
        )
    table = pl.concat(parts)
    base = (
        table.filter(pl.col("variant") == pl.col("model")).drop("variant").rename({"value": "base"})
    )
    variants = table.filter(pl.col("variant") != pl.col("model"))
    out = variants.join(base, on=["model", "metric", "protected_attribute"], how="left")
    return out.with_columns((pl.col("value") - pl.col("base")).alias("change")).sort(
        "variant", "metric", "protected_attribute"
    )


def _biasig_sections(
    implicit: pl.DataFrame, explicit: pl.DataFrame, eta: pl.DataFrame
) -> list[str]:
    key = ["variant", "model"]

    def model_level(frame, name, extra=()):
        rows = frame.filter(pl.col("level") == "model")
        for col, val in extra:
            rows = rows.filter(pl.col(col) == val)
        return rows.select(
            key
            + [
                pl.col("score").alias(name),
                pl.col("ci_low").alias(f"{name}_low"),
                pl.col("ci_high").alias(f"{name}_high"),
            ]
        )

    imp = model_level(implicit, "S_imp", [("protected_attribute", "*")])
    if "ceiling" in implicit.columns:
        ceiling = implicit.filter(
            (pl.col("level") == "model") & (pl.col("protected_attribute") == "*")
        ).select(key + [pl.col("ceiling").alias("S_imp_ceiling")])
        imp = imp.join(ceiling, on=key, how="left")
    exp = model_level(explicit, "S_exp", [("protected_attribute", "*"), ("protected_value", "*")])
    et = eta.filter(pl.col("pair") == "*").select(
        key
        + [
            pl.col("eta_total").alias("eta"),
            pl.col("ci_low").alias("eta_low"),
            pl.col("ci_high").alias("eta_high"),
        ]
    )
    table = (
        imp.join(exp, on=key, how="full", coalesce=True)
        .join(et, on=key, how="full", coalesce=True)
        .sort(key)
    )
    parts = [
        "<h2>BiasIG</h2>",
        "<p>S_imp (implicit bias: cosine agreement of generated and ground-truth "
        "demographics, paper Eq. 1-2, per subject: the images of a subject's 20 phrasings "
        "pooled), S_exp (explicit: share of images showing the value asked for, Eq. 3) and "
        "eta (manifestation factor, Eq. 4-5: towards 1 discrimination, towards 0 "
        "ignorance), with bootstrap CIs over images. S_imp is biased downwards in finite "
        "samples: S_imp_ceiling is the expected score of a generator sampling exactly from "
        "the ground truth at this run's sample sizes, the best this run can show. Only "
        "images whose every VQA answer is valid count (the paper discards the rest). A "
        "debiasing variant sits beside its base model (column model).</p>",
    ]
    if table.height:
        parts.append(_biasig_figure(table))
    parts.append(_table(table, "Model level: implicit, explicit and eta (paper Table 2)."))
    cats = implicit.filter(
        (pl.col("level") == "category") & (pl.col("protected_attribute") == "*")
    ).select(
        key + ["acquired_type", "category", "score", "ci_low", "ci_high", "n_prompts", "n_missing"]
    )
    parts.append(_table(cats.sort(pl.all()), "S_imp per category of acquired attribute."))
    acquired = implicit.filter(
        (pl.col("level") == "acquired_type") & (pl.col("protected_attribute") == "*")
    ).select(key + ["acquired_type", "score", "ci_low", "ci_high", "n_prompts", "n_missing"])
    parts.append(
        _table(
            acquired.sort(pl.all()),
            "S_imp per acquired-attribute type (occupation, characteristic, social relation).",
        )
    )
    per_attr = implicit.filter(
        (pl.col("level") == "model") & (pl.col("protected_attribute") != "*")
    ).select(key + ["protected_attribute", "score", "ci_low", "ci_high"])
    parts.append(_table(per_attr.sort(pl.all()), "S_imp per protected attribute."))
    deltas = _variant_deltas(implicit, explicit, eta)
    if deltas.height:
        parts.append(
            _table(
                deltas,
                "What each debiasing variant changes against its base model "
                "(variant minus base), on every protected attribute, also those "
                "it was not aimed at (the paper's confounding effects).",
            )
        )
    pairs = eta.filter(pl.col("pair") != "*")
    pair_cols = [
        c
        for c in (
            "variant",
            "model",
            "pair",
            "advantaged",
            "disadvantaged",
            "eta_total",
            "eta_gender",
            "eta_race",
            "eta_age",
            "ci_low",
            "ci_high",
            "status",
        )
        if c in pairs.columns
    ]
    parts.append(
        _table(
            pairs.select(pair_cols).sort(pl.all()),
            "eta per advantaged / disadvantaged pair (unresolved pairs are reported, not scored).",
        )
    )
    return parts


def _throughput_section(config: dict, inputs: dict) -> list[str]:
    """Measured throughput (stereolens.throughput) of the run whose results folder holds
    inputs["prompts"]: the jobs' timing files, logs and Snakemake benchmark files found
    there and beside it, and the planner's table config/throughput.yaml of the same run."""
    from pathlib import Path

    from stereolens.plan import DEFAULT_THROUGHPUT, load_throughput
    from stereolens.throughput import CAPTION, measured_throughput
    from stereolens.validation import ConfigError

    results = Path(inputs["prompts"]).parents[1]
    if results.name != "results":
        return []
    parts = ["<h2>Measured throughput</h2>"]
    table, table_path = None, results.parent / DEFAULT_THROUGHPUT
    if table_path.exists():
        try:
            table = load_throughput(table_path)
        except ConfigError as exc:
            parts.append(f"<p>No planned figures: {html.escape(str(exc))}</p>")
    summary = measured_throughput(results, config=config, throughput_table=table)
    if summary.is_empty():
        parts.append("<p>No job timing records were found under the results folder.</p>")
        return parts
    parts.append(_table(summary, CAPTION))
    return parts


def render_report(config: dict, inputs: dict, out_path: str) -> None:
    """Write the report from the tables named in ``inputs`` (name -> path): prompts, images,
    bi are required; mapping, ccs_mean, robustness, bootstrap, validation, annotation_form,
    agreement are shown when present."""
    from stereolens.design.report_sections import audit_sections

    prompts = pl.read_parquet(inputs["prompts"])
    images = pl.read_parquet(inputs["images"])
    bi = pl.read_parquet(inputs["bi"])
    cb = config.get("contextbias", {})
    metrics = cb.get("metrics", {})
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>stereolens report"
        f"</title><style>{CSS}</style></head><body>",
        f"<h1>stereolens report: {html.escape(str(config.get('run_label', '')))}</h1>",
        f"<p>stereolens {__version__}, written "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.</p>",
    ]
    if config.get("embedded_default"):
        parts.append(
            "<p class='warning'>This is the embedded default: the images come from tiny "
            "random-weight generators and the attributes from a tiny random-weight VLM. "
            "Every number below is meaningless; it only shows that the pipeline runs end to "
            "end. Point the config at real models for a real audit.</p>"
        )
    parts.append("<h2>ContextBias</h2>")
    parts.append(
        "<p>Settings: K definition <b>{k}</b>; CCS defined for labels seen in all three "
        "conditions and at least 5 times; context-invariant when p &gt; 0.05 and range "
        "&lt;= 5 pp; bootstrap {b} replicates, seed {seed}; matched-support draws {d}.</p>".format(
            k=html.escape(str(metrics.get("k_definition", "model"))),
            b=metrics.get("replicates", 1000),
            seed=metrics.get("seed", 0),
            d=metrics.get("matched_draws", 20),
        )
    )
    by = ["extractor", "model", "status"] if "extractor" in images.columns else ["model", "status"]
    parts.append(
        _table(
            images.group_by(by).len().sort(pl.all()),
            "Extraction status per model (an image is discarded after the "
            "configured number of invalid answers).",
        )
    )
    failed = images.filter(pl.col("status") != "ok")
    if failed.height:
        reasons = (
            failed.with_columns(pl.col("reason").str.replace_all(r"\d+", "N"))
            .group_by("reason")
            .len()
            .sort("len", descending=True)
            .head(10)
        )
        parts.append(_table(reasons, "Most common discard reasons."))
    parts.append(
        f"<p>{prompts.height} prompts, {prompts['role'].n_unique()} roles, "
        f"{images.height} images in the images table.</p>"
    )
    parts += _bi_sections(bi)
    ccs_mean, robustness = _read(inputs, "ccs_mean"), _read(inputs, "robustness")
    if ccs_mean is not None and robustness is not None:
        parts += _ccs_sections(ccs_mean, robustness)
    boot = _read(inputs, "bootstrap")
    if boot is not None:
        parts += _bootstrap_sections(boot)
    validation = _read(inputs, "validation")
    if validation is not None:
        parts += _validation_sections(validation)
    parts += audit_sections(inputs, "contextbias")  # per group (stereolens.design)
    mapping = _read(inputs, "mapping")
    if mapping is not None:
        parts += _canonical_section(mapping)
    if inputs.get("annotation_form"):
        parts.append(
            "<h3>Human agreement study</h3><p>A blinded annotation form is in "
            "results/contextbias/annotation/form.html (answers save to CSV; list "
            "them under contextbias.annotation.answers).</p>"
        )
    agreement = _read(inputs, "agreement")
    if agreement is not None:
        parts.append(
            _table(
                agreement,
                "Raw agreement, Fleiss' kappa with bootstrap CI, "
                "and human consensus vs pipeline (paper Sec. 4.3).",
            )
        )
    if inputs.get("biasig_eta"):
        parts += _biasig_sections(
            _read(inputs, "biasig_implicit"),
            _read(inputs, "biasig_explicit"),
            _read(inputs, "biasig_eta"),
        )
    if inputs.get("lvlm_scores"):
        from stereolens.lvlm.report import lvlm_sections

        parts += lvlm_sections(
            config,
            _read(inputs, "lvlm_scores"),
            _read(inputs, "lvlm_refusals"),
            _read(inputs, "lvlm_story_skew"),
            _read(inputs, "lvlm_sets"),
            _read(inputs, "lvlm_exam_accuracy"),
        )
        parts += audit_sections(inputs, "lvlm")  # story reading per group (stereolens.design)
    parts += _throughput_section(config, inputs)
    parts.append("<h2>Models</h2>")
    parts.append(_models_table(config))
    parts.append("<h2>Run settings</h2>")
    parts.append(
        f"<pre>{html.escape(json.dumps(config, indent=2, sort_keys=True, default=str))}</pre>"
        "</body></html>"
    )
    write_text(out_path, "\n".join(parts))
