"""The first screen's reader block (stereolens.report.reader, issue 21 item 5) on fixed small
corrected tables: naive beside corrected with their intervals, the human labels that went
in, the flags (a significance that the correction takes away, a rank that changes) and the
sentence of a run without human labels; the report of an older results folder (no corrected
tables) still renders."""

from __future__ import annotations

import re

import polars as pl
import pytest
from test_report import _biasig_tables, _contextbias_tables, _lvlm_tables

from stereolens.config import load_config
from stereolens.report import reader as R
from stereolens.report import reader_plan as RP
from stereolens.report.cli import report_config
from stereolens.report.inputs import Inputs
from stereolens.report.render import build_report, render_report

NUM = ["naive", "naive_low", "naive_high", "corrected", "estimate_bc", "ci_low", "ci_high"]


def _cb_corrected() -> pl.DataFrame:
    """ContextBias corrected rows (extractor x): nurse / gender: a's naive interval excludes
    0 and its corrected one does not, and a and b swap ranks; pilot / gender: nothing
    changes; nurse / framing: one model (no rank)."""
    rows = [
        # model, role, dimension, naive, lo, hi, corrected, lo, hi, n_human, n_items
        ("a", "nurse", "gender_presentation", 0.30, 0.10, 0.50, 0.12, 0.00, 0.30, 10, 40),
        ("b", "nurse", "gender_presentation", 0.20, 0.05, 0.35, 0.25, 0.05, 0.45, 12, 40),
        ("a", "pilot", "gender_presentation", 0.10, 0.00, 0.20, 0.10, 0.00, 0.20, 8, 40),
        ("b", "pilot", "gender_presentation", 0.30, 0.10, 0.50, 0.35, 0.10, 0.60, 10, 40),
        ("a", "nurse", "framing", 0.50, 0.20, 0.70, 0.40, 0.10, 0.70, 10, 40),
    ]
    out = []
    for m, role, dim, n, nl, nh, c, cl, ch, nhum, nit in rows:
        out.append(
            {
                "extractor": "x", "model": m, "role": role, "condition": "CF",
                "cohort": "people" if dim != "framing" else "camera", "dimension": dim,
                "metric": "bi", "naive": n, "naive_low": nl, "naive_high": nh,
                "corrected": c, "estimate_bc": c, "ci_low": cl, "ci_high": ch,
                "off_simplex": False, "n_human": nhum, "n_items": nit,
                "interval_reliable": True, "k": 2,
            }
        )  # fmt: skip
    return pl.DataFrame(out)


def _bg_corrected() -> pl.DataFrame:
    """BiasIG corrected rows: S_imp of v1 / v2 (null 1, higher = less biased), '*' and
    per attribute; no flag fires (v1 stays above v2, both exclude 1)."""
    out = []
    for variant, s_imp in (("v1", 0.90), ("v2", 0.80)):
        for attr, n in (("gender", 4), ("race", 4), ("*", 8)):
            out.append(
                {
                    "variant": variant, "model": "m", "protected_attribute": attr,
                    "metric": "s_imp", "naive": s_imp, "naive_low": s_imp - 0.05,
                    "naive_high": s_imp + 0.05, "corrected": s_imp - 0.01,
                    "estimate_bc": s_imp - 0.01, "ci_low": s_imp - 0.07,
                    "ci_high": s_imp + 0.05, "off_simplex": False, "n_human": n,
                    "n_items": 2 * n, "interval_reliable": True,
                }
            )  # fmt: skip
    return pl.DataFrame(out)


def test_headline_table_flags_what_changes_and_only_that():
    block = R.corrected_block(
        "contextbias", "ContextBias", _cb_corrected(), {"bi": R.Headline("BI", 0.0)},
        scope=("condition", "role", "dimension"),
        counts=R.distinct_counts(_cb_corrected(), ["model", "role", "condition"]),
    )  # fmt: skip
    t = {(r["model"], r["scope"]): r for r in block.table.iter_rows(named=True)}
    nurse_a = t[("a", "CF · nurse · gender_presentation")]
    assert nurse_a["naive_excludes_null"] and not nurse_a["corrected_excludes_null"]
    assert nurse_a["significance_flag"] == "naive interval excludes 0, corrected does not"
    # a: naive 0.30 (rank 2 of 2) -> corrected 0.12 (rank 1); b the other way
    assert (nurse_a["naive_rank"], nurse_a["corrected_rank"]) == (2, 1)
    assert nurse_a["rank_flag"] == "rank 2 -> 1 of 2"
    nurse_b = t[("b", "CF · nurse · gender_presentation")]
    assert nurse_b["significance_flag"] is None  # both exclude 0
    assert nurse_b["rank_flag"] == "rank 1 -> 2 of 2"
    for m in ("a", "b"):  # pilot: the order and both conclusions hold
        row = t[(m, "CF · pilot · gender_presentation")]
        assert row["significance_flag"] is None and row["rank_flag"] is None
    framing = t[("a", "CF · nurse · framing")]  # one model: no rank, no flag
    assert framing["naive_rank"] is None and framing["rank_flag"] is None
    # the human labels counted once per image: 10 + 12 + 8 + 10 of 160 (framing is the
    # same 40 images as a / nurse / gender_presentation)
    assert (block.n_human, block.n_items) == (40, 160)
    # the first screen: flagged rows first, the numbers as printed
    assert [r["model"] for r in block.rows[:2]] == ["a", "b"]
    assert block.rows[0]["naive"] == "0.300 [0.100, 0.500]"
    assert block.rows[0]["corrected"] == "0.120 [0.000, 0.300]"
    assert block.rows[0]["labels"] == "10 / 40"
    assert len(block.flags) == 2 and block.hidden == 0


