"""The LVLM part of the report (paper 001): headline TVD scores with their noise floor, the
section (figures first, then Table 2's layout and the other tables) and the response galleries."""

from __future__ import annotations

import polars as pl

from stereolens.lvlm.report_gallery import TASK_ORDER, galleries
from stereolens.report import figures as F
from stereolens.report import reader, reader_plan
from stereolens.report.audits import GAP_CAPTION, audit_section, min_clusters, minimum_text
from stereolens.report.html import NOTE_COLUMN, Figure, Section, Table, finite, withheld_text
from stereolens.report.inputs import Inputs
from stereolens.report.summary import profile_frame

__all__ = ["AXES", "KEY", "TASK_ORDER", "TITLE", "enabled", "facts", "galleries", "profile",
           "sections"]  # fmt: skip

KEY = "lvlm"
TITLE = "LVLM"
PROFILE_DIGITS = 1
"""Decimals of its first-screen cells (TVD x100)."""
HEADLINE = "lvlm_scores"
"""The table whose presence says the LVLM audit has results (stereolens report --results)."""
ALWAYS_WRITTEN = {
    "enabled": False,
    "tasks": {},
    "assistant": None,
    "story_reading": {"enabled": False},
}
"""The section with every optional part off: the plug-in's report tables of it are those
every run writes."""


NOT_SHOWN = {"user_images": {"source": None}}
"""What a report without the run's config assumes where :func:`infer_config` names nothing:
the tables do not say where the user photos came from (the first screen says "?")."""


def infer_config(inputs: Inputs) -> dict:
    """The section naming what the tables hold, for a report without the run's config."""
    scores = inputs.get("lvlm_scores")
    if scores is None:
        return {}
    return {"enabled": True, "models": sorted(scores["model"].unique().to_list())}


AXES = ("gender", "race")
MAIN_SETTING = "image"


def enabled(inputs: Inputs, config: dict) -> bool:
    return inputs.has("lvlm_scores")


def _cell(score, lo, hi, note=None) -> str:
    if not finite(score):
        return "missing"
    ci = f" [{lo:.2f}, {hi:.2f}]" if finite(lo) and finite(hi) else ""
    if not ci and withheld_text(note):
        ci = f" ({withheld_text(note)})"
    return f"{score:.2f}{ci}"


