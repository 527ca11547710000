"""All LVLM tables of a run from the merged responses: scores with bootstrap CIs, per-prompt
scores, refusal rates and the most group-skewed story attributes (inputs: docs/methods.md)."""

from __future__ import annotations

import numpy as np
import polars as pl

from stereolens.lvlm import scores as S
from stereolens.lvlm.refusal import RATE, REFUSAL_COUNTS, label_refusals, load_rules
from stereolens.lvlm.settings import LVLMSettings
from stereolens.validation import ConfigError

SKEW_FORMULA = (
    "rate_g = n_gv / N_g (share of group g's stories with value v); share_g = rate_g / "
    "sum_h rate_h; tvd = 1/2 sum_g |share_g - 1/|A||; values with n_v >= {min_count}"
)


def _with_setting(frame):
    """A table (DataFrame or LazyFrame) without ``setting`` is one setting, "image"."""
    if isinstance(frame, pl.LazyFrame):
        if "setting" not in frame.collect_schema().names():
            return frame.with_columns(pl.lit("image").alias("setting"))
        return frame
    if frame.height and "setting" not in frame.columns:
        return frame.with_columns(pl.lit("image").alias("setting"))
    return frame


def reduce_responses(responses, phrases=None) -> dict[str, pl.DataFrame]:
    """What the metrics need of a responses table (a LazyFrame is aggregated as it streams):
    ``story`` (its story rows), ``exam`` (answers ``n`` and correct ``n_correct`` per image and
    subject; an answer naming no valid letter is wrong), ``refusals`` (the refusal_rates counts
    per model, setting, task, axis, group; phrase rules label a table without refusal columns;
    None without those and ``response``) and ``refusal_images`` (the same per user image)."""
    lf = _with_setting(responses.lazy() if isinstance(responses, pl.DataFrame) else responses)
    names = set(lf.collect_schema().names())
    need = {"model", "task", "axis", "group", "image_id", "prompt_id"}
    missing = need - names
    if missing:
        raise ConfigError(f"responses table lacks column(s) {', '.join(sorted(missing))}")
    keys = ["model", "setting", "axis", "group", "image_id", "prompt_id"]
    strat = ["stratum"] if "stratum" in names else []
    out: dict[str, pl.DataFrame | None] = {}
    # the streaming engine: a parquet table is read in batches, never whole
    out["story"] = (
        lf.filter(pl.col("task") == "story").select(*keys, *strat).collect(engine="streaming")
    )
    exam = lf.filter(pl.col("task") == "exam")
    if exam.select(pl.len()).collect(engine="streaming").item():
        absent = {"subject", "correct"} - names
        if absent:
            raise ConfigError(f"responses: exam rows lack column(s) {', '.join(sorted(absent))}")
        out["exam"] = (
            exam.group_by(*keys[:-1], *strat, "subject")
            .agg(
                pl.len().alias("n"),
                pl.col("correct").fill_null(False).cast(pl.Boolean).sum().alias("n_correct"),
            )
            .collect(engine="streaming")
        )
    else:
        out["exam"] = pl.DataFrame()
    by = ["model", "setting", "task", "axis", "group"]
    per_image = [*by, "image_id"]
    if "refusal" in names:
        counts = lf.group_by(per_image).agg(**REFUSAL_COUNTS).collect(engine="streaming")
    elif "response" in names:
        cols = [*per_image, "response", *(["request"] if "request" in names else [])]
        labelled = label_refusals(lf.select(cols).collect(), rules=load_rules(phrases))
        counts = labelled.group_by(per_image).agg(**REFUSAL_COUNTS)
    else:
        counts = None
    # per user image, for the paired bootstrap of the comparisons between models
    out["refusal_images"] = counts
    out["refusals"] = (
        None if counts is None else counts.group_by(by).agg(pl.col(c).sum() for c in REFUSAL_COUNTS)
    )
    return out