def test_higher_is_less_biased_and_the_reverse_significance_flag():
    t = _bg_corrected().filter(pl.col("protected_attribute") == "*")
    block = R.corrected_block(
        "biasig", "BiasIG", t, {"s_imp": R.Headline("S_imp", 1.0, lower_is_less_biased=False)},
        unit="variant",
    )  # fmt: skip
    ranks = dict(zip(block.table["model"], block.table["naive_rank"], strict=True))
    assert ranks == {"v1": 1, "v2": 1 + 1}  # 0.90 is the less biased S_imp
    assert block.flags == []
    # corrected interval now excludes 1 while the naive one reaches it: the reverse flag
    moved = t.with_columns(
        pl.when(pl.col("variant") == "v1").then(1.02).otherwise(pl.col("naive_high"))
        .alias("naive_high")
    )  # fmt: skip
    again = R.corrected_block("biasig", "BiasIG", moved, {"s_imp": R.Headline("S_imp", 1.0)},
                              unit="variant")  # fmt: skip
    v1 = again.table.filter(pl.col("model") == "v1").row(0, named=True)
    assert v1["significance_flag"] == "corrected interval excludes 1, naive does not"


def test_biasig_eta_shows_its_estimate_without_interval_or_rank():
    from stereolens.biasig import report as bg_report

    s_imp = _bg_corrected().filter(pl.col("protected_attribute") == "*")
    eta = s_imp.with_columns(
        metric=pl.lit("eta"), naive=pl.Series([0.40, 0.60]), naive_low=pl.Series([0.38, 0.58]),
        naive_high=pl.Series([0.42, 0.62]), estimate_bc=pl.Series([0.52, 0.45]),
        ci_low=pl.Series([0.51, 0.44]), ci_high=pl.Series([0.53, 0.46]),
        interval_reliable=pl.lit(False),
    )  # fmt: skip
    block = R.corrected_block(
        "biasig", "BiasIG", pl.concat([s_imp, eta]), bg_report.READER_HEADLINES,
        unit="variant", scope=("protected_attribute",),
    )  # fmt: skip
    rows = block.table.filter(pl.col("metric") == "eta")
    assert rows["corrected"].to_list() == [0.52, 0.45]  # the double-bootstrap estimate
    assert rows["ci_low"].null_count() == 2 and rows["naive_rank"].null_count() == 2
    assert rows["significance_flag"].null_count() == 2 and rows["rank_flag"].null_count() == 2
    assert all("printed from 600 human labels per cell" in n for n in rows["interval_note"])
    assert block.withheld == 2 and not any("eta" in f for f in block.flags)
    # S_imp beside it keeps its ranks
    assert block.table.filter(pl.col("metric") == "s_imp")["naive_rank"].to_list() == [1, 2]


def test_an_undefined_corrected_value_is_never_flagged():
    t = _cb_corrected().with_columns(
        pl.when(pl.col("model") == "a").then(float("nan")).otherwise(pl.col(c)).alias(c)
        for c in ("corrected", "estimate_bc", "ci_low", "ci_high")  # NaN as corrected_metric
    )
    block = R.corrected_block("contextbias", "ContextBias", t, {"bi": R.Headline("BI", 0.0)},
                              scope=("role", "dimension"))  # fmt: skip
    assert block.flags == []
    assert block.table.filter(pl.col("model") == "a")["corrected"].null_count() == 3
    assert any(r["corrected"] == "n/a" for r in block.rows)


