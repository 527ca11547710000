"""The report (stereolens.report): every section renders every valid table, the summary's
profile, galleries, the page's building blocks, and the whole render on edge tables.

The demo's tiny models give other numbers on other CPUs, so the report is tested on edge
tables built here: intervals that exclude the point estimate, nulls, NaN, a single model,
a single role, and empty sections. The browser checks are in tests/test_report_browser.py.
"""

import json
import math
from dataclasses import replace

import numpy as np
import polars as pl
import pytest
from PIL import Image

from stereolens.biasig import report as RB
from stereolens.contextbias import bootstrap as CB
from stereolens.contextbias import ccs as CC
from stereolens.contextbias import report as RC
from stereolens.contextbias import report_studies as RCS
from stereolens.contextbias import robustness as CR
from stereolens.contextbias.metrics import bi_table
from stereolens.contextbias.settings import ContextBiasSettings
from stereolens.lvlm import report as RL
from stereolens.lvlm.metrics import compute_all
from stereolens.lvlm.settings import LVLMSettings
from stereolens.report import run as RR
from stereolens.report.galleries import GallerySettings, draw, write_galleries
from stereolens.report.html import Table, csv_ready, format_interval, render_sections
from stereolens.report.inputs import Inputs
from stereolens.report.render import build_report, render_report
from stereolens.report.summary import profile_view

# ---------------------------------------------------------------- edge tables

DRAWS_2 = replace(ContextBiasSettings.preset(), matched_draws=2)


def _attributes(roles=("nurse",), models=("m",)):
    rng = np.random.default_rng(0)
    rows, imgs = [], []
    for m in models:
        for role in roles:
            for cond in ("CF", "CA-R", "CA-U"):
                for i in range(6):
                    iid = f"{m}{role}{cond}{i}"
                    base = {"model": m, "role": role, "condition": cond, "image_id": iid}
                    imgs.append(
                        {
                            **base,
                            "prompt_id": f"p-{role}-{cond}",
                            "seed": i,
                            "image_path": f"img/{iid}.png",
                            "status": "ok" if i else "discarded",
                            "reason": None if i else "no valid answer",
                        }
                    )
                    if not i:  # a discarded image has no attributes
                        continue
                    g = "female" if rng.random() < 0.7 else "male"
                    rows.append(
                        {**base, "cohort": "people", "dimension": "gender_presentation", "label": g}
                    )
                    rows.append(
                        {**base, "cohort": "camera", "dimension": "framing", "label": "wide"}
                    )
    return pl.DataFrame(rows), pl.DataFrame(imgs)


def _contextbias_tables(roles=("nurse",), models=("m",)):
    att, img = _attributes(roles, models)
    ccs = CC.ccs_table(att, img)
    return {
        "bi": bi_table(att, img, settings=DRAWS_2),
        "ccs": ccs,
        "ccs_mean": CC.ccs_mean(ccs),
        "robustness": CR.robustness_summary(CR.robustness_tests(att, img)),
        "bootstrap": CB.cluster_bootstrap(att, replicates=20),
        "images": img,
        "attributes": att,
    }


def _excluding(frame: pl.DataFrame, est: str, lo: str, hi: str) -> pl.DataFrame:
    """Intervals wholly above the estimate on even rows, wholly below on odd rows."""
    shift = pl.when(pl.int_range(pl.len()) % 2 == 0).then(0.2).otherwise(-0.2)
    return frame.with_columns(
        (pl.col(est) + shift - 0.05).alias(lo), (pl.col(est) + shift + 0.05).alias(hi)
    )