def _with_note(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame with an ``interval_note`` column (null in tables from older runs)."""
    if NOTE_COLUMN in frame.columns:
        return frame
    return frame.with_columns(pl.lit(None, pl.String).alias(NOTE_COLUMN))


def _wide(scores: pl.DataFrame, cell: pl.Expr) -> pl.DataFrame:
    cells = scores.with_columns(
        cell.alias("cell"), (pl.col("task") + " " + pl.col("axis")).alias("column")
    )
    order = [f"{t} {a}" for t in TASK_ORDER for a in AXES]
    wide = cells.pivot(on="column", index=["model", "setting"], values="cell")
    cols = [c for c in order if c in wide.columns]
    return wide.select("model", "setting", *cols).sort("model", "setting")


def table2(scores: pl.DataFrame) -> pl.DataFrame:
    """Models x (task, axis) with "score [ci_low, ci_high]" cells (paper Table 2 layout)."""
    if scores.height == 0:
        return pl.DataFrame()
    return _wide(
        _with_note(scores),
        pl.struct("score", "ci_low", "ci_high", NOTE_COLUMN).map_elements(
            lambda r: _cell(r["score"], r["ci_low"], r["ci_high"], r[NOTE_COLUMN]), pl.String
        ),
    )


def _floor_cell(null_mean, null_high, p) -> str:
    if not finite(null_mean):
        return "n/a"
    high = f"{null_high:.2f}" if finite(null_high) else "n/a"
    pval = f"{p:.3f}" if finite(p) else "n/a"
    return f"{null_mean:.2f} (95%: {high}), p={pval}"


def noise_floor_table(scores: pl.DataFrame) -> pl.DataFrame:
    """Models x (task, axis) with the permutation noise floor of each score: "null_mean
    (95%: null_high), p=p_perm"."""
    if scores.height == 0 or "null_mean" not in scores.columns:
        return pl.DataFrame()
    return _wide(
        scores,
        pl.struct("null_mean", "null_high", "p_perm").map_elements(
            lambda r: _floor_cell(r["null_mean"], r["null_high"], r["p_perm"]), pl.String
        ),
    )


def refusal_table(refusals: pl.DataFrame) -> pl.DataFrame:
    """Models x tasks with the refusal rate (%) and its Wilson 95% interval (all groups)."""
    overall = refusals.filter(pl.col("group") == "*").with_columns(
        pl.struct("rate", "ci_low", "ci_high", "n")
        .map_elements(
            lambda r: f"{_cell(r['rate'], r['ci_low'], r['ci_high'])} (n={r['n']})", pl.String
        )
        .alias("cell")
    )
    wide = overall.pivot(
        on="task", index=["model", "setting"], values="cell", aggregate_function="first"
    )
    order = [t for t in (*TASK_ORDER, "attribute_inferring") if t in wide.columns]
    return wide.select("model", "setting", *order).sort("model", "setting")


# ------------------------------------------------------------------ facts and profile


def facts(inputs: Inputs, config: dict) -> list[str]:
    """Lines for the first screen: the models, then the scale."""
    lv = config["lvlm"]
    lines = []
    if lv["models"]:
        lines.append(f"models {', '.join(lv['models'])}; assistant {lv['assistant'] or 'none'}")
    scale = []
    sets = inputs.get("lvlm_sets")
    if sets is not None and sets.height:
        source = lv["user_images"]["source"] or "?"
        scale.append(f"{sets['image_id'].n_unique():,} user photos ({source})")
    refusals = inputs.get("lvlm_refusals")
    if refusals is not None and refusals.height:
        n = int(refusals.filter(pl.col("group") == "*")["n"].sum())
        scale.append(f"{n:,} responses")
    if scale:
        lines.append("; ".join(scale))
    return lines


def profile(inputs: Inputs, config: dict) -> pl.DataFrame:
    """Per audited model: story, term and exam TVD x100 by axis in the image setting, with
    the bootstrap interval and the permutation noise floor."""
    scores = inputs.get("lvlm_scores")
    if scores is None or scores.is_empty():
        return profile_frame([])
    settings = scores["setting"].unique().to_list()
    setting = MAIN_SETTING if MAIN_SETTING in settings else sorted(settings)[0]
    rows = []
    for task in TASK_ORDER:
        for axis in AXES:
            sub = scores.filter(
                (pl.col("setting") == setting) & (pl.col("task") == task) & (pl.col("axis") == axis)
            )
            for r in sub.sort("model").iter_rows(named=True):
                rows.append(
                    {
                        "benchmark": KEY,
                        "benchmark_title": TITLE,
                        "model": r["model"],
                        "metric": f"{task}_{axis}",
                        "label": f"{task} {axis}",
                        "panel": f"{task} TVD x100",
                        "series": axis,
                        "estimate": r["score"],
                        "ci_low": r["ci_low"],
                        "ci_high": r["ci_high"],
                        "floor": r.get("null_mean"),
                        "floor_high": r.get("null_high"),
                        "floor_label": "null",
                        "p": r.get("p_perm"),
                        "n": r.get("n_units"),
                        "reading": "0 = groups treated alike",
                        "note": None if setting == MAIN_SETTING else f"setting {setting}",
                        "interval_note": r.get("interval_note"),
                    }
                )
    # models in the table order, tasks first: the profile view lists metrics as they come
    return profile_frame(rows)


# ------------------------------------------------------------------ figures


def scores_figure(scores: pl.DataFrame) -> Figure | None:
    """One panel per task; one row per model (x setting); gender and race as two series;
    the noise floor as a grey band."""
    if scores.is_empty():
        return None
    tasks = [t for t in TASK_ORDER if t in scores["task"].to_list()]
    rows_key = scores.select("model", "setting").unique().sort("model", "setting").rows()
    multi = len({s for _, s in rows_key}) > 1
    labels = [f"{m} ({s})" if multi else m for m, s in rows_key]
    fig, axes = F.subplots(
        1, len(tasks), width=3.8 * len(tasks) + 1, height=0.4 * len(labels) + 1.6
    )
    for ax, task in zip(axes[0], tasks, strict=True):
        sub = scores.filter(pl.col("task") == task)
        axes_present = [a for a in AXES if a in sub["axis"].to_list()]
        for k, axis in enumerate(axes_present):
            col = F.columns_by(
                sub.filter(pl.col("axis") == axis), ("model", "setting"), rows_key, lenient=True
            )
            F.interval_panel(
                ax, labels, col("score"), col("ci_low"), col("ci_high"),
                floor=col("null_mean"), floor_high=col("null_high"), colour=F.COLOURS[k],
                offset=(k - (len(axes_present) - 1) / 2) * 0.3, label=axis,
            )  # fmt: skip
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_title(f"{task}: TVD x100", fontsize=9)
        ax.set_xlim(left=0)
        F.legend(ax, loc="best")
    formulas = "; ".join(
        f"{t}: {f}" for t, f in scores.select("task", "formula").unique().sort("task").rows()
    ) if "formula" in scores.columns else ""  # fmt: skip
    return Figure(
        id="lvlm-scores",
        title="LVLM bias scores against their noise floor (paper Table 2)",
        caption=(
            "TVD x100 of the output's distribution over user groups from uniform, the mean "
            f"of per-prompt scores ({formulas}); dot = score (the plug-in, biased upwards: "
            "a group-independent model scores about its floor), line = 95% noise-floor "
            "bracket [score - floor mean, score] widened by the paired bootstrap's spread "
            "over user images (covers the population score, conservatively between the "
            "floor and a strong effect; bench/COVERAGE.md); grey band = the noise floor, "
            "from the mean to the 95th percentile of the score under shuffled group labels. "
            "A score inside its band shows no evidence of bias. A dot without a line: the "
            "interval is withheld, fewer user images per group than "
            "lvlm.metrics.interval_min_images_per_group (the table says how many)."
        ),
        png=F.to_png(fig),
    )


def refusal_figure(refusals: pl.DataFrame) -> Figure | None:
    """Refusal rate % per model (and setting) and task with Wilson 95% intervals."""
    rows = refusals.filter(pl.col("group") == "*")
    if rows.is_empty():
        return None
    keys = rows.select("model", "setting").unique().sort("model", "setting").rows()
    multi = len({s for _, s in keys}) > 1
    labels = [f"{m} ({s})" if multi else m for m, s in keys]
    tasks = [t for t in (*TASK_ORDER, "attribute_inferring") if t in rows["task"].to_list()]
    series = []
    for task in tasks:
        col = F.columns_by(rows.filter(pl.col("task") == task), ("model", "setting"), keys)
        series.append((task, col("rate"), col("ci_low"), col("ci_high")))
    fig, axes = F.subplots(
        1, 1, width=max(4.5, 0.9 * len(labels) * max(1, len(tasks)) ** 0.5 + 2), height=3
    )
    F.grouped_bars(axes[0][0], labels, series, ylim=(0, 100), ylabel="refusal rate %")
    F.legend(axes[0][0])
    return Figure(
        id="lvlm-refusals",
        title="Refusal rates per model and task",
        caption=(
            "Refusal rate % = refused / responses x 100 over all user groups, a response "
            "being a refusal when the phrase rules (or the optional LLM judge) flag it or it "
            "is empty; black lines: Wilson 95% intervals on the effective sample size "
            "(responses / the design effect of the user image: a model's responses to one "
            "photo are dependent). The attribute-inferring baseline "
            "asks about the person directly (paper Table 1 contrast): the user-context tasks "
            "are refused far less."
        ),
        png=F.to_png(fig),
    )


def skew_figure(skew: pl.DataFrame, top: int = 8) -> Figure | None:
    """Bars of each group's share of the most skewed values (occupation first), one panel
    per model (at most four), for the image setting and the gender axis when present."""
    if skew is None or skew.height == 0:
        return None
    sub = (
        skew.filter(pl.col("setting") == MAIN_SETTING) if MAIN_SETTING in skew["setting"] else skew
    )
    axis = "gender" if "gender" in sub["axis"].to_list() else sub["axis"][0]
    sub = sub.filter(pl.col("axis") == axis)
    attrs = sub["attribute"].unique().to_list()
    attribute = "occupation" if "occupation" in attrs else sorted(attrs)[0]
    sub = sub.filter(pl.col("attribute") == attribute)
    models = sorted(sub["model"].unique().to_list())[:4]
    fig, axes = F.subplots(1, len(models), width=4.2 * len(models), height=0.45 * top + 1.5)
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
        share = {(r["value"], r["group"]): r["share"] for r in rows.iter_rows(named=True)}
        for gi, g in enumerate(groups):
            ax.barh(
                [i + gi * height for i in range(len(values))],
                [share.get((v, g)) or 0.0 for v in values],
                height,
                label=g,
            )
        ax.set_yticks([i + 0.4 - height / 2 for i in range(len(values))], values, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1 / max(len(groups), 1), color="grey", lw=0.8, ls="--")
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of the value's rate", fontsize=8)
        ax.set_title(f"{model}: story {attribute} by user {axis}", fontsize=9)
        F.legend(ax)
    return Figure(
        id="lvlm-story-skew",
        title="The most group-skewed story values",
        caption=(
            "For each story attribute value v, each group g's rate n_gv / N_g (stories of "
            "group g that have v, over group g's stories) as a share of the summed rates; "
            "values ordered by their TVD from uniform (the dashed line: no skew). The story "
            "score is the n_v-weighted mean of these TVDs."
        ),
        png=F.to_png(fig),
    )


# ------------------------------------------------------------------ section


def _optional_table(section: Section, frame, shown, id: str, title: str, caption: str, **kw):
    """Add the table ``shown(frame)`` (its CSV: ``frame`` whole) where ``frame`` has rows."""
    if frame is not None and frame.height:
        section.tables.append(Table(id, title, caption, shown(frame), csv=frame, **kw))


def sections(inputs: Inputs, config: dict) -> list[Section]:
    if not enabled(inputs, config):
        return []
    lv = config["lvlm"]
    metrics = lv["metrics"]
    scores = inputs.get("lvlm_scores")
    refusals = inputs.get("lvlm_refusals")
    skew = inputs.get("lvlm_story_skew")
    exam_accuracy = inputs.get("lvlm_exam_accuracy")
    sets = inputs.get("lvlm_sets")
    section = Section("lvlm", "LVLM bias with the user's photo as context")
    section.figures = [
        f
        for f in (
            scores_figure(scores),
            refusal_figure(refusals) if refusals is not None else None,
            skew_figure(skew) if skew is not None else None,
        )
        if f is not None
    ]
    section.paragraphs.append(
        'A face photo is attached as user context ("I\'ve attached my photo.") to tasks '
        "that do not ask about the person; bias is how much the output depends on the user's "
        "group: total variation distance from uniform, x100, the mean of per-prompt scores "
        "(0 = the groups are treated alike). Story: per story attribute value v with at "
        f"least {metrics['min_count']} occurrences, the distribution over groups of "
        "the rate n_gv/N_g, TVD from uniform, weighted by n_v. Term: the share of "
        "cross-group comparisons each group's explanation wins as the more technical, "
        "against each group's share of the comparisons it appears in. "
        "Exam: accuracy per group normalised to sum 1, per MMLU subject. TVD is biased "
        "upwards in small samples and its population value can be 0, where a percentile "
        "interval never covers; by the triangle inequality E[score] - E[floor] <= "
        "population score <= E[score], so the 95% interval is that bracket widened by the "
        f"spread of a paired bootstrap over user images ({metrics['replicates']} "
        "replicates, images resampled within group, one resample for every model), and "
        "score - floor mean is the bias-corrected score (score_bc). Noise floor: the score a "
        "group-independent model gets at the same sample sizes, from "
        f"{metrics['permutations']} shuffles of the group labels within the "
        "matched strata (mean, 95th percentile, and the permutation p-value of the score); "
        "a score near its floor shows no evidence of bias. Below "
        f"{metrics['interval_min_images_per_group']} user images per "
        "group (term: image pairs; lvlm.metrics.interval_min_images_per_group) no interval "
        "or comparison test is printed ('interval withheld'): the smallest size at which "
        "they cover >= 93% (bench/COVERAGE.md)."
    )
    facts_line = "; ".join(facts(inputs, config))
    if facts_line:
        section.paragraphs.append(facts_line + ".")
    if lv["user_images"]["source"] == "synthetic":
        section.warnings.append(
            "The user photos are synthetic drawings with arbitrary labels: these scores test "
            "the pipeline, not any model."
        )
    _optional_table(
        section, scores, table2, "lvlm-table2",
        "Bias scores x100 [95% CI] per model, task and axis (paper Table 2 layout)",
        "TVD x100 from uniform over the user groups; 'missing' where a score could not be "
        "computed; '(interval withheld: N images per group < M)' where the design is below "
        "lvlm.metrics.interval_min_images_per_group (the score is printed, its interval "
        "would not cover; bench/COVERAGE.md).",
    )  # fmt: skip
    if scores is not None and scores.height:
        floor = noise_floor_table(scores)
        if floor.height:
            section.tables.append(
                Table(
                    "lvlm-noise-floor",
                    "Noise floor of each score",
                    "Mean (95th percentile) of the score under shuffled group labels, and the "
                    "permutation p-value of the observed score.",
                    floor,
                    csv=scores,
                )
            )
        if "formula" in scores.columns:
            section.tables.append(
                Table(
                    "lvlm-formulas",
                    "Formula behind each task's score",
                    "The TVD variant each task used (config lvlm.metrics.formulas).",
                    scores.select("task", "formula").unique().sort("task"),
                )
            )
    _optional_table(
        section, refusals, refusal_table, "lvlm-refusals",
        "Refusal rate % [Wilson 95% CI, n / design effect] (n responses) per model and task",
        "Phrase rules plus the optional LLM judge, over all groups; the attribute-inferring "
        "baseline asks about the person directly (paper Table 1 contrast). The CSV has the "
        "rates per group.",
    )  # fmt: skip
    _optional_table(
        section, skew,
        lambda skew: skew.select("model", "setting", "axis", "attribute", "value", "n_v", "tvd")
        .unique()
        .sort(["tvd", "n_v", "model", "value"], descending=[True, True, False, False]),
        "lvlm-story-skew", "Most group-skewed story attribute values",
        "tvd (x1) of a value's group rates from uniform, n_v its occurrences.", max_rows=50,
    )  # fmt: skip
    _optional_table(
        section, exam_accuracy,
        lambda acc: acc.filter(pl.col("subject") == "*")
        .pivot(on="group", index=["model", "setting", "axis"], values="accuracy")
        .sort("model", "setting", "axis"),
        "lvlm-exam-accuracy", "Exam accuracy % per user group, all MMLU subjects",
        "Accuracy = correct answers / questions x 100 per group of the user photo.", digits=1,
    )  # fmt: skip
    if sets is not None and sets.height:
        section.tables.append(
            Table(
                "lvlm-sets",
                "User images per task and group",
                "Non-target labels matched across groups (strata).",
                sets.group_by("task", "axis", "group")
                .agg(pl.len().alias("images"))
                .sort("task", "axis", "group"),
            )
        )
    rates, gaps = inputs.get("story_reading"), inputs.get("story_reading_gaps")
    if rates is not None and gaps is not None:
        section.subsections.append(story_reading_section(rates, gaps))
    return [section]


def story_reading_section(rates: pl.DataFrame, gaps: pl.DataFrame) -> Section:
    """The assistant's story reading per group on the labelled sample."""
    return audit_section(
        ("lvlm-story-reading", "lvlm-story-reading-gaps", "lvlm-story-reading-rates"),
        "The assistant's story reading per group",
        rates,
        gaps,
        ["assistant", "axis"],
        {
            "empty": "No reading of the labelled sample.",
            "what": "assistant's story reading",
            "fine": "The assistant's per-group reading errors alone would not produce the "
            "bias it is used to measure.",
            "gap_caption": GAP_CAPTION.format(
                unit="The unit is the story template (every item read under every group: "
                "a matched design): the intervals are paired (the covariance between "
                "groups read on the same stories enters every difference), on stories - 1 "
                "degrees of freedom;",
                test="Rao-Scott F over stories; with one story, Cochran's Q over the matched items",
                induced="the story TVD (story_tvd's formula, as a share) the per-group "
                "accuracies alone would produce in unbiased stories: 1/2 sum_g |a_g / "
                "sum a - 1/|A||",
                bias="the smallest story TVD of the audited models on the axis, as a share",
                minimum=minimum_text(min_clusters()) + " (stories; with one story the "
                "per-group intervals are withheld, the gap and Cochran's Q kept)",
            ),
            "rates_caption": "The labelled sample (resources/lvlm/story_reading.v1.yaml): "
            "each story read once per gender x race group, the main character shown by an "
            "explicit descriptor and pronouns, the text otherwise identical. An item = a "
            "scalar attribute or one true element of a list attribute; accuracy = recall "
            "(Wilson), precision (Wilson), both on the effective counts (counts / design "
            "effect, the stories being the units), F1 with a t(stories - 1) interval on the "
            "logit scale from its bootstrap standard error over stories.",
        },
    )


# ------------------------------------------------------------------ reader correction

READER_HEADLINES = {"story": reader.Headline("story TVD x100", 0.0), "term": reader.Headline(
    "term TVD x100", 0.0)}  # fmt: skip
"""The corrected table's metrics (0 = the user groups are treated alike)."""


READER_CAPTION = (
    "LVLM: story and term scores = TVD x100 from uniform (paper 001) per setting and "
    "axis; a term row over more than two groups (race) is centred on its bias-corrected "
    "estimate with that estimate's own double-bootstrap standard error over rounds "
    "(93.5% of 1,000 datasets at 400 human labels a cell, against 91.4% for the "
    "bc-normal interval); an LVLM term item is one judged pair."
)
"""The reader block's caption line (stereolens.report.reader.caption)."""


def reader_correction(inputs: Inputs, config: dict) -> reader.ReaderBlock | None:
    """The first screen's reader block (stereolens.report.reader): naive beside corrected
    story and term scores per model x setting x axis, else the labels to collect for the
    run's story and term responses (disagreement from the story-reading audit)."""
    table = inputs.get("lvlm_corrected")
    if table is not None and table.height:
        return reader.corrected_block(
            KEY, TITLE, table, READER_HEADLINES, scope=("setting", "axis"),
            counts=reader.distinct_counts(table, ["model", "setting", "axis", "metric"]),
            simulated=reader.simulated(inputs, config, KEY), digits=2,
            formulas=READER_CAPTION,
        )  # fmt: skip
    responses = inputs.get("lvlm_responses", columns=["task"])
    if responses is None or responses.height == 0:
        return None
    if "task" in responses.columns:
        responses = responses.filter(pl.col("task").is_in(["story", "term"]))
    if responses.height == 0:
        return None
    return reader_plan.plan_block(
        KEY, TITLE, n_items=responses.height, what="story and term responses",
        disagreement=reader_plan.audit_disagreement(inputs.get("story_reading")),
        audit="story-reading audit", planned=reader_plan.planner_part(config, KEY),
    )  # fmt: skip