def test_contextbias_ccs_rows_beside_bi_rank_flag_only():
    # CCS rows (condition "*", one label each) beside BI rows (label null): the scope names
    # the label where there is one; CCS has no no-bias value, so no significance flag, but a
    # rank that changes (a: 40 -> 20, b: 30 -> 35) is flagged; counts come from the BI rows.
    from stereolens.contextbias.report import READER_HEADLINES

    bi = _cb_corrected().with_columns(pl.lit(None, pl.String).alias("label"))
    ccs = pl.DataFrame(
        [
            {**bi.row(0, named=True), "model": m, "condition": "*", "label": "female",
             "metric": "ccs", "naive": n, "naive_low": n - 5, "naive_high": n + 5,
             "corrected": c, "estimate_bc": c, "ci_low": c - 5, "ci_high": c + 5,
             "n_human": 30, "n_items": 120, "k": None}
            for m, n, c in (("a", 40.0, 20.0), ("b", 30.0, 35.0))
        ],
        schema=bi.schema,
    )  # fmt: skip
    table = pl.concat([bi, ccs])
    block = R.corrected_block(
        "contextbias", "ContextBias", table, READER_HEADLINES,
        scope=("condition", "role", "dimension", "label"),
        counts=R.distinct_counts(table, ["model", "role", "condition"], pl.col("metric") == "bi"),
    )  # fmt: skip
    rows = block.table.filter(pl.col("metric") == "ccs")
    assert rows["scope"].to_list() == ["* · nurse · gender_presentation · female"] * 2
    assert rows["significance_flag"].null_count() == 2
    assert rows["rank_flag"].to_list() == ["rank 2 -> 1 of 2", "rank 1 -> 2 of 2"]
    bi_rows = block.table.filter(pl.col("metric") == "bi")
    assert "CF · nurse · gender_presentation" in bi_rows["scope"].to_list()
    assert (block.n_human, block.n_items) == R.distinct_counts(bi, ["model", "role", "condition"])


def test_contextbias_pooled_cohort_rows_rank_within_their_cohort():
    # pooled BI's summary rows (role "*", dimension "*"; cohort "*" overall): the scope
    # names the cohort, so a and b rank per cohort. people: a 0.1 -> 0.3, b 0.2 -> 0.2
    # (rank flag); objects: a 0.4, b 0.5, nothing changes; overall: one row each.
    from stereolens.contextbias.report import READER_HEADLINES, READER_SCOPE

    base = _cb_corrected().with_columns(pl.lit(None, pl.String).alias("label")).row(0, named=True)
    rows = [
        {**base, "model": m, "role": "*", "cohort": c, "dimension": "*", "metric": "bi_pooled",
         "naive": n, "naive_low": n - 0.05, "naive_high": n + 0.05, "corrected": k,
         "estimate_bc": k, "ci_low": k - 0.05, "ci_high": k + 0.05, "k": None}
        for m, c, n, k in (("a", "people", 0.1, 0.3), ("b", "people", 0.2, 0.2),
                           ("a", "objects", 0.4, 0.4), ("b", "objects", 0.5, 0.5),
                           ("a", "*", 0.25, 0.35), ("b", "*", 0.35, 0.35))
    ]  # fmt: skip
    table = pl.DataFrame(rows, schema=_cb_corrected().schema | {"label": pl.String})
    block = R.corrected_block("contextbias", "ContextBias", table, READER_HEADLINES,
                              scope=READER_SCOPE)  # fmt: skip
    got = {(r["model"], r["scope"]): r for r in block.table.iter_rows(named=True)}
    assert got[("a", "CF · * · people · *")]["rank_flag"] == "rank 1 -> 2 of 2"
    assert got[("b", "CF · * · people · *")]["rank_flag"] == "rank 2 -> 1 of 2"
    assert got[("a", "CF · * · objects · *")]["rank_flag"] is None
    assert got[("a", "CF · * · * · *")]["naive_rank"] == 1
    assert block.table.height == 6
    # their mean over generators (model "*"): shown, flagged against 0, never ranked
    mean = table.head(1).with_columns(
        model=pl.lit("*"), cohort=pl.lit("*"), metric=pl.lit("bi_pooled_mean")
    )
    block = R.corrected_block("contextbias", "ContextBias", pl.concat([table, mean]),
                              READER_HEADLINES, scope=READER_SCOPE)  # fmt: skip
    row = block.table.filter(pl.col("metric") == "bi_pooled_mean").row(0, named=True)
    assert row["naive_rank"] is None and row["corrected"] == pytest.approx(0.3)
    assert row["corrected_excludes_null"] is True
    # the caption says how they are formed and resampled, and their measured coverage
    from stereolens.contextbias.report import READER_CAPTION

    text = R.caption(READER_CAPTION)
    assert "cohort means (dimension '*') and overall value (cohort '*')" in text
    assert "95.0% and a cohort mean 95.7% of 1,000 datasets" in text


