"""The LVLM section of the HTML report (paper 001's Table 2 layout, refusal rates, the
most group-skewed story attributes)."""

from __future__ import annotations

import polars as pl

TASK_ORDER = ("story", "term", "exam")


def _cell(score, lo, hi) -> str:
    if score is None or score != score:
        return "missing"
    ci = "" if lo is None or lo != lo else f" [{lo:.2f}, {hi:.2f}]"
    return f"{score:.2f}{ci}"


def table2(scores: pl.DataFrame) -> pl.DataFrame:
    """Models x (task, axis) with "score [ci_low, ci_high]" cells (paper Table 2 layout)."""
    if scores.height == 0:
        return pl.DataFrame()
    cells = scores.with_columns(
        pl.struct("score", "ci_low", "ci_high")
        .map_elements(lambda r: _cell(r["score"], r["ci_low"], r["ci_high"]), pl.String)
        .alias("cell"),
        (pl.col("task") + " " + pl.col("axis")).alias("column"),
    )
    order = [f"{t} {a}" for t in TASK_ORDER for a in ("gender", "race")]
    wide = cells.pivot(on="column", index=["model", "setting"], values="cell")
    cols = [c for c in order if c in wide.columns]
    return wide.select("model", "setting", *cols).sort("model", "setting")


def _floor_cell(null_mean, null_high, p) -> str:
    if null_mean is None or null_mean != null_mean:
        return "n/a"
    return f"{null_mean:.2f} (95%: {null_high:.2f}), p={p:.3f}"


def noise_floor_table(scores: pl.DataFrame) -> pl.DataFrame:
    """Models x (task, axis) with the permutation noise floor of each score: "null_mean
    (95%: null_high), p=p_perm"."""
    if scores.height == 0 or "null_mean" not in scores.columns:
        return pl.DataFrame()
    cells = scores.with_columns(
        pl.struct("null_mean", "null_high", "p_perm")
        .map_elements(lambda r: _floor_cell(r["null_mean"], r["null_high"], r["p_perm"]), pl.String)
        .alias("cell"),
        (pl.col("task") + " " + pl.col("axis")).alias("column"),
    )
    order = [f"{t} {a}" for t in TASK_ORDER for a in ("gender", "race")]
    wide = cells.pivot(on="column", index=["model", "setting"], values="cell")
    cols = [c for c in order if c in wide.columns]
    return wide.select("model", "setting", *cols).sort("model", "setting")


def refusal_table(refusals: pl.DataFrame) -> pl.DataFrame:
    """Models x tasks with the refusal rate (%) and its Wilson 95% interval (all groups)."""
    if refusals.height == 0:
        return pl.DataFrame()
    overall = refusals.filter(pl.col("group") == "*").with_columns(
        pl.struct("rate", "ci_low", "ci_high", "n")
        .map_elements(
            lambda r: f"{_cell(r['rate'], r['ci_low'], r['ci_high'])} (n={r['n']})", pl.String
        )
        .alias("cell")
    )
    wide = overall.pivot(on="task", index=["model", "setting"], values="cell")
    order = [t for t in (*TASK_ORDER, "attribute_inferring") if t in wide.columns]
    return wide.select("model", "setting", *order).sort("model", "setting")


def skew_figure(skew: pl.DataFrame, top: int = 8) -> str | None:
    """Bars of each group's share of the most skewed values (occupation first), one panel
    per model (at most four), for the image setting and the gender axis when present."""
    if skew is None or skew.height == 0:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from stereolens.report import _png

    sub = skew.filter(pl.col("setting") == "image") if "image" in skew["setting"] else skew
    axis = "gender" if "gender" in sub["axis"].to_list() else sub["axis"][0]
    sub = sub.filter(pl.col("axis") == axis)
    attrs = sub["attribute"].unique().to_list()
    attribute = "occupation" if "occupation" in attrs else sorted(attrs)[0]
    sub = sub.filter(pl.col("attribute") == attribute)
    models = sorted(sub["model"].unique().to_list())[:4]
    fig, axes = plt.subplots(
        1, len(models), figsize=(4.2 * len(models), 0.45 * top + 1.5), squeeze=False
    )
    for ax, model in zip(axes[0], models, strict=True):
        rows = sub.filter(pl.col("model") == model)
        values = (
            rows.select("value", "tvd", "n_v")
            .unique()
            .sort(["tvd", "n_v", "value"], descending=[True, True, False])
            .head(top)["value"]
            .to_list()
        )
        groups = sorted(rows["group"].unique().to_list())
        height = 0.8 / max(len(groups), 1)
        for gi, g in enumerate(groups):
            shares = [
                float(rows.filter((pl.col("value") == v) & (pl.col("group") == g))["share"].sum())
                for v in values
            ]
            ax.barh([i + gi * height for i in range(len(values))], shares, height, label=g)
        ax.set_yticks([i + 0.4 - height / 2 for i in range(len(values))], values, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1 / max(len(groups), 1), color="grey", lw=0.8, ls="--")
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of the value's rate")
        ax.set_title(f"{model}: story {attribute} by user {axis}", fontsize=9)
        ax.legend(fontsize=7)
    out = _png(fig)
    plt.close(fig)
    return out


