"""Report helpers: the debiasing-variant comparison."""

import polars as pl
import pytest

from stereolens.report import _variant_deltas


def test_variant_deltas_are_variant_minus_base():
    def imp(variant, g, r):
        return [
            {
                "variant": variant,
                "model": "m",
                "level": "model",
                "protected_attribute": a,
                "score": v,
            }
            for a, v in (("gender", g), ("race", r))
        ]

    implicit = pl.DataFrame(imp("m", 0.80, 0.70) + imp("m-fair", 0.90, 0.65))
    explicit = pl.DataFrame(
        [
            {
                "variant": v,
                "model": "m",
                "level": "model",
                "protected_attribute": "gender",
                "protected_value": "*",
                "score": s,
            }
            for v, s in (("m", 0.5), ("m-fair", 0.6))
        ]
    )
    eta = pl.DataFrame(
        [
            {
                "variant": v,
                "model": "m",
                "pair": "*",
                "eta_total": t,
                "eta_gender": t,
                "eta_race": 0.5,
                "eta_age": 0.5,
            }
            for v, t in (("m", 0.6), ("m-fair", 0.55))
        ]
    )
    d = _variant_deltas(implicit, explicit, eta)
    assert set(d["variant"]) == {"m-fair"}
    change = {(r["metric"], r["protected_attribute"]): r["change"] for r in d.iter_rows(named=True)}
    assert change[("S_imp", "gender")] == pytest.approx(0.10)
    assert change[("S_imp", "race")] == pytest.approx(-0.05)  # a side effect on race
    assert change[("S_exp", "gender")] == pytest.approx(0.10)
    assert change[("eta", "*")] == pytest.approx(-0.05)
    assert change[("eta", "race")] == pytest.approx(0.0)


# -- every section renders every valid table ------------------------------------------------
# The demo's tiny models give other numbers on other CPUs, so the report is tested on edge
# tables built here: intervals that exclude the point estimate, nulls, NaN, a single model,
# a single role, and empty sections.

import math  # noqa: E402

import numpy as np  # noqa: E402

from stereolens import report as R  # noqa: E402
from stereolens.contextbias import bootstrap as CB  # noqa: E402
from stereolens.contextbias import ccs as CC  # noqa: E402
from stereolens.contextbias import robustness as CR  # noqa: E402
from stereolens.contextbias.metrics import bi_table  # noqa: E402
from stereolens.lvlm import report as LR  # noqa: E402
from stereolens.lvlm.metrics import compute_all  # noqa: E402


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
        "bi": bi_table(att, img, matched_draws=2),
        "ccs_mean": CC.ccs_mean(ccs),
        "robustness": CR.robustness_summary(CR.robustness_tests(att, img)),
        "bootstrap": CB.cluster_bootstrap(att, replicates=20),
        "images": img,
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


def _html(parts) -> str:
    out = "\n".join(p for p in parts if p)
    assert "<" in out
    return out


@pytest.mark.parametrize("case", ["plain", "single_model_role", "many", "empty"])
def test_contextbias_sections_render(case):
    if case == "many":
        t = _contextbias_tables(roles=("nurse", "pilot", "chef"), models=("m1", "m2"))
    else:
        t = _contextbias_tables()
    if case == "empty":
        t = {k: v.clear() for k, v in t.items()}
    html_bi = _html(R._bi_sections(t["bi"]))
    assert "Bias Intensity" in html_bi
    _html(R._bi_sections(_with_nan(t["bi"], ["bi"])))
    boot = t["bootstrap"]
    _html(R._bootstrap_sections(boot))
    _html(R._bootstrap_sections(_excluding(boot, "estimate", "ci_low", "ci_high")))
    _html(R._bootstrap_sections(_with_nan(boot, ["estimate", "ci_low", "ci_high"])))
    _html(R._ccs_sections(t["ccs_mean"], t["robustness"]))
    _html(R._ccs_sections(_with_nan(t["ccs_mean"], ["ccs_mean"]), t["robustness"]))
    if t["bi"].height:
        assert "<img" in R.bi_condition_figure(t["bi"])
        assert "<img" in R.bi_condition_figure(_with_nan(t["bi"], ["bi"]))


def test_robustness_caption_names_the_computation():
    t = _contextbias_tables()
    assert "released code" in R._robustness_caption(t["robustness"])
    att, img = _attributes()
    cond = CR.robustness_summary(CR.robustness_tests(att, img, cells="condition"))
    assert "not the paper's Table 3" in R._robustness_caption(cond)


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
                        "prompt_id": p,
                        "image_id": f"{m}{p}{i}",
                        "position": "single",
                        "gender": rng.choice(["male", "female"]),
                        "race": rng.choice(["White", "Black"]),
                        "age": rng.choice(["young", "elderly"]),
                        "status": "ok",
                    }
                )
    return compute_metrics(pl.DataFrame(rows), prompts, replicates=20, ceiling_draws=10)


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
    out = _html(R._biasig_sections(imp, exp, eta))
    assert "BiasIG" in out
    if case != "empty":
        assert "<img" in out and "S_imp_ceiling" in out


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
    assert R._biasig_figure(rows).startswith("<img")


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
    return compute_all(
        pl.DataFrame(resp),
        pl.DataFrame(story),
        pl.DataFrame(terms),
        min_count=1,
        replicates=20,
        permutations=20,
    )


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
    out = _html(LR.lvlm_sections(config, scores, refusals, skew, None, t["exam_accuracy"]))
    assert "LVLM" in out
    if case in ("plain", "excluding"):
        assert "Noise floor" in out and "p=" in out
    floor = LR.noise_floor_table(t["scores"])
    assert floor.height == 1 and all("p=" in c for c in floor.row(0)[2:])


def test_render_report_end_to_end_on_edge_tables(tmp_path):
    cb = _contextbias_tables()
    bg = _biasig_tables()
    lv = _lvlm_tables()
    inputs = {}
    prompts = pl.DataFrame({"prompt_id": ["p"], "role": ["nurse"], "condition": ["CF"]})
    tables = {
        "prompts": prompts,
        "images": cb["images"],
        "bi": _with_nan(cb["bi"], ["bi"]),
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
    for name, frame in tables.items():
        path = tmp_path / f"{name}.parquet"
        frame.write_parquet(path)
        inputs[name] = str(path)
    config = {
        "registry": "config/models.yaml",
        "run_label": "edge tables",
        "embedded_default": True,
        "contextbias": {"generators": ["tiny-sd"], "extractors": ["tiny-vlm"], "metrics": {}},
        "biasig": {"enabled": True, "generators": ["tiny-sd"], "vqa": "tiny-vlm"},
        "lvlm": {"enabled": True, "metrics": {}},
    }
    out = tmp_path / "index.html"
    R.render_report(config, inputs, str(out))
    text = out.read_text()
    for needle in ("ContextBias", "BiasIG", "LVLM", "Noise floor", "meaningless"):
        assert needle in text
    assert not math.isnan(len(text))


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
        _html(R._validation_sections(frame))
    mapping = pl.DataFrame(
        {
            "dimension": ["items"],
            "decided_by": ["singleton"],
            "raw_label": ["cup"],
            "cluster_id": [0],
            "core_label": [None],
        },
        schema_overrides={"core_label": pl.String},
    )
    assert "Canonicalisation" in _html(R._canonical_section(mapping))
    assert "off" in _html(R._canonical_section(mapping.clear()))