def test_contextbias_role_cohort_rows_rank_within_their_role_and_cohort():
    # role-level BI's summary rows (metric bi, dimension "*"; cohort "*" overall): the scope
    # names the role and the cohort, so a and b rank per role x cohort, apart from the
    # pooled rows. nurse people: a 0.1 -> 0.3, b 0.2 -> 0.2 (rank flag); nurse overall and
    # pilot people: nothing changes.
    from stereolens.contextbias.report import READER_HEADLINES, READER_SCOPE

    base = _cb_corrected().with_columns(pl.lit(None, pl.String).alias("label")).row(0, named=True)
    rows = [
        {**base, "model": m, "role": r, "cohort": c, "dimension": "*", "metric": metric,
         "naive": n, "naive_low": n - 0.05, "naive_high": n + 0.05, "corrected": k,
         "estimate_bc": k, "ci_low": k - 0.05, "ci_high": k + 0.05, "k": None}
        for m, r, c, n, k, metric in (
            ("a", "nurse", "people", 0.1, 0.3, "bi"), ("b", "nurse", "people", 0.2, 0.2, "bi"),
            ("a", "nurse", "*", 0.25, 0.25, "bi"), ("b", "nurse", "*", 0.35, 0.35, "bi"),
            ("a", "pilot", "people", 0.4, 0.4, "bi"), ("b", "pilot", "people", 0.5, 0.5, "bi"),
            ("a", "*", "people", 0.5, 0.5, "bi_pooled"),
            ("b", "*", "people", 0.1, 0.1, "bi_pooled"),
        )
    ]  # fmt: skip
    table = pl.DataFrame(rows, schema=_cb_corrected().schema | {"label": pl.String})
    block = R.corrected_block("contextbias", "ContextBias", table, READER_HEADLINES,
                              scope=READER_SCOPE)  # fmt: skip
    got = {(r["model"], r["metric"], r["scope"]): r for r in block.table.iter_rows(named=True)}
    assert got[("a", "bi", "CF · nurse · people · *")]["rank_flag"] == "rank 1 -> 2 of 2"
    assert got[("b", "bi", "CF · nurse · people · *")]["rank_flag"] == "rank 2 -> 1 of 2"
    assert got[("a", "bi", "CF · nurse · * · *")]["rank_flag"] is None
    assert got[("a", "bi", "CF · pilot · people · *")]["naive_rank"] == 1
    assert got[("b", "bi_pooled", "CF · * · people · *")]["naive_rank"] == 1
    assert block.table.height == 8
    # the caption says how they are resampled, and their measured coverage
    from stereolens.contextbias.report import READER_CAPTION

    assert "with a role's cohort means (dimension '*') and overall value" in READER_CAPTION
    assert "94.8% and 94.7% of 1,000 datasets" in READER_CAPTION


def test_the_caption_says_biasig_draws_a_persons_attributes_together():
    # biasig.corrected resamples a unit x person's gender, race and age with one draw of its
    # images; the caption says so, and S_imp's rule over the whole row (100 labels a cell,
    # 225 x 100 over an attribute's cells: the paper's 214 implicit subjects), else 400 a cell
    from stereolens.biasig.report import READER_CAPTION

    text = R.caption(READER_CAPTION)
    assert "person's gender, race and age resampled together" in text
    assert "'The joint draw'" in text
    assert (
        "S_imp's from 100 labels in every implicit unit x person x attribute and 22,500 over "
        "each attribute's cells (at the paper's 214 implicit subjects of 200 images, 100 a "
        "subject covered"
    ) in text
    assert "or 400 in every cell; eta's from its own minimum" in text
    # S_exp over all attributes: its own measured minimum (biasig.formulas)
    assert "S_exp's interval is printed from 100 labels a cell" in text
    assert "a side's gender, race and age with one draw of its images at each" in text


def test_biasig_s_exp_withheld_names_its_own_minimum():
    # an S_exp '*' row below biasig.formulas.SCORE_MIN_HUMAN_RELIABLE: its note names that
    # minimum; an S_imp one names S_imp's rule over the whole row (biasig.corrected.score_reliable)
    from stereolens.biasig.formulas import SCORE_MIN_HUMAN_RELIABLE
    from stereolens.biasig.report import READER_HEADLINES

    rows = _bg_corrected().filter(pl.col("protected_attribute") == "*")
    rows = pl.concat([rows, rows.with_columns(metric=pl.lit("s_exp"))]).with_columns(
        interval_reliable=pl.col("variant") == "v1"
    )
    table = R.headline_table(rows, READER_HEADLINES, unit="variant")
    notes = {(r["metric"], r["model"]): r["interval_note"] for r in table.iter_rows(named=True)}
    minimum = SCORE_MIN_HUMAN_RELIABLE[("s_exp", "*")]
    assert notes[("s_exp", "v1")] is None and notes[("s_imp", "v1")] is None
    assert notes[("s_exp", "v2")] == (
        f"interval withheld: S_exp's corrected interval over all attributes is printed from "
        f"{minimum:,} human labels per cell, its own measured minimum (biasig.formulas."
        "SCORE_MIN_HUMAN_RELIABLE; bench/COVERAGE.md, 'BiasIG's printing rule')"
    )
    assert notes[("s_imp", "v2")].startswith(
        "interval withheld: S_imp's corrected interval is printed from 100 human labels in "
        "every implicit unit x person x attribute and 22,500 over each attribute's cells (the "
        "paper's 214 implicit subjects x 100: "
    )
    assert notes[("s_imp", "v2")].endswith(
        "of 1,000 datasets), or 400 in every cell (biasig.formulas.SCORE_AGGREGATE_MIN_LABELLED;"
        " bench/COVERAGE.md, 'Reader correction: BiasIG S_imp at the paper's design')"
    )