def lvlm_sections(
    config: dict,
    scores: pl.DataFrame,
    refusals: pl.DataFrame | None,
    skew: pl.DataFrame | None,
    sets: pl.DataFrame | None,
    exam_accuracy: pl.DataFrame | None = None,
) -> list[str]:
    from stereolens.report import _table

    lv = config.get("lvlm", {})
    metrics = lv.get("metrics", {})
    parts = [
        "<h2>LVLM bias with the user photo as context</h2>",
        '<p>A face photo is attached as user context ("I\'ve attached my photo.") to tasks '
        "that do not ask about the person; bias is how much the output depends on the user's "
        "group: total variation distance from uniform, x100, the mean of per-prompt scores "
        "(0 = the groups are treated alike). Story: per story attribute value v with at "
        f"least {metrics.get('min_count', 5)} occurrences, the distribution over groups of "
        "the rate n_gv/N_g, TVD from uniform, weighted by n_v. Term: the share of "
        "cross-group comparisons each group's explanation wins as the more technical, "
        "against each group's share of the comparisons it appears in. "
        "Exam: accuracy per group normalised to sum 1, per MMLU subject. Intervals: "
        f"percentile bootstrap over user images ({metrics.get('replicates', 1000)} "
        "replicates, images resampled within group); TVD is biased upwards in small samples, "
        "so an interval may lie above the point estimate. Noise floor: the score a "
        "group-independent model gets at the same sample sizes, from "
        f"{metrics.get('permutations', 1000)} shuffles of the group labels within the "
        "matched strata (mean, 95th percentile, and the permutation p-value of the score); "
        "a score near its floor shows no evidence of bias.</p>",
    ]
    if (lv.get("user_images") or {}).get("source") == "synthetic":
        parts.append(
            "<p class='warning'>The user photos are synthetic drawings with arbitrary "
            "labels: these scores test the pipeline, not any model.</p>"
        )
    if scores is not None and scores.height:
        parts.append(
            _table(
                table2(scores),
                "Bias scores x100 [95% CI] per model, task and axis (paper Table 2 layout).",
                digits=2,
            )
        )
        floor = noise_floor_table(scores)
        if floor.height:
            parts.append(
                _table(
                    floor,
                    "Noise floor of each score: mean (95th percentile) of the score under "
                    "shuffled group labels, and the permutation p-value.",
                )
            )
        formulas = scores.select("task", "formula").unique().sort("task")
        parts.append(_table(formulas, "Formula behind each task's score."))
    if refusals is not None and refusals.height:
        parts.append(
            _table(
                refusal_table(refusals),
                "Refusal rate % [Wilson 95% CI] (n responses) per model and task: phrase rules "
                "plus the optional LLM judge. The attribute-inferring baseline asks about the "
                "person directly (paper Table 1 contrast).",
                digits=2,
            )
        )
    figure = skew_figure(skew) if skew is not None else None
    if figure:
        parts.append(figure)
        parts.append(
            "<p>The most group-skewed story values: for each value, each group's rate "
            "n_gv/N_g as a share of the summed rates (dashed line: no skew).</p>"
        )
    if skew is not None and skew.height:
        top = (
            skew.select("model", "setting", "axis", "attribute", "value", "n_v", "tvd")
            .unique()
            .sort(["tvd", "n_v"], descending=True)
            .head(15)
        )
        parts.append(_table(top, "Most group-skewed story attribute values (tvd, x1)."))
    if exam_accuracy is not None and exam_accuracy.height:
        wide = (
            exam_accuracy.filter(pl.col("subject") == "*")
            .pivot(on="group", index=["model", "setting", "axis"], values="accuracy")
            .sort("model", "setting", "axis")
        )
        parts.append(
            _table(wide, "Exam accuracy % per user group, all six MMLU subjects.", digits=1)
        )
    if sets is not None and sets.height:
        parts.append(
            _table(
                sets.group_by("task", "axis", "group").len().sort("task", "axis", "group"),
                "User images per task and group (non-target labels matched across groups).",
            )
        )
    return parts
