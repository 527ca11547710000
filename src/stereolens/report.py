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
    from stereolens.registry import load_registry

    registry = load_registry(config["registry"])
    cb = config.get("contextbias", {})
    rows = []
    for role, names in (
        ("generator", cb.get("generators", [])),
        ("extractor", cb.get("extractors", [])),
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


def render_report(
    config: dict, prompts_path: str, images_path: str, bi_path: str, out_path: str
) -> None:
    prompts = pl.read_parquet(prompts_path)
    images = pl.read_parquet(images_path)
    bi = pl.read_parquet(bi_path)
    keys = _series_key(bi)
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
    status = (
        images.group_by(
            ["extractor", "model", "status"]
            if "extractor" in images.columns
            else ["model", "status"]
        )
        .len()
        .sort(pl.all())
    )
    parts.append(
        _table(
            status,
            "Extraction status per model (an image is discarded after "
            "the configured number of invalid answers).",
        )
    )
    if images.filter(pl.col("status") != "ok").height:
        reasons = (
            images.filter(pl.col("status") != "ok")
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

    k_def = bi["k_definition"][0] if bi.height else "n/a"
    parts.append("<h3>Bias Intensity by cohort and condition</h3>")
    parts.append(
        f"<p>BI = 1 - H(p)/log K (paper Eq. 1) over label counts pooled across "
        f"roles; K definition: <b>{html.escape(k_def)}</b>. Cohort values are the "
        f"mean of the cohort's dimensions; '*' = all dimensions.</p>"
    )
    if bi.height:
        parts.append(bi_condition_figure(bi))
        pooled = bi.filter(pl.col("aggregation") == "pooled")
        cohort_rows = pooled.filter(pl.col("dimension") == "*")
        wide = cohort_rows.pivot(on="condition", index=keys + ["cohort"], values="bi")
        wide = wide.select(keys + ["cohort"] + [c for c in CONDITION_ORDER if c in wide.columns])
        if {"CF", "CA-U"} <= set(wide.columns):
            wide = wide.with_columns((pl.col("CA-U") - pl.col("CF")).alias("CA-U - CF"))
        parts.append(
            _table(
                wide.sort(keys + ["cohort"]), "Pooled BI per cohort and condition (paper Fig. 3)."
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
                dims.sort(keys + ["cohort", "dimension"]),
                "Pooled BI per dimension and condition (paper Fig. 4).",
            )
        )
    else:
        parts.append("<p>No attributes were extracted: no BI to show.</p>")

    parts.append("<h2>Models</h2>")
    parts.append(_models_table(config))
    parts.append("<h2>Run settings</h2>")
    parts.append(
        f"<pre>{html.escape(json.dumps(config, indent=2, sort_keys=True, default=str))}"
        "</pre></body></html>"
    )
    write_text(out_path, "\n".join(parts))