def test_the_corrected_value_shown_lies_in_its_interval():
    # the demo's LVLM term row: the plug-in 8.33 outside its bc-normal interval [0.00, 6.51]
    # (centred on estimate_bc = 2 x 8.33 - the replicates' mean, clipped at 0); the block
    # shows estimate_bc, the interval's centre, and keeps the plug-in as corrected_plugin
    row = {
        "model": "m", "setting": "s", "axis": "gender", "metric": "term", "naive": 3.0,
        "naive_low": 1.0, "naive_high": 5.0, "corrected": 8.33, "estimate_bc": 2.9,
        "ci_low": 0.0, "ci_high": 6.51, "off_simplex": False, "n_human": 500,
        "n_items": 900, "interval_reliable": True,
    }  # fmt: skip
    block = R.corrected_block("lvlm", "LVLM", pl.DataFrame([row]),
                              {"term": R.Headline("term TVD x100", 0.0)},
                              scope=("setting", "axis"), digits=2)  # fmt: skip
    got = block.table.row(0, named=True)
    assert got["ci_low"] <= got["corrected"] <= got["ci_high"]
    assert (got["corrected"], got["corrected_plugin"]) == (2.9, 8.33)
    assert block.rows[0]["corrected"] == "2.90 [0.00, 6.51]"
    for r in block.table.iter_rows(named=True):  # every shown value in its interval
        assert r["ci_low"] <= r["corrected"] <= r["ci_high"]


def test_intervals_below_the_measured_minimum_are_withheld():
    from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE

    # a (nurse / gender): naive excludes 0, corrected does not, and a and b swap ranks; with
    # a's interval not reliable (10 human labels) neither flag may fire, for a or for b
    t = _cb_corrected().with_columns(
        interval_reliable=pl.col("model") != "a",
        estimate_bc=pl.col("corrected") + 0.01,
    )
    block = R.corrected_block("contextbias", "ContextBias", t, {"bi": R.Headline("BI", 0.0)},
                              scope=("condition", "role", "dimension"))  # fmt: skip
    rows = {(r["model"], r["scope"]): r for r in block.table.iter_rows(named=True)}
    a = rows[("a", "CF · nurse · gender_presentation")]
    assert a["ci_low"] is None and a["ci_high"] is None and not a["interval_reliable"]
    assert a["corrected"] == pytest.approx(0.13)  # the estimate is still shown
    assert a["significance_flag"] is None and a["corrected_excludes_null"] is None
    assert a["corrected_rank"] is None and a["rank_flag"] is None
    assert rows[("b", "CF · nurse · gender_presentation")]["rank_flag"] is None
    assert block.flags == [] and block.withheld == 3
    note = (
        f"interval withheld: 10 human labels, coverage measured from "
        f"{MIN_HUMAN_RELIABLE:,} per cell"
    )
    assert a["interval_note"] == note
    shown = {(r["model"], r["scope"]): r for r in block.rows}
    # the note under the value, left-aligned and wrapped (report.css small.note)
    assert shown[("a", "CF · nurse · gender_presentation")]["corrected"] == "0.130"
    assert shown[("a", "CF · nurse · gender_presentation")]["corrected_note"] == note
    assert shown[("b", "CF · nurse · gender_presentation")]["corrected_note"] is None
    # a table written before interval_reliable existed: n_human against the minimum
    bi = {"bi": R.Headline("BI", 0.0)}
    older = _cb_corrected().drop("interval_reliable")
    old = R.corrected_block("contextbias", "ContextBias", older, bi, scope=("role", "dimension"))
    assert old.withheld == 5 and old.flags == []
    many = older.with_columns(n_human=MIN_HUMAN_RELIABLE)
    again = R.corrected_block("contextbias", "ContextBias", many, bi, scope=("role", "dimension"))
    assert again.withheld == 0


def test_labels_to_collect_by_hand():
    # width 0.05 at share 0.5: (0.05 / 3.92)^2 - 0.25 / 20,000 = 1.502e-4; 0.136 / that
    n, floor = RP.labels_needed(20_000, 0.136)
    assert n == 906 and floor == 2
    plan = RP.plan_block("biasig", "BiasIG", n_items=20_000, what="image positions").plan
    assert plan.startswith("The numbers assume a perfect reader")
    assert "collect 906 human labels of the 20,000 image positions" in plan
    assert "a disagreement rate of 0.136 assumed" in plan
    # 600 strata x 2 labels each outweigh the 906
    many = RP.plan_block("contextbias", "ContextBias", n_items=20_000, what="images",
                        n_strata=600, disagreement=0.05, audit="extraction audit").plan  # fmt: skip
    assert "collect 1,200 human labels" in many
    assert "extraction audit's disagreement rate 0.050" in many
    # too few items for the width: says so
    few = RP.plan_block("lvlm", "LVLM", n_items=6, what="story and term responses").plan
    assert "with 6 story and term responses no number of human labels narrows" in few
    assert "at least 2 (the correction's minimum)" in few