def _with_nan(frame: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
    """Every other row of ``cols`` NaN, one row null."""
    return frame.with_columns(
        pl.when(pl.int_range(pl.len()) % 2 == 1)
        .then(float("nan"))
        .when(pl.int_range(pl.len()) == 0)
        .then(None)
        .otherwise(pl.col(c))
        .alias(c)
        for c in cols
    )


def _html(sections) -> str:
    out = render_sections(sections)
    assert "<section" in out
    return out


CONFIG = {"contextbias": {"metrics": {}}, "lvlm": {"metrics": {}}}


# ---------------------------------------------------------------- ContextBias


@pytest.mark.parametrize("case", ["plain", "single_model_role", "many", "empty"])
def test_contextbias_sections_render(case):
    if case == "many":
        t = _contextbias_tables(roles=("nurse", "pilot", "chef"), models=("m1", "m2"))
    else:
        t = _contextbias_tables()
    if case == "empty":
        t = {k: v.clear() for k, v in t.items()}
    out = _html(RC.sections(Inputs.from_frames(t), CONFIG))
    assert "Bias Intensity" in out or "no BI" in out
    variants = (
        {**t, "bi": _with_nan(t["bi"], ["bi"])},
        {**t, "bootstrap": _excluding(t["bootstrap"], "estimate", "ci_low", "ci_high")},
        {**t, "bootstrap": _with_nan(t["bootstrap"], ["estimate", "ci_low", "ci_high"])},
        {**t, "ccs_mean": _with_nan(t["ccs_mean"], ["ccs_mean"])},
        {**t, "ccs": _with_nan(t["ccs"], ["ccs", "p", "chi2"])},
    )
    for tables in variants:
        _html(RC.sections(Inputs.from_frames(tables), CONFIG))
        RC.profile(Inputs.from_frames(tables), CONFIG)
    if case != "empty":
        assert "<img" in out and "download CSV" in out
        # figures lead the section: the first figure comes before the first table
        assert out.index("<figure") < out.index('class="table-block"')
        for fig in (RC.bi_condition_figure, RC.bi_dimension_figure):
            assert fig(t["bi"]) is not None and fig(_with_nan(t["bi"], ["bi"])) is not None
        assert RC.bootstrap_figure(t["bootstrap"]) is not None
        assert (
            RC.bootstrap_figure(_excluding(t["bootstrap"], "estimate", "ci_low", "ci_high"))
            is not None
        )


def test_contextbias_withheld_intervals_read_as_withheld():
    # _contextbias_tables has 1 role: below the default minimum (10), no interval is printed
    t = _contextbias_tables(models=("m1", "m2"))
    boot = t["bootstrap"]
    assert boot["ci_low"].is_null().all() and boot["interval_note"].is_not_null().all()
    note = boot["interval_note"][0]
    assert note.startswith("withheld: 1 role < 10")
    captions = " ".join(x.caption for x in RC._bootstrap_tables(boot))
    assert f"No 95% interval is printed here: {note}." in captions
    assert note in RC.bootstrap_figure(boot).caption
    prof = RC.profile(Inputs.from_frames(t), {"contextbias": {}})
    shift = prof.filter(pl.col("metric") == "bi_shift").row(0, named=True)
    assert shift["ci_low"] is None and shift["interval_note"] == note
    out = _html(RC.sections(Inputs.from_frames(t), CONFIG))
    assert "withheld: 1 role &lt; 10" in out or "withheld: 1 role < 10" in out
    # with the interval printed the captions say nothing of it
    shown = CB.cluster_bootstrap(t["attributes"], replicates=20, min_roles=1)
    assert shown["interval_note"].is_null().all()
    assert "No 95% interval" not in " ".join(x.caption for x in RC._bootstrap_tables(shown))
    assert "bias-corrected t intervals" in RC.bootstrap_figure(shown).caption


def test_robustness_caption_names_the_computation():
    t = _contextbias_tables()
    assert "released code" in RC._robustness_caption(t["robustness"])
    att, img = _attributes()
    cond = CR.robustness_summary(CR.robustness_tests(att, img, cells="condition"))
    assert "not the paper's Table 3" in RC._robustness_caption(cond)
    assert "People, Objects and Camera" in RC._robustness_caption(t["robustness"])
    every = CR.robustness_summary(CR.robustness_tests(att, img), all_cohorts="all")
    assert "Scene included" in RC._robustness_caption(every)


def test_ccs_captions_name_the_consistency_rule():
    inputs = Inputs.from_frames(_contextbias_tables())
    default = " ".join(t.caption for t in RC._ccs_tables(inputs))
    assert "at least 5 occurrences, p > 0.05 and range <= 5 pp" in default
    paper = " ".join(t.caption for t in RC._ccs_tables(inputs, {"consistency": "paper"}))
    assert "at least 5" not in paper and "p > 0.05 and range <= 5 pp" in paper


def test_contextbias_profile_is_the_bootstrap_row_and_the_invariant_share():
    t = _contextbias_tables(models=("m1", "m2"))
    prof = RC.profile(Inputs.from_frames(t), {"contextbias": {}})
    shift = prof.filter((pl.col("metric") == "bi_shift") & (pl.col("model") == "m1")).row(
        0, named=True
    )
    boot = t["bootstrap"].filter(
        (pl.col("model") == "m1")
        & (pl.col("cohort") == "*")
        & (pl.col("dimension") == "*")
        & (pl.col("comparison") == "CA-U - CF")
    )
    assert shift["estimate"] == boot["estimate"][0] and shift["ci_low"] == boot["ci_low"][0]
    # invariant share: consistent / defined pairs of contextbias.invariant (by hand in
    # tests/test_contextbias_invariant.py), its interval withheld under interval_min_roles
    ccs = pl.DataFrame(
        {"model": ["m"] * 4, "role": ["a", "a", "b", "c"],
         "consistent": [True, False, False, None]},
        schema={"model": pl.String, "role": pl.String, "consistent": pl.Boolean},
    )  # fmt: skip
    share = RC.profile(Inputs.from_frames({"ccs": ccs}), {}).row(0, named=True)
    assert share["metric"] == "invariant_pct" and share["n"] == 3
    assert share["estimate"] == pytest.approx(100 / 3)
    assert share["ci_low"] is None and share["ci_high"] is None
    assert share["interval_note"].startswith("withheld: 2 roles < 10")
    small = {"contextbias": {"metrics": {"interval_min_roles": 2}}}
    share = RC.profile(Inputs.from_frames({"ccs": ccs}), small).row(0, named=True)
    assert share["interval_note"] is None
    # k 1, 0 of n 2, 1: residuals 1/3, -1/3, cluster variance 2 x 2/9 / 9 = 0.04938 over
    # binomial (2/9) / 3 = 0.07407: deff 1 (floor), Wilson 1 of 3 (statsmodels)
    assert share["ci_low"] == pytest.approx(6.149, abs=1e-3)


# ---------------------------------------------------------------- BiasIG


def _biasig_tables(models=("m",)):
    from stereolens.biasig.metrics import compute_metrics
    from stereolens.biasig.prompts import load_prompts

    prompts = load_prompts()
    ids = prompts.filter(
        (pl.col("acquired_attribute").is_in(["Nurse", "rich", "poor"]))
        & (pl.col("variant_index") == 0)
    )["prompt_id"].to_list()
    rng = np.random.default_rng(1)
    rows = []
    for m in models:
        for p in ids:
            for i in range(3):
                rows.append(
                    {
                        "model": m,
                        "variant": m,
                        "prompt_id": p,
                        "image_id": f"{m}{p}{i}",
                        "position": "single",
                        "gender": rng.choice(["male", "female"]),
                        "race": rng.choice(["White", "Black"]),
                        "age": rng.choice(["young", "elderly"]),
                        "status": "ok",
                        "reason": None,
                        "attempts": 1,
                    }
                )
    answers = pl.DataFrame(rows)
    out = compute_metrics(answers.drop("variant"), prompts, replicates=20, ceiling_draws=10)
    out["answers"] = answers
    out["prompts"] = prompts.filter(pl.col("prompt_id").is_in(ids))
    return out


def _biasig_inputs(imp, exp, eta, **extra):
    return Inputs.from_frames(
        {"biasig_implicit": imp, "biasig_explicit": exp, "biasig_eta": eta, **extra}
    )


def test_variant_deltas_are_variant_minus_base():
    def imp(variant, g, r):
        return [
            {"variant": variant, "model": "m", "level": "model", "protected_attribute": a,
             "score": v}
            for a, v in (("gender", g), ("race", r))
        ]  # fmt: skip

    implicit = pl.DataFrame(imp("m", 0.80, 0.70) + imp("m-fair", 0.90, 0.65))
    explicit = pl.DataFrame(
        [
            {"variant": v, "model": "m", "level": "model", "protected_attribute": "gender",
             "protected_value": "*", "score": s}
            for v, s in (("m", 0.5), ("m-fair", 0.6))
        ]
    )  # fmt: skip
    eta = pl.DataFrame(
        [
            {"variant": v, "model": "m", "pair": "*", "eta_total": t, "eta_gender": t,
             "eta_race": 0.5, "eta_age": 0.5}
            for v, t in (("m", 0.6), ("m-fair", 0.55))
        ]
    )  # fmt: skip
    d = RB.variant_deltas(implicit, explicit, eta)
    assert set(d["variant"]) == {"m-fair"}
    change = {(r["metric"], r["protected_attribute"]): r["change"] for r in d.iter_rows(named=True)}
    assert change[("S_imp", "gender")] == pytest.approx(0.10)
    assert change[("S_imp", "race")] == pytest.approx(-0.05)  # a side effect on race
    assert change[("S_exp", "gender")] == pytest.approx(0.10)
    assert change[("eta", "*")] == pytest.approx(-0.05)
    assert change[("eta", "race")] == pytest.approx(0.0)


@pytest.mark.parametrize("case", ["plain", "two_models", "excluding", "nan", "empty"])
def test_biasig_sections_render(case):
    t = _biasig_tables(("m", "m2") if case == "two_models" else ("m",))
    imp, exp, eta = t["implicit"], t["explicit"], t["eta"]
    if case == "excluding":
        imp = _excluding(imp, "score", "ci_low", "ci_high")
        exp = _excluding(exp, "score", "ci_low", "ci_high")
        eta = _excluding(eta, "eta_total", "ci_low", "ci_high")
    elif case == "nan":
        imp = _with_nan(imp, ["score", "ci_low", "ci_high", "ceiling"])
        exp = _with_nan(exp, ["score", "ci_low", "ci_high"])
        eta = _with_nan(eta, ["eta_total", "ci_low", "ci_high"])
    elif case == "empty":
        imp, exp, eta = imp.clear(), exp.clear(), eta.clear()
    inputs = _biasig_inputs(imp, exp, eta)
    out = _html(RB.sections(inputs, {}))
    assert "BiasIG" in out
    prof = RB.profile(inputs, {})
    if case != "empty":
        assert "<img" in out and "S_imp_ceiling" in out
        assert set(prof["metric"]) == {"S_imp", "S_exp", "eta"}
        assert prof.filter(pl.col("metric") == "S_imp")["floor_label"].to_list()[0] == "ceiling"
        # unresolved eta pairs are counted in the caption, not shown as rows
        if (eta["status"] == "unresolved").any():
            assert "unresolved in this run" in out


def test_biasig_figure_draws_intervals_that_exclude_the_estimate():
    # the failure seen on another machine: an interval wholly below its point estimate
    # made matplotlib's error bars refuse negative lengths
    rows = pl.DataFrame(
        {
            "variant": ["a", "b", "c"],
            "S_imp": [0.9, 0.5, None],
            "S_imp_low": [0.7, 0.6, None],
            "S_imp_high": [0.8, 0.7, None],
            "S_exp": [0.4, float("nan"), 0.3],
            "S_exp_low": [0.5, 0.1, float("nan")],
            "S_exp_high": [0.6, 0.2, 0.4],
            "eta": [0.5, 0.55, 0.45],
            "eta_low": [None, 0.6, 0.3],
            "eta_high": [None, 0.7, 0.35],
        }
    )
    assert RB.model_figure(rows).png.startswith(b"\x89PNG")


# ---------------------------------------------------------------- LVLM


def _lvlm_tables():
    rng = np.random.default_rng(2)
    resp, story, terms = [], [], []
    for g in ("female", "male"):
        for i in range(6):
            base = {"model": "v", "setting": "image", "axis": "gender", "group": g}
            iid = f"{g}{i}"
            resp.append(
                {**base, "task": "story", "image_id": iid, "prompt_id": "s", "response": "A tale"}
            )
            resp.append(
                {
                    **base,
                    "task": "exam",
                    "image_id": iid,
                    "prompt_id": "q",
                    "response": "I cannot help with that",
                    "subject": "college_physics",
                    "correct": bool(rng.random() < 0.5),
                }
            )
            story.append(
                {
                    **base,
                    "image_id": iid,
                    "prompt_id": "s",
                    "attribute": "occupation",
                    "value": "nurse" if rng.random() < 0.6 else "pilot",
                }
            )
    for k in range(6):
        terms.append(
            {
                "model": "v",
                "setting": "image",
                "axis": "gender",
                "prompt_id": "t",
                "pair_index": k,
                "group_a": "female",
                "group_b": "male",
                "winner": "female" if k % 3 else "male",
            }
        )
    out = compute_all(
        pl.DataFrame(resp),
        pl.DataFrame(story),
        pl.DataFrame(terms),
        replace(LVLMSettings.preset(), min_count=1, replicates=20, permutations=20),
    )
    out["responses"] = pl.DataFrame(resp).with_columns(
        pl.col("response").str.contains("cannot").alias("refusal"),
        pl.lit("ok").alias("status"),
    )
    out["story_attributes"] = pl.DataFrame(story)
    return out


@pytest.mark.parametrize("case", ["plain", "excluding", "nan", "empty"])
def test_lvlm_sections_render(case):
    t = _lvlm_tables()
    scores, refusals, skew = t["scores"], t["refusals"], t["story_skew"]
    if case == "excluding":
        scores = _excluding(scores, "score", "ci_low", "ci_high")
    elif case == "nan":
        scores = _with_nan(scores, ["score", "ci_low", "ci_high", "null_mean", "null_high"])
        refusals = _with_nan(refusals, ["rate", "ci_low", "ci_high"])
    elif case == "empty":
        scores, refusals, skew = scores.clear(), refusals.clear(), skew.clear()
    config = {"lvlm": {"metrics": {}, "user_images": {"source": "synthetic"}}}
    inputs = Inputs.from_frames(
        {
            "lvlm_scores": scores,
            "lvlm_refusals": refusals,
            "lvlm_story_skew": skew,
            "lvlm_exam_accuracy": t["exam_accuracy"],
        }
    )
    out = _html(RL.sections(inputs, config))
    assert "LVLM" in out
    prof = RL.profile(inputs, config)
    if case in ("plain", "excluding"):
        assert "Noise floor" in out and "p=" in out
        assert set(prof["floor_label"]) == {"null"} and prof["floor"].is_not_null().all()
    floor = RL.noise_floor_table(t["scores"])
    assert floor.height == 1 and all("p=" in c for c in floor.row(0)[2:])


# ---------------------------------------------------------------- validation, canonicalisation


def test_validation_and_canonical_sections_render_edge_tables():
    scores = pl.DataFrame(
        {
            "model": ["m", "m"],
            "kind": ["stated", "stated"],
            "dimension": ["*", "gender_presentation"],
            "n_images": [3, 3],
            "accuracy": [float("nan"), 0.5],
            "recall": [None, 0.5],
            "precision": [0.5, None],
            "f1": [0.5, float("nan")],
            "f1_paper": [0.66, 0.66],
        }
    )
    for frame in (scores, scores.clear(), scores.filter(pl.col("dimension") == "*")):
        render_sections([RCS.validation_section(frame)])
    mapping = pl.DataFrame(
        {
            "dimension": ["items"],
            "decided_by": ["singleton"],
            "raw_label": ["cup"],
            "count": [3],
            "cluster_id": [0],
            "core_label": [None],
        },
        schema_overrides={"core_label": pl.String},
    )
    assert "Canonicalisation" in render_sections([RCS.canonical_section(mapping)])
    assert "off" in render_sections([RCS.canonical_section(mapping.clear())])


# ---------------------------------------------------------------- building blocks


def test_table_cells_intervals_nan_null_and_escaping():
    frame = pl.DataFrame(
        {
            "label": ["<script>alert(1)</script>", "b", None],
            "est": [0.5, float("nan"), None],
            "lo": [0.7, 0.1, None],  # an interval wholly above its estimate
            "hi": [0.8, 0.2, None],
            "tags": [["x", "y"], [], None],
        }
    )
    t = Table("t", "T", "caption", frame, intervals={"est": ("lo", "hi")})
    assert t.columns() == ["label", "est", "tags"]
    rows = t.rows()
    assert rows[0][1].text == "0.500 [0.700, 0.800]" and rows[0][1].sort == 0.5
    assert rows[1][1].text == "NaN [0.100, 0.200]" and rows[1][1].sort is None
    assert rows[2][1].text == "" and rows[0][2].text == "x, y"
    html = render_sections([RC.Section("s", "S", tables=[t])])
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert csv_ready(frame).select("tags").to_series().to_list() == ["x;y", "", None]
    assert format_interval(1.0, None, 2.0) == "1.000"
    # long tables start collapsed; the page shows max_rows of them, the CSV has all
    long = Table("l", "L", "c", pl.DataFrame({"x": list(range(50))}), max_rows=10)
    html = render_sections([RC.Section("s2", "S2", tables=[long])])
    assert "<details" in html and "showing the first 10 of 50 rows" in html
    assert long.csv_frame().height == 50


def test_withheld_intervals_show_their_note_and_old_tables_still_render():
    from stereolens.report.html import withheld_text
    from stereolens.report.summary import profile_frame

    note = (
        "withheld: 2 images per subject < 20 (the smallest size at which the interval covers "
        ">= 93%, bench/COVERAGE.md)"
    )
    assert withheld_text(note) == "interval withheld: 2 images per subject < 20"
    assert withheld_text(note, short=False) == "interval " + note
    assert withheld_text("3 roles") == "interval withheld: 3 roles" and withheld_text(None) == ""
    assert format_interval(0.8124, None, None, note=note) == (
        "0.812 (interval withheld: 2 images per subject < 20)"
    )
    assert format_interval(0.8124, 0.7, 0.9, note=note) == "0.812 [0.700, 0.900]"
    frame = pl.DataFrame(
        {
            "model": ["a", "b"],
            "est": [0.8124, 0.5],
            "lo": [None, 0.4],
            "hi": [None, 0.6],
            "interval_note": [note, None],
        }
    )
    t = Table("w", "W", "caption", frame, intervals={"est": ("lo", "hi")})
    assert t.columns() == ["model", "est"]
    assert [r[1].text for r in t.rows()] == [
        "0.812 (interval withheld: 2 images per subject < 20)",
        "0.500 [0.400, 0.600]",
    ]
    html = render_sections([RC.Section("sw", "SW", tables=[t])])
    assert "Interval withheld: 2 images per subject &lt; 20 (the smallest size" in html
    assert t.csv_frame()["interval_note"].to_list() == [note, None]
    # without intervals the note is an ordinary column
    assert "interval_note" in Table("w2", "W", "c", frame).columns()
    # the profile: a withheld cell says so; rows without the key (older tables) still render
    base = dict(benchmark="biasig", benchmark_title="BiasIG", metric="s_imp", label="S_imp")
    prof = profile_frame(
        [
            {**base, "model": "a", "estimate": 0.8124, "interval_note": note},
            {**base, "model": "b", "estimate": 0.5, "ci_low": 0.4, "ci_high": 0.6},
        ]
    )
    cells = [r["cells"][0] for r in profile_view(prof).blocks[0].rows]
    assert (cells[0].text, cells[0].interval) == (
        "0.812",
        "(interval withheld: 2 images per subject < 20)",
    )
    assert cells[1].interval == "[0.400, 0.600]"
    old = prof.drop("interval_note")
    assert profile_view(old).blocks[0].rows[0]["cells"][0].interval == ""
    # the LVLM Table 2 cells: the score, then the interval or why it is withheld
    scores = pl.DataFrame(
        {
            "model": ["a", "b"],
            "setting": ["image", "image"],
            "task": ["story", "story"],
            "axis": ["gender", "gender"],
            "score": [5.0, 6.0],
            "ci_low": [None, 1.0],
            "ci_high": [None, 9.0],
            "interval_note": ["withheld: 3 images per group < 30 (the smallest size ...)", None],
        }
    )
    assert RL.table2(scores)["story gender"].to_list() == [
        "5.00 (interval withheld: 3 images per group < 30)",
        "6.00 [1.00, 9.00]",
    ]
    assert RL.table2(scores.drop("interval_note"))["story gender"][0] == "5.00"


def test_draw_is_stable_and_per_group():
    frame = pl.DataFrame({"g": ["a"] * 10 + ["b"] * 3, "k": [str(i) for i in range(13)]})
    one = draw(frame, ["g"], "k", 4, seed=1)
    again = draw(frame.reverse(), ["g"], "k", 4, seed=1)
    assert one.sort("k").equals(again.sort("k"))
    assert one.group_by("g").len().sort("g")["len"].to_list() == [4, 3]
    # adding rows to another group leaves a group's draw as it was
    more = pl.concat([frame, pl.DataFrame({"g": ["c"] * 5, "k": [f"c{i}" for i in range(5)]})])
    assert (
        draw(more, ["g"], "k", 4, seed=1).filter(pl.col("g") != "c").sort("k").equals(one.sort("k"))
    )
    assert set(draw(frame, ["g"], "k", 4, seed=2)["k"]) != set(one["k"])


def test_profile_view_one_row_per_model_grouped_by_benchmark():
    cb = _contextbias_tables(models=("m1", "m2"))
    lv = _lvlm_tables()
    inputs = Inputs.from_frames({**cb, "lvlm_scores": lv["scores"]})
    prof = pl.concat([RC.profile(inputs, {}), RL.profile(inputs, {})])
    view = profile_view(prof)
    assert [b.title for b in view.blocks] == ["ContextBias", "LVLM"]
    assert [r["model"] for r in view.blocks[0].rows] == ["m1", "m2"]
    assert [r["model"] for r in view.blocks[1].rows] == ["v"]
    lvlm_cells = view.blocks[1].rows[0]["cells"]
    assert len(lvlm_cells) == len(view.blocks[1].labels) and lvlm_cells[-1] is not None
    assert "null" in lvlm_cells[-1].sub and "p " in lvlm_cells[-1].sub
    # a model in two benchmarks has a row in each, naming the other
    both = pl.concat([prof, prof.filter(pl.col("model") == "v").with_columns(
        pl.lit("m1").alias("model"))])  # fmt: skip
    rows = {(b.title, r["model"]): r for b in profile_view(both).blocks for r in b.rows}
    assert rows[("ContextBias", "m1")]["also"] == ["LVLM"]


def test_models_table_lists_every_role_and_the_tiny_warning(repo_root):
    registry = RR.registry_entries(Inputs({"registry": repo_root / "config/models.yaml"}), {})
    config = {
        "contextbias": {
            "generators": ["sdxl"],
            "extractors": ["gpt-5-mini"],
            "canonicalisation": {"enabled": True, "llm": "gpt-4o-mini", "encoder": "enc"},
        },
        "biasig": {"enabled": True, "generators": ["sd1.5"], "vqa": "internvl-4b-bench"},
        "lvlm": {"enabled": True, "models": ["gpt-5", "tiny-vlm"], "assistant": "qwen3-32b",
                 "refusal_judge": "gpt-4o-mini"},
    }  # fmt: skip
    table = RR.models_table(config, registry)
    roles = dict(zip(table["name"], table["role"], strict=False))
    assert roles["gpt-5"] == "lvlm audited model"
    assert roles["qwen3-32b"].startswith("lvlm assistant")
    assert "lvlm refusal judge" in table["role"].to_list()
    assert "contextbias canonicalisation LLM" in table["role"].to_list()
    assert "contextbias canonicalisation encoder" in table["role"].to_list()
    assert RR.tiny_models(config, registry) == ["tiny-vlm"]
    assert table.filter(pl.col("name") == "tiny-vlm")["weights"][0].startswith("tiny")
    from stereolens.report.summary import tiny_model_warning

    assert "tiny-vlm" in tiny_model_warning(config, ["tiny-vlm"])
    assert tiny_model_warning({}, []) is None
    assert tiny_model_warning({"embedded_default": True}, []) is not None


# ---------------------------------------------------------------- galleries


def _png(path, colour, size=(48, 40)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def test_contextbias_gallery_thumbnails_status_and_attributes(tmp_path):
    t = _contextbias_tables(roles=("nurse", "pilot"))
    for r in t["images"].iter_rows(named=True):
        if r["image_id"] != "mpilotCF3":  # one image file is missing
            _png(tmp_path / r["image_path"], (r["seed"] * 40, 80, 120))
    prompts = pl.DataFrame({"prompt_id": t["images"]["prompt_id"].unique().sort()}).with_columns(
        ("a photo of " + pl.col("prompt_id")).alias("text")
    )
    inputs = Inputs.from_frames({**t, "prompts": prompts}, roots=[tmp_path])
    settings = GallerySettings(thumbnail_px=24, counts={"contextbias_per_set": 3})
    pages = RC.galleries(inputs, {}, settings)
    assert [p.name for p in pages] == ["contextbias-m"]
    groups = pages[0].groups
    assert [g.title for g in groups] == [f"{r} / {c}" for r in ("nurse", "pilot")
                                         for c in ("CF", "CA-R", "CA-U")]  # fmt: skip
    assert all(len(g.cards) == 3 for g in groups)
    counts = write_galleries(pages, tmp_path / "galleries", settings, cache_dir=tmp_path / "c")
    html = (tmp_path / "galleries/contextbias-m.html").read_text()
    assert "a photo of p-nurse-CF" in html and "gender_presentation" in html
    cards = [c for g in groups for c in g.cards]
    discarded = [c for c in cards if c.badge == "discarded"]
    assert all("no valid answer" in c.headline for c in discarded)
    thumbs = list((tmp_path / "galleries/thumbs").glob("*.jpg"))
    assert len(thumbs) == counts["thumbnails"] > 0
    with Image.open(thumbs[0]) as im:
        assert im.format == "JPEG" and max(im.size) <= 24
    drew_missing = any(c.image and "mpilotCF3" in c.image.path for c in cards)
    assert counts["unreadable"] == int(drew_missing)
    # a second build reuses the cached thumbnails
    again = write_galleries(pages, tmp_path / "g2", settings, cache_dir=tmp_path / "c")
    assert again["thumbnails"] == counts["thumbnails"]


def test_biasig_and_lvlm_galleries(tmp_path):
    t = _biasig_tables()
    prompts = t["prompts"]
    root = tmp_path / "biasig/images"
    meta = t["answers"].join(prompts.select("prompt_id", "acquired_type", "visibility"),
                             on="prompt_id")  # fmt: skip
    for r in meta.iter_rows(named=True):
        _png(root / r["variant"] / r["acquired_type"] / r["visibility"] / "0" /
             f"{r['image_id']}.png", (200, 10, 10))  # fmt: skip
    inputs = Inputs.from_frames(
        {"biasig_implicit": t["implicit"], "biasig_explicit": t["explicit"],
         "biasig_eta": t["eta"], "biasig_answers": t["answers"], "biasig_prompts": prompts},
        paths={"biasig_images": root},
    )  # fmt: skip
    settings = GallerySettings(
        counts={"biasig_subjects": 2, "biasig_per_subject": 2, "lvlm_per_group": 2}
    )
    pages = RB.galleries(inputs, {}, settings)
    assert len(pages) == 1 and pages[0].groups
    cards = [c for g in pages[0].groups for c in g.cards]
    assert all(c.image is not None for c in cards)
    assert all(len(c.headline.split(", ")) == 3 for c in cards)  # gender, race, age
    assert len(pages[0].groups) <= 4 and all(len(g.cards) <= 2 for g in pages[0].groups)

    lv = _lvlm_tables()
    sets = lv["responses"].select("image_id", "axis", "group").unique().with_columns(
        pl.lit("story").alias("task"), (str(tmp_path) + "/u/" + pl.col("image_id") + ".png")
        .alias("path"),
    )  # fmt: skip
    for p in sets["path"]:
        _png(tmp_path / p, (10, 200, 10))
    inputs = Inputs.from_frames(
        {"lvlm_responses": lv["responses"], "lvlm_sets": sets,
         "lvlm_story_attributes": lv["story_attributes"]}
    )  # fmt: skip
    pages = RL.galleries(inputs, {}, settings)
    assert [p.name for p in pages] == ["lvlm-v"]
    cards = [c for g in pages[0].groups for c in g.cards]
    story = [c for g in pages[0].groups if "/ story /" in g.title for c in g.cards]
    assert story and all(any(k.startswith("assistant") for k, _ in c.fields) for c in story)
    assert any(c.badge == "refusal" for c in cards)  # exam answers "I cannot help"
    assert all(len(g.cards) <= 2 for g in pages[0].groups)


# ---------------------------------------------------------------- the whole render


def test_render_report_end_to_end_on_edge_tables(tmp_path, repo_root):
    cb = _contextbias_tables()
    bg = _biasig_tables()
    lv = _lvlm_tables()
    prompts = pl.DataFrame({"prompt_id": ["p"], "role": ["nurse"], "condition": ["CF"],
                            "text": ["a nurse"]})  # fmt: skip
    tables = {
        "prompts": prompts,
        "images": cb["images"],
        "bi": _with_nan(cb["bi"], ["bi"]),
        "ccs": cb["ccs"],
        "ccs_mean": cb["ccs_mean"],
        "robustness": cb["robustness"],
        "bootstrap": _excluding(cb["bootstrap"], "estimate", "ci_low", "ci_high"),
        "biasig_implicit": _excluding(bg["implicit"], "score", "ci_low", "ci_high"),
        "biasig_explicit": bg["explicit"],
        "biasig_eta": bg["eta"],
        "lvlm_scores": lv["scores"],
        "lvlm_refusals": lv["refusals"],
        "lvlm_story_skew": lv["story_skew"],
        "lvlm_exam_accuracy": lv["exam_accuracy"],
    }
    inputs = {}
    for name, frame in tables.items():
        path = tmp_path / "in" / f"{name}.parquet"
        path.parent.mkdir(exist_ok=True)
        frame.write_parquet(path)
        inputs[name] = str(path)
    inputs["registry"] = str(repo_root / "config/models.yaml")
    config = {
        "registry": "config/models.yaml",
        "run_label": "edge tables",
        "embedded_default": True,
        "contextbias": {"generators": ["tiny-sd"], "extractors": ["tiny-vlm"], "metrics": {}},
        "biasig": {"enabled": True, "generators": ["tiny-sd"], "vqa": "tiny-vlm"},
        "lvlm": {"enabled": True, "metrics": {}, "models": ["tiny-vlm"]},
        "report": {"max_table_rows": 5},
    }
    out = tmp_path / "report" / "index.html"
    got = render_report(config, inputs, out)
    text = out.read_text()
    for needle in ("ContextBias", "BiasIG", "LVLM", "Noise floor", "meaningless",
                   "Bias profile per model", 'id="contents"', "The run: models"):  # fmt: skip
        assert needle in text
    # summary first: the profile comes before the table of contents and every section
    assert text.index("bias-profile") < text.index('id="contents"') < text.index('id="biasig"')
    # every CSV link and every figure file exists
    import re

    for href in re.findall(r'href="(tables/[^"]+)"', text):
        assert (out.parent / href).is_file(), href
    assert got["figures"] == len(list((out.parent / "figures").glob("*.png"))) > 5
    assert (out.parent / "tables/bias-profile.csv").is_file()
    prof = pl.read_csv(out.parent / "tables/bias-profile.csv")
    assert {"ContextBias", "BiasIG", "LVLM"} <= set(prof["benchmark_title"])
    # the max_table_rows setting truncates the page, not the CSV
    ccs_csv = pl.read_csv(out.parent / "tables/contextbias-ccs.csv")
    assert ccs_csv.height == cb["ccs"].height
    dims = pl.read_csv(out.parent / "tables/contextbias-bi-aggregations.csv")
    assert dims.height > 5 and f"showing the first 5 of {dims.height} rows" in text
    # rendering twice gives the same page apart from the date
    render_report(config, inputs, out)
    strip = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC")
    assert strip.sub("", out.read_text()) == strip.sub("", text)
    assert not math.isnan(len(text))


def test_extra_sections_have_their_place(tmp_path):
    cb = _contextbias_tables()
    inputs = Inputs.from_frames(cb)

    def audit(inputs, config):
        return [RC.Section("extractor-audit", "Extractor audit", paragraphs=["audited"])]

    report = build_report(inputs, {}, extra_sections=[audit], galleries=False)
    ids = [s.id for s in report.sections]
    assert ids.index("contextbias") < ids.index("extractor-audit") < ids.index("run")


def test_stereolens_report_cli(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    results = tmp_path / "results"
    cb = _contextbias_tables()
    for name in ("bi", "ccs", "ccs_mean", "robustness", "bootstrap", "images", "attributes"):
        rel = {"images": "contextbias/images.parquet",
               "attributes": "contextbias/attributes.parquet"}.get(
            name, f"contextbias/metrics/{name}.parquet")  # fmt: skip
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        cb[name].write_parquet(results / rel)
    out = tmp_path / "elsewhere" / "report.html"
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "stereolens"), "report", "--results", str(results), "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ContextBias" in out.read_text() and (out.parent / "tables").is_dir()
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["index"] == str(out)
    bad = subprocess.run(
        [str(bin_dir / "stereolens"), "report", "--results", str(tmp_path / "none"),
         "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "no result tables" in bad.stderr


def test_low_level_helpers_import_no_benchmark_package():
    """html, figures, galleries, summary and inputs stand below the benchmarks: a benchmark
    (or the annotation form) can import them without an import cycle."""
    import subprocess
    import sys

    code = (
        "import sys; import stereolens.report.html, stereolens.report.figures, "
        "stereolens.report.galleries, stereolens.report.summary, stereolens.report.inputs, "
        "stereolens.report.thumbs; "
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in "
        "(['stereolens', 'contextbias'], ['stereolens', 'biasig'], ['stereolens', 'lvlm'])))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- per-group reader audits
def _audit_frames(n_groups=2, flag=True):
    from stereolens.metrics.group_audit import GAP_COLUMNS, RATE_COLUMNS

    rates = pl.DataFrame(
        [
            {c: None for c in RATE_COLUMNS}
            | {"extractor": "x", "model": "*", "grouping": "stated", "group_dimension": "gender",
               "group": g, "n_items": 4, "accuracy": 0.5, "accuracy_low": 0.6,
               "accuracy_high": 0.9, "precision": float("nan"), "f1": None}
            for g in ["female", "male"][:n_groups]
        ],
        schema={c: (pl.String if c in ("extractor", "model", "grouping", "group_dimension",
                                        "group") else pl.Float64) for c in RATE_COLUMNS},
    )  # fmt: skip
    text = {"worst_group", "best_group", "test", "bias_source", "flag_text", *RATE_COLUMNS[:4]}
    schema = {c: pl.String if c in text else pl.Float64 for c in GAP_COLUMNS} | {"flag": pl.Boolean}
    gaps = pl.DataFrame(
        [{"extractor": "x", "model": "*", "grouping": "stated", "group_dimension": "gender",
          "worst_group": "female", "best_group": "male", "error_gap": 0.3, "gap_low": 0.4,
          "gap_high": None, "test": "fisher", "p_value": float("nan"), "bias": 0.1,
          "flag": flag, "flag_text": "gap 0.30 > bias 0.10"}] if n_groups > 1 else [],
        schema=schema,
    )  # fmt: skip
    return rates, gaps


@pytest.mark.parametrize("n_groups,flag", [(2, True), (2, None), (1, False), (0, False)])
def test_audit_sections_render_edge_tables(n_groups, flag):
    from stereolens.contextbias.report_studies import extraction_group_section
    from stereolens.lvlm.report import story_reading_section

    rates, gaps = _audit_frames(n_groups, flag)
    cb = extraction_group_section(rates, gaps)
    lv = story_reading_section(
        rates.rename({"extractor": "assistant", "group_dimension": "axis"}),
        gaps.rename({"extractor": "assistant", "group_dimension": "axis"}),
    )
    html = render_sections([cb, lv])
    assert "per demographic group" in html and "story reading per group" in html
    if n_groups == 0:
        assert "No validation item" in html and "No reading" in html
        return
    assert ("errs unevenly enough across groups" in html) == bool(flag)
    assert "0.500 [0.600, 0.900]" in html  # an interval that excludes its estimate, as is


def test_report_cli_refuses_a_damaged_table_and_warns_of_a_missing_one(tmp_path):
    """Issue 24, item 3: a truncated images.parquet is refused naming the file and the
    command that mends it (not polars' traceback); a missing one is a loud warning naming
    it (the gallery made from it is left out), not a silent omission."""
    import subprocess
    import sys
    from pathlib import Path

    results = tmp_path / "results"
    cb = _contextbias_tables()
    for name in ("bi", "ccs", "ccs_mean", "robustness", "bootstrap", "images", "attributes"):
        rel = {"images": "contextbias/images.parquet",
               "attributes": "contextbias/attributes.parquet"}.get(
            name, f"contextbias/metrics/{name}.parquet")  # fmt: skip
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        cb[name].write_parquet(results / rel)
    images = results / "contextbias/images.parquet"
    data = images.read_bytes()
    images.write_bytes(data[: len(data) // 2])
    cmd = [str(Path(sys.executable).parent / "stereolens"), "report", "--results", str(results),
           "--out", str(tmp_path / "out/index.html"), "--no-galleries"]  # fmt: skip
    bad = subprocess.run(cmd, capture_output=True, text=True)
    assert bad.returncode == 2, bad.stderr
    assert str(images) in bad.stderr and "stereolens regenerate --shard" in bad.stderr
    assert "Traceback" not in bad.stderr
    images.unlink()
    ok = subprocess.run(cmd, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "WARNING" in ok.stderr and f"images ({images})" in ok.stderr, ok.stderr
    summary = json.loads(ok.stdout.strip().splitlines()[-1])
    assert f"images ({images})" in summary["missing_tables"]