def scores(
    responses: pl.DataFrame | pl.LazyFrame | dict,
    story_attributes: pl.DataFrame | None = None,
    term_judgements: pl.DataFrame | None = None,
    settings: LVLMSettings | None = None,
    *,
    replicates_out: dict | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(overall, per_prompt) score tables for every model x setting x task x axis with data
    (scores.overall_scores, scores.prompt_scores); ``replicates_out``, when given, receives per
    (model, setting, task, axis) the score's paired bootstrap replicates. A task without its
    input (story attributes, judgements, exam rows) is left out, never scored 0. ``settings``:
    None for the "paper" preset."""
    st = settings or LVLMSettings.preset()
    reduced = responses if isinstance(responses, dict) else reduce_responses(responses)
    overall, per_prompt = [], []
    kw = {"min_count": st.min_count, "formulas": S.check_formulas(dict(st.formulas))}
    boot = {"n_boot": st.replicates, "seed": st.seed, "level": st.level}
    boot |= {"permutations": st.permutations}
    boot["min_images_per_group"] = st.interval_min_images_per_group

    def add(task: str, table: pl.DataFrame, **extra) -> None:
        # every setting at once: one paired resample of the shared images per replicate
        o, reps = S.score_replicates(task, table, **kw, **boot, **extra)
        overall.append(o)
        per_prompt.append(S.prompt_scores(task, table, **kw, **extra))
        if replicates_out is not None:
            replicates_out.update({(m, st, task, a): r for (m, st, a), r in reps.items()})

    if story_attributes is not None and story_attributes.height:
        stories = reduced["story"]
        cols = ["model", "setting", "axis", "group", "image_id", "prompt_id"]
        cols += ["stratum"] if "stratum" in stories.columns else []
        add("story", _with_setting(story_attributes), responses=stories.select(cols))
    if term_judgements is not None and term_judgements.height:
        add("term", _with_setting(term_judgements))
    if reduced["exam"].height:
        add("exam", reduced["exam"])
    order = ["model", "setting", "task", "axis"]
    out_o = (
        pl.concat(overall, how="diagonal_relaxed").select(*order, pl.exclude(order)).sort(order)
        if overall
        else pl.DataFrame()
    )
    out_p = (
        pl.concat(per_prompt, how="diagonal_relaxed")
        .select(*order, pl.exclude(order))
        .sort([*order, "prompt_id"])
        if per_prompt
        else pl.DataFrame()
    )
    return out_o, out_p


def _rates(counts: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """refusal.refusal_rates from per-group counts."""
    return (
        counts.group_by(by).agg(pl.col(c).sum() for c in REFUSAL_COUNTS).with_columns(RATE).sort(by)
    )


def _design_effect(images: pl.DataFrame | None, by: list[str]) -> pl.DataFrame | None:
    """Per ``by`` cell the design effect of the user image on the refusal rate: the cluster-robust
    variance of sum y_i / sum m_i over images (y refusals, m valid responses), sum (y_i - p
    m_i)^2 / (sum m)^2, over the binomial p (1 - p) / sum m; at least 1, and 1 at p = 0 or 1."""
    if images is None or images.height == 0:
        return None
    m = (pl.col("n") - pl.col("n_empty")).cast(pl.Float64)
    y = pl.col("n_refusal").cast(pl.Float64)
    return (
        images.with_columns(m.alias("_m"), y.alias("_y"))
        .with_columns((pl.col("_y").sum() / pl.col("_m").sum()).over(by).alias("_p"))
        .group_by(by)
        .agg(
            ((pl.col("_y") - pl.col("_p") * pl.col("_m")) ** 2).sum().alias("_ss"),
            pl.col("_m").sum().alias("_sm"),
            pl.col("_p").first().alias("_p"),
        )
        .with_columns(
            pl.when((pl.col("_p") > 0) & (pl.col("_p") < 1))
            .then(pl.col("_ss") / (pl.col("_p") * (1 - pl.col("_p")) * pl.col("_sm")))
            .otherwise(1.0)
            .clip(lower_bound=1.0)
            .alias("deff")
        )
        .select(*by, "deff")
    )


def _images_per_group(images: pl.DataFrame | None, by: list[str]) -> pl.DataFrame | None:
    """Per ``by`` cell the fewest user images of any (axis, group) in it."""
    if images is None or images.height == 0:
        return None
    cell = ["model", "setting", "task", "axis", "group"]
    return (
        images.group_by(cell)
        .agg(pl.col("image_id").n_unique().alias("images_per_group"))
        .group_by(by)
        .agg(pl.col("images_per_group").min().cast(pl.Int64))
    )


def refusals(responses, phrases=None) -> pl.DataFrame:
    """Refusal rate (%) per model x setting x task (axis, group "*") and per group with a Wilson
    95% interval on the effective sample size (n valid / ``deff``, :func:`_design_effect`; 1
    without per-image counts) and ``images_per_group`` (the fewest user images of any group in
    the row). ``responses``: a table or its :func:`reduce_responses`."""
    from statsmodels.stats.proportion import proportion_confint

    reduced = responses if isinstance(responses, dict) else reduce_responses(responses, phrases)
    counts = reduced["refusals"]
    if counts is None:
        return pl.DataFrame()
    images = reduced.get("refusal_images")
    parts = []
    for by, extra in (
        (["model", "setting", "task"], [pl.lit("*").alias("axis"), pl.lit("*").alias("group")]),
        (["model", "setting", "task", "axis", "group"], []),
    ):
        part = _rates(counts, by).with_columns(*extra)
        deff = _design_effect(images, by)
        part = (
            part.join(deff, on=by, how="left").with_columns(pl.col("deff").fill_null(1.0))
            if deff is not None
            else part.with_columns(pl.lit(1.0).alias("deff"))
        )
        per_group = _images_per_group(images, by)
        part = (
            part.join(per_group, on=by, how="left")
            if per_group is not None
            else part.with_columns(pl.lit(None, pl.Int64).alias("images_per_group"))
        )
        parts.append(part)
    table = pl.concat(parts, how="diagonal_relaxed")
    valid = (table["n"] - table["n_empty"]).to_numpy().astype(float)
    deff = table["deff"].to_numpy()
    lo, hi = proportion_confint(
        table["n_refusal"].to_numpy() / deff,
        np.maximum(valid, 1) / deff,
        alpha=0.05,
        method="wilson",
    )
    order = ["model", "setting", "task", "axis", "group"]
    return (
        table.with_columns(
            pl.Series("ci_low", np.where(valid > 0, 100 * lo, np.nan)),
            pl.Series("ci_high", np.where(valid > 0, 100 * hi, np.nan)),
        )
        .select(*order, pl.exclude(order))
        .sort(order)
    )


def story_skew(
    story_attributes: pl.DataFrame, responses: pl.DataFrame, *, min_count: int = 5
) -> pl.DataFrame:
    """Per (model, setting, axis, attribute, value) with n_v >= min_count and group: n_gv, N_g,
    rate = n_gv / N_g, share = rate_g / sum_h rate_h and the value's tvd (SKEW_FORMULA),
    sorted by tvd."""
    if story_attributes is None or story_attributes.height == 0:
        return pl.DataFrame()
    story_attributes = _with_setting(story_attributes)
    reduced = responses if isinstance(responses, dict) else reduce_responses(responses)
    stories = (
        reduced["story"]
        .select("model", "setting", "axis", "group", "image_id", "prompt_id")
        .unique()
    )
    n_g = stories.group_by("model", "setting", "axis", "group").agg(pl.len().alias("N_g"))
    counts = (
        story_attributes.select(
            "model", "setting", "axis", "group", "image_id", "attribute", "value"
        )
        .unique()
        .group_by("model", "setting", "axis", "attribute", "value", "group")
        .agg(pl.len().alias("n_gv"))
    )
    keys = ["model", "setting", "axis", "attribute", "value"]
    grid = counts.select(keys).unique().join(n_g, on=["model", "setting", "axis"])
    table = (
        grid.join(counts, on=[*keys, "group"], how="left")
        .with_columns(pl.col("n_gv").fill_null(0))
        .with_columns(
            (pl.col("n_gv") / pl.col("N_g")).alias("rate"),
            pl.col("n_gv").sum().over(keys).alias("n_v"),
            pl.len().over(keys).alias("n_groups"),
        )
        .filter(pl.col("n_v") >= min_count)
        .with_columns((pl.col("rate") / pl.col("rate").sum().over(keys)).alias("share"))
        .with_columns(
            (0.5 * (pl.col("share") - 1.0 / pl.col("n_groups")).abs().sum().over(keys)).alias("tvd")
        )
    )
    return (
        table.with_columns(pl.lit(SKEW_FORMULA.format(min_count=min_count)).alias("formula"))
        .select(*keys, "n_v", "tvd", "group", "n_gv", "N_g", "rate", "share", "formula")
        .sort(
            ["tvd", "n_v", *keys, "group"],
            descending=[True, True, False, False, False, False, False, False],
        )
    )


def exam_accuracy(responses: pl.DataFrame) -> pl.DataFrame:
    """Exam accuracy (%) per model, setting, axis, group and subject, and over all subjects
    (subject "*"): columns model, setting, axis, group, subject, n, n_correct, accuracy.
    An answer that names no valid letter counts as wrong."""
    reduced = responses if isinstance(responses, dict) else reduce_responses(responses)
    exam = reduced["exam"]
    if exam.height == 0:
        return pl.DataFrame()
    keys = ["model", "setting", "axis", "group"]
    agg = [pl.col("n").sum().alias("n"), pl.col("n_correct").sum().alias("n_correct")]
    per_subject = exam.group_by([*keys, "subject"]).agg(agg)
    overall = exam.group_by(keys).agg(agg).with_columns(pl.lit("*").alias("subject"))
    return (
        pl.concat([per_subject, overall.select(per_subject.columns)])
        .with_columns((100.0 * pl.col("n_correct") / pl.col("n")).alias("accuracy"))
        .sort([*keys, "subject"])
    )


def compute_all(
    responses: pl.DataFrame,
    story_attributes: pl.DataFrame | None = None,
    term_judgements: pl.DataFrame | None = None,
    settings: LVLMSettings | None = None,
    *,
    phrases=None,
) -> dict[str, pl.DataFrame]:
    """scores, prompt_scores, refusals, comparisons, ranks, exam_accuracy and story_skew under
    ``settings`` (None: the "paper" preset); a LazyFrame ``responses`` is reduced as it streams."""
    from stereolens.lvlm import comparisons as K

    st = settings or LVLMSettings.preset()
    reduced = reduce_responses(responses, phrases)
    reps: dict = {}
    overall, per_prompt = scores(
        reduced, story_attributes, term_judgements, st, replicates_out=reps
    )
    rates = refusals(reduced)
    level, min_images = st.level, st.interval_min_images_per_group
    cmp, rk = K.tvd_comparisons(overall, reps, level, min_images)
    refusal_reps = K.refusal_replicates(reduced["refusal_images"], st.replicates, st.seed)
    c2, r2 = K.refusal_comparisons(rates, refusal_reps, level, min_images)
    return {
        "scores": overall,
        "prompt_scores": per_prompt,
        "refusals": rates,
        **K.tables(cmp + c2, rk + r2),
        "exam_accuracy": exam_accuracy(reduced),
        "story_skew": story_skew(story_attributes, reduced, min_count=st.min_count)
        if story_attributes is not None
        else pl.DataFrame(),
    }