def test_the_plan_count_is_the_planners():
    """Without human labels a benchmark with a reader design reports the count
    `stereolens plan` prints (stereolens.plan.reader_plan / format_reader), not one of its
    own."""
    from stereolens.biasig import report as bg_report
    from stereolens.contextbias import report as cb_report
    from stereolens.plan import format_reader, reader_plan

    config, _ = load_config("config/demo.yaml")
    inputs = Inputs.from_frames(_inputs(with_corrected=False))
    for width, reachable in ((0.6, True), (0.05, False)):  # the demo's 0.05: not reachable
        for key in ("contextbias", "biasig"):
            config[key]["reader_correction"]["simulate"] = False
            config[key]["reader_sample"]["target_width"] = width
        parts = {p["benchmark"]: p for p in reader_plan(config)}
        printed = format_reader(list(parts.values()))
        for mod in (cb_report, bg_report):
            part = parts[mod.KEY]
            plan = mod.reader_correction(inputs, config).plan
            assert "as `stereolens plan` prints it" in plan
            assert (part["n_human"] is not None) is reachable
            for r in part["rows"]:
                if reachable:
                    assert f"{r['model']}: {r['n_human']:,} human labels" in printed
                    assert f"{r['model']} {r['n_human']:,} of {r['n_items']:,}" in plan
                else:
                    assert f"{r['model']} not reachable (all {r['n_items']:,}" in plan
            if reachable:
                assert f"collect {part['n_human']:,} human labels of the" in plan
                total = f"- all models: {part['n_human']:,} human labels"
                assert total in printed or len(part["rows"]) == 1
            else:
                assert "no number of human labels reaches the width" in plan
            # the demo's cells hold a few images each: none reaches its printing minimum
            assert part["n_printable"] == sum(r["n_items"] for r in part["rows"])
            assert all(r["cells_short"] == r["strata"] for r in part["rows"])
            assert f": {part['n_printable']:,} in all, but no cell" in plan
            assert "every headline row's corrected interval will be withheld" in plan
            assert f"recommends the width's count, {part['n_recommended']:,}." in plan
    # the LVLM's design (lvlm.reader_sample): the planner's count, a term item a judged pair
    # (the demo: 6 terms x 2 rounds x 1 gender pair)
    lvlm = RP.plan_block("lvlm", "LVLM", n_items=6, what="story and term responses",
                        planned=RP.planner_part(config, "lvlm")).plan  # fmt: skip
    assert "as `stereolens plan` prints it" in lvlm
    assert "tiny-vlm, term (term pairs) not reachable (all 12 give" in lvlm
    # without the run's config the planner names no models: the report's own estimate
    own = RP.plan_block("lvlm", "LVLM", n_items=6, what="story and term responses").plan
    assert "`stereolens plan` prints no count for it here" in own


def test_audit_disagreement_is_the_worst_pooled_error():
    rates = pl.DataFrame(
        {
            "extractor": ["e1", "e1", "e2", "e2"],
            "grouping": ["g"] * 4,
            "group": ["f", "m"] * 2,
            "n_items": [50, 50, 100, 100],
            "n_correct": [45, 40, 98, 96],
        }
    )
    assert RP.audit_disagreement(rates) == pytest.approx(0.15)  # e1: 1 - 85 / 100
    assert RP.audit_disagreement(None) is None


def _inputs(with_corrected: bool, simulated: bool = True) -> dict[str, pl.DataFrame]:
    cb = _contextbias_tables(models=("a", "b"))
    bg = _biasig_tables(models=("v1", "v2"))
    lv = _lvlm_tables()
    frames = {
        **cb, "biasig_implicit": bg["implicit"], "biasig_explicit": bg["explicit"],
        "biasig_eta": bg["eta"], "biasig_answers": bg["answers"],
        "lvlm_scores": lv["scores"], "lvlm_refusals": lv["refusals"],
        "lvlm_story_skew": lv["story_skew"], "lvlm_exam_accuracy": lv["exam_accuracy"],
        "lvlm_responses": lv["responses"],
    }  # fmt: skip
    if with_corrected:
        frames["contextbias_corrected"] = _cb_corrected()
        frames["biasig_corrected"] = _bg_corrected()
        if simulated:
            frames["contextbias_human_labels_simulated"] = pl.DataFrame({"simulated": [True]})
    return frames


def test_first_screen_shows_naive_beside_corrected_and_the_plan(tmp_path):
    frames = _inputs(with_corrected=True)
    # BiasIG v2's corrected interval rests on too few human labels: withheld
    frames["biasig_corrected"] = frames["biasig_corrected"].with_columns(
        interval_reliable=pl.col("variant") == "v1"
    )
    report = build_report(Inputs.from_frames(frames), report_config({}), galleries=False)
    blocks = {b.key: b for b in report.summary.reader}
    assert blocks["contextbias"].simulated and not blocks["biasig"].simulated
    assert blocks["lvlm"].plan is not None and blocks["lvlm"].table is None
    ids = [s.id for s in report.sections]
    assert "reader-correction" in ids
    paths = {}
    for name, frame in frames.items():
        paths[name] = tmp_path / "in" / f"{name}.parquet"
        paths[name].parent.mkdir(exist_ok=True)
        frame.write_parquet(paths[name])
    out = tmp_path / "report" / "index.html"
    render_report(report_config({"run_label": "reader block"}), paths, out, galleries=False)
    text = out.read_text()
    first = text[: text.index('id="contents"')]
    for needle in ("The reader's errors: naive and corrected", "simulated human labels",
                   "40 human-labelled items of the 160 the reader read went in",
                   "2 conclusions change under the correction",
                   "naive interval excludes 0, corrected does not", "rank 2 -&gt; 1 of 2",
                   "0.300 [0.100, 0.500]", "0.120 [0.000, 0.300]",
                   "No conclusion changes under the correction",
                   "The numbers assume a perfect reader", "How many human labels",
                   "Correcting for the reader",
                   "<b>1 of 2 corrected intervals withheld</b>: too few human labels",
                   "No conclusion changes under the correction among the rows whose "
                   "corrected interval is printed", '0.790<small class="note">interval '
                   "withheld: S_imp&#39;s corrected interval is printed from 100 human labels",
                   "The interval is printed only where every cell of the row has 400 or "
                   "more human labels"):  # fmt: skip
        assert needle in first, needle
    # each benchmark's formulas and measured coverage in a line under its own table, once
    for line in ("ContextBias: BI = 1 - H(p)/log K", "BiasIG: S_imp (paper 000 Eq. 1-2)"):
        assert first.count(line) == 1, line
        assert first.index(line) < first.index("The interval is printed only where"), line
    assert "LVLM: story and term scores" not in first  # LVLM has no labels: its plan shows
    assert "or 400 in every cell; eta&#39;s from its own minimum" in first
    csv = pl.read_csv(out.parent / "tables/reader-contextbias.csv")
    assert csv.height == 5 and csv["significance_flag"].drop_nulls().len() == 1
    for href in re.findall(r'href="(tables/[^"]+)"', text):
        assert (out.parent / href).is_file(), href


def test_an_older_results_folder_renders_with_the_perfect_reader_sentence(tmp_path):
    frames = _inputs(with_corrected=False)
    paths = {}
    for name, frame in frames.items():
        paths[name] = tmp_path / f"{name}.parquet"
        frame.write_parquet(paths[name])
    out = tmp_path / "report" / "index.html"
    render_report(report_config({}), paths, out, galleries=False)
    text = out.read_text()
    assert text.count("The numbers assume a perfect reader") == 3
    assert "reader-correction" not in text  # no corrected table: no section
    # ContextBias: 2 models x 1 role x 3 conditions x 5 ok images = 30 images, 6 strata
    assert "with 30 images no number of human labels" in text
    assert "at least 12 (the correction&#39;s minimum, 2 in each of its 6 strata)" in text


def test_the_workflow_hands_the_report_its_corrected_tables():
    config, _ = load_config("config/demo.yaml")
    from stereolens.benchmark import benchmarks

    for plugin in benchmarks():
        if plugin.name not in ("contextbias", "biasig", "lvlm"):
            continue
        tables = plugin.report_tables(config)
        assert f"{plugin.name}_corrected" in tables  # the demo simulates
        assert f"{plugin.name}_human_labels_simulated" in tables
        section = {**config[plugin.name], "reader_correction": {
            **config[plugin.name]["reader_correction"], "simulate": False}}  # fmt: skip
        plain = plugin.report_tables({**config, plugin.name: section})
        assert f"{plugin.name}_corrected" not in plain
        assert f"{plugin.name}_human_labels_simulated" not in plain


def test_the_simulated_mark_follows_the_config_then_the_folder():
    marker = Inputs.from_frames({"biasig_human_labels_simulated": pl.DataFrame({"x": [1]})})
    empty = Inputs.from_frames({})

    def cfg(**rc):
        return {"biasig": {"reader_correction": {"simulate": False, "human_labels": None, **rc}}}

    assert R.simulated(empty, cfg(simulate=True), "biasig")  # the run simulated
    assert R.simulated(marker, cfg(), "biasig")  # a results folder holding simulated labels
    assert not R.simulated(empty, cfg(), "biasig")
    # real labels configured: a simulated table left in the folder does not mark them
    assert not R.simulated(marker, cfg(human_labels="labels.parquet"), "biasig")


def test_a_row_the_benchmark_withholds_says_why():
    """A row the benchmark marks with a withheld_reason (a benchmark whose coverage for a
    row was measured short; the LVLM's race term was one until its double-bootstrap
    interval) shows that reason, not the size rule's, even with more human labels than the
    minimum; a row without one is printed."""
    from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE

    short = "the interval covered 91.4% of 1,000 datasets: below 93%"

    rows = []
    for axis, reliable, reason in (
        ("gender", True, None),
        ("race", False, short),
    ):
        rows.append(
            {
                "model": "m", "setting": "image", "axis": axis, "metric": "term",
                "naive": 12.0, "naive_low": 8.0, "naive_high": 16.0, "corrected": 10.0,
                "estimate_bc": 10.0, "ci_low": 5.0, "ci_high": 15.0, "off_simplex": False,
                "n_human": MIN_HUMAN_RELIABLE * 2, "n_items": 4000,
                "interval_reliable": reliable, "withheld_reason": reason,
            }
        )  # fmt: skip
    block = R.corrected_block("lvlm", "LVLM", pl.DataFrame(rows),
                              {"term": R.Headline("term TVD x100", 0.0)},
                              scope=("setting", "axis"))  # fmt: skip
    got = {r["scope"]: r for r in block.table.iter_rows(named=True)}
    race, gender = got["image · race"], got["image · gender"]
    assert race["interval_note"] == f"interval withheld: {short}"
    assert race["ci_low"] is None and race["rank_flag"] is None
    assert gender["interval_note"] is None and gender["ci_low"] == pytest.approx(5.0)
    assert block.withheld == 1


def test_contextbias_role_mean_rows_rank_per_metric_and_cohort():
    # the mean over roles (bi_role, bi_role_mm; role "*"): shown beside bi, ranked within
    # their own metric x scope. people: a 0.1 -> 0.3, b 0.2 -> 0.2 (rank flag) on bi_role;
    # bi_role_mm: a 0.05 -> 0.05, b 0.15 -> 0.15, nothing changes.
    from stereolens.contextbias.report import READER_HEADLINES, READER_SCOPE

    base = _cb_corrected().with_columns(pl.lit(None, pl.String).alias("label")).row(0, named=True)
    rows = [
        {**base, "model": m, "role": "*", "cohort": "people", "dimension": "*",
         "metric": metric, "naive": n, "naive_low": n - 0.05, "naive_high": n + 0.05,
         "corrected": k, "estimate_bc": k, "ci_low": k - 0.04, "ci_high": k + 0.05, "k": None}
        for m, n, k, metric in (("a", 0.1, 0.3, "bi_role"), ("b", 0.2, 0.2, "bi_role"),
                                ("a", 0.05, 0.05, "bi_role_mm"), ("b", 0.15, 0.15, "bi_role_mm"))
    ]  # fmt: skip
    table = pl.DataFrame(rows, schema=_cb_corrected().schema | {"label": pl.String})
    table = pl.concat([_cb_corrected().with_columns(pl.lit(None, pl.String).alias("label")),
                       table])  # fmt: skip
    block = R.corrected_block("contextbias", "ContextBias", table, READER_HEADLINES,
                              scope=READER_SCOPE)  # fmt: skip
    got = {(r["model"], r["metric"], r["scope"]): r for r in block.table.iter_rows(named=True)}
    assert got[("a", "bi_role", "CF · * · people · *")]["rank_flag"] == "rank 1 -> 2 of 2"
    assert got[("b", "bi_role", "CF · * · people · *")]["rank_flag"] == "rank 2 -> 1 of 2"
    assert got[("a", "bi_role_mm", "CF · * · people · *")]["rank_flag"] is None
    assert got[("a", "bi_role", "CF · * · people · *")]["label"] == "mean BI over roles"
    assert got[("b", "bi_role_mm", "CF · * · people · *")]["label"] == (
        "mean Miller-Madow BI over roles"
    )
    assert block.table.filter(pl.col("metric") == "bi").height == 5
    # the caption names them, their measured coverage, and why role_matched has no row
    from stereolens.contextbias.report import READER_CAPTION

    text = R.caption(READER_CAPTION)
    assert "its mean over roles and that of its Miller-Madow value" in text
    assert "94.4-94.9% of 1,000 datasets at 400 human labels per role, 94.0-94.7% at 1,000" in text
    # their mean over generators (model '*'), Miller-Madow's with its interval normal
    assert "model '*', not ranked: 93.3-94.2% at 400, 94.9-95.6% at 1,000" in text
    assert "its interval centred at its own value" in text  # Miller-Madow: interval normal
    assert "'role_matched' has no corrected row" in text
