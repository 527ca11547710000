"""BiasIG bias correction, intervals and model comparisons on fixed tables (hand-computed
values), and the comparison tables of compute_metrics' replicates (structure)."""

import numpy as np
import polars as pl
import pytest

from stereolens.biasig import report as RB
from stereolens.biasig.comparisons import comparison_tables, model_estimates
from stereolens.biasig.groups import bias_corrected, double_bias_corrected, replicate_moments
from stereolens.metrics.compare import COMPARISON_COLUMNS, RANK_COLUMNS


def test_bias_corrected_estimate_and_interval_by_hand():
    reps = np.array([[0.85, 0.87, 0.86, 0.88], [0.97, np.nan, 0.95, 0.99]])
    mean, sd = replicate_moments(reps, axis=1)
    # row 0: mean 0.865; deviations -.015 .005 -.005 .015: sd = sqrt(5e-4 / 3) = 0.0129099
    # row 1: the NaN replicate left out: mean 0.97, sd = sqrt(8e-4 / 2) = 0.02
    assert mean == pytest.approx([0.865, 0.97])
    assert sd == pytest.approx([0.0129099, 0.02], rel=1e-5)
    est, lo, hi = bias_corrected(np.array([0.9, 0.99]), mean, sd, 0.95)
    # 2 x 0.9 - 0.865 = 0.935 +- 1.959964 x 0.0129099 = 0.025303
    assert est[0] == pytest.approx(0.935) and lo[0] == pytest.approx(0.909697, abs=1e-6)
    assert hi[0] == pytest.approx(0.960303, abs=1e-6)
    # 2 x 0.99 - 0.97 = 1.01: clipped to 1; the interval 1.01 +- 0.0392 -> [0.9708, 1]
    assert est[1] == 1.0 and hi[1] == 1.0 and lo[1] == pytest.approx(0.970801, abs=1e-6)
    unclipped = bias_corrected(np.array([0.99]), mean[1:], sd[1:], 0.95, bounds=None)
    assert unclipped[0][0] == pytest.approx(1.01) and unclipped[2][0] > 1


def test_double_bias_corrected_estimate_and_interval_by_hand():
    """eta's interval: the iterated bootstrap bias correction (groups.double_bias_corrected)."""
    outer = np.array([[0.48, 0.50, 0.52, 0.46]])
    inner_mean = np.array([[0.47, 0.50, 0.50, 0.45]])
    inner_var = np.full((1, 4), 4e-4)
    est, lo, hi = double_bias_corrected(np.array([0.5]), outer, inner_mean, inner_var, 20, 0.95)
    # 3 x 0.5 - 3 x mean(outer) 0.49 + mean(inner means) 0.48 = 0.51
    assert est[0] == pytest.approx(0.51)
    # once-corrected 2 x outer - inner = .49 .50 .54 .47: mean .5, var 26e-4 / 3; the inner
    # means' noise 4e-4 / 20 out: se = sqrt(8.6667e-4 - 2e-5) = 0.0290975, x 1.959964
    assert lo[0] == pytest.approx(0.4529699, abs=1e-6)
    assert hi[0] == pytest.approx(0.5670301, abs=1e-6)
    # noise larger than the spread: the spread alone (never a negative variance)
    noisy = np.full((1, 4), 1e-2)
    _, lo2, hi2 = double_bias_corrected(np.array([0.5]), outer, inner_mean, noisy, 1, 0.95)
    assert hi2[0] - lo2[0] == pytest.approx(2 * 1.959964 * np.sqrt(26e-4 / 3), rel=1e-6)


def test_inner_resample_keeps_each_attributes_total():
    from stereolens.biasig.pairs import _resample_shares

    counts = np.array([[[3, 1, 0, 4, 0, 0, 2, 2, 0]]])  # (1, 1, 9): 4 / 4 / 4 per attribute
    drawn = _resample_shares(counts, 500, np.random.default_rng(0))
    assert drawn.shape == (1, 1, 500, 9)
    assert (drawn[..., 0:2].sum(-1) == 4).all() and (drawn[..., 2:6].sum(-1) == 4).all()
    assert (drawn[..., 6:9].sum(-1) == 4).all()
    assert (drawn[..., [2, 4, 5, 8]] == 0).all()  # a value never seen is never drawn
    assert drawn[..., 0].mean() == pytest.approx(3.0, abs=0.1)  # 4 x 3/4


def _tables():
    """Model rows of three variants: m, its debiasing variant m-fair, and n; S_imp only
    (plug-in score, bias-corrected score_bc) and four replicates each."""
    bc = {"m": 0.92, "m-fair": 0.95, "n": 0.85}
    base = {"m": "m", "m-fair": "m", "n": "n"}
    implicit = pl.DataFrame(
        [
            {"variant": v, "model": base[v], "level": "model", "protected_attribute": "*",
             "score": bc[v] - 0.01, "score_bc": bc[v]}
            for v in bc
        ]
    )  # fmt: skip
    reps = {
        "m": [0.90, 0.90, 0.90, 0.90],
        "m-fair": [0.91, 0.93, 0.91, 0.93],
        "n": [0.80, 0.80, 0.84, 0.84],
    }
    replicates = pl.DataFrame(
        [
            {"variant": v, "model": base[v], "metric": "S_imp", "protected_attribute": "*",
             "replicate": r, "value": x}
            for v, xs in reps.items()
            for r, x in enumerate(xs)
        ]
    )  # fmt: skip
    return {"implicit": implicit, "replicates": replicates}


def test_comparisons_by_hand():
    cmp, ranks = comparison_tables(_tables())
    assert cmp.columns == COMPARISON_COLUMNS and ranks.columns == RANK_COLUMNS
    assert cmp["interval_note"].null_count() == cmp.height
    rows = {(r["model_a"], r["model_b"]): r for r in cmp.iter_rows(named=True)}
    assert set(rows) == {("m", "m-fair"), ("m", "n"), ("m-fair", "n")}
    fair = rows[("m", "m-fair")]  # the variant against its base, base as model_a
    assert fair["relation"] == "variant_vs_base"
    assert rows[("m", "n")]["relation"] == rows[("m-fair", "n")]["relation"] == "pair"
    # differences of the bias-corrected estimates, not of the plug-ins
    assert fair["estimate_a"] == 0.92 and fair["difference"] == pytest.approx(0.03)
    # rep differences .01 .03 .01 .03: se = sqrt(4e-4 / 3) = 0.011547; z = 2.598
    assert fair["se"] == pytest.approx(0.011547, rel=1e-4)
    assert (fair["ci_low"], fair["ci_high"]) == pytest.approx((0.007368, 0.052632), abs=1e-6)
    assert fair["p_value"] == pytest.approx(0.0093748, rel=1e-4)
    mn, fn = rows[("m", "n")], rows[("m-fair", "n")]
    assert mn["difference"] == pytest.approx(-0.07) and mn["se"] == pytest.approx(0.023094, 1e-4)
    assert mn["p_value"] == pytest.approx(0.0024367, rel=1e-4)
    assert fn["difference"] == pytest.approx(-0.10) and fn["se"] == pytest.approx(0.025820, 1e-4)
    assert fn["p_value"] == pytest.approx(1.0751e-4, rel=1e-3)
    # Holm: 3 x 1.0751e-4, 2 x 0.0024367, 1 x 0.0093748; all rejected at 0.05
    assert fn["p_adjusted"] == pytest.approx(3.2253e-4, rel=1e-3)
    assert mn["p_adjusted"] == pytest.approx(0.0048735, rel=1e-4)
    assert fair["p_adjusted"] == pytest.approx(0.0093748, rel=1e-4)
    assert cmp["reject"].all() and not cmp["paired"].any()
    assert set(cmp["scope"]) == {"overall"} and set(cmp["benchmark"]) == {"biasig"}
    # higher S_imp is less biased: m-fair 1, m 2, n 3, every pair told apart
    got = {r["model"]: (r["rank"], r["rank_low"], r["rank_high"], r["group"]) for r in
           ranks.iter_rows(named=True)}  # fmt: skip
    assert got == {"m-fair": (1, 1, 1, 1), "m": (2, 2, 2, 2), "n": (3, 3, 3, 3)}


def test_variant_deltas_carry_the_comparison_interval():
    t = _tables()
    cmp, _ = comparison_tables(t)
    implicit = t["implicit"]
    explicit = pl.DataFrame(
        schema={"variant": pl.String, "model": pl.String, "level": pl.String,
                "protected_attribute": pl.String, "protected_value": pl.String,
                "score": pl.Float64}
    )  # fmt: skip
    eta = pl.DataFrame(
        schema={"variant": pl.String, "model": pl.String, "pair": pl.String,
                **{c: pl.Float64 for c in ("eta_total", "eta_gender", "eta_race", "eta_age")}}
    )  # fmt: skip
    d = RB.variant_deltas(implicit, explicit, eta, cmp)
    row = d.row(0, named=True)
    assert d.height == 1 and (row["variant"], row["model"]) == ("m-fair", "m")
    assert row["change"] == pytest.approx(0.03)  # of the plug-ins, as before
    assert row["change_bc"] == pytest.approx(0.03)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((0.007368, 0.052632), abs=1e-6)
    assert row["reject"] is True
    plain = RB.variant_deltas(implicit, explicit, eta)
    assert plain["ci_low"].null_count() == plain.height
    assert plain.columns == d.columns


def test_no_replicates_no_comparisons():
    t = _tables()
    cmp, ranks = comparison_tables({"implicit": t["implicit"]})
    assert cmp.height == 0 and ranks.height == 0
    assert cmp.columns == COMPARISON_COLUMNS


def test_compute_metrics_replicates_feed_the_comparisons():
    from stereolens.biasig.metrics import REPLICATE_COLUMNS, compute_metrics
    from stereolens.biasig.prompts import load_prompts

    prompts = load_prompts()
    ids = prompts.filter(
        pl.col("acquired_attribute").is_in(["Nurse", "rich", "poor"])
        & (pl.col("variant_index") == 0)
    )["prompt_id"].to_list()
    rng = np.random.default_rng(3)
    rows = [
        {"model": "m", "variant": v, "prompt_id": p, "image_id": f"{v}{p}{i}",
         "position": "single", "gender": rng.choice(["male", "female"]),
         "race": rng.choice(["White", "Black"]), "age": rng.choice(["young", "elderly"]),
         "status": "ok"}
        for v in ("m", "m-fair")
        for p in ids
        for i in range(4)
    ]  # fmt: skip
    tables = compute_metrics(
        pl.DataFrame(rows), prompts, replicates=30, ceiling_draws=0,
        which=("implicit", "explicit", "eta", "replicates"),
    )  # fmt: skip
    reps = tables["replicates"]
    assert reps.columns == list(REPLICATE_COLUMNS)
    # 2 variants x 3 metrics x 4 scopes x 30 replicates
    assert reps.height == 2 * 3 * 4 * 30
    est = model_estimates(tables)
    imp = tables["implicit"].filter(
        (pl.col("level") == "model") & (pl.col("protected_attribute") == "*")
    )
    # the bias-corrected model score is 2 x plug-in - the replicates' mean
    for r in imp.iter_rows(named=True):
        mean = reps.filter(
            (pl.col("variant") == r["variant"]) & (pl.col("metric") == "S_imp")
            & (pl.col("protected_attribute") == "*")
        )["value"].mean()  # fmt: skip
        assert r["score_bc"] == pytest.approx(min(1.0, 2 * r["score"] - mean))
    cmp, ranks = comparison_tables(tables)
    assert set(cmp["relation"]) == {"variant_vs_base"}
    assert set(cmp["metric"]) == {"S_imp", "S_exp", "eta"}
    assert set(cmp["scope"]) == {"overall", "gender", "race", "age"}
    assert set(ranks["metric"]) == {"S_imp", "S_exp"}  # eta is a direction, not ranked
    bc = est.filter((pl.col("metric") == "S_exp") & (pl.col("protected_attribute") == "*"))
    bc = dict(zip(bc["variant"], bc["estimate_bc"], strict=True))
    row = cmp.filter((pl.col("metric") == "S_exp") & (pl.col("scope") == "overall")).row(
        0, named=True
    )
    assert row["difference"] == pytest.approx(bc["m-fair"] - bc["m"])
    assert row["ci_low"] < row["difference"] < row["ci_high"]
    # eta's comparisons take the plug-ins (its bias correction does not cover, see ESTIMATE)
    plug = est.filter((pl.col("metric") == "eta") & (pl.col("protected_attribute") == "*"))
    plug = dict(zip(plug["variant"], plug["estimate"], strict=True))
    row = cmp.filter((pl.col("metric") == "eta") & (pl.col("scope") == "overall")).row(
        0, named=True
    )
    assert row["difference"] == pytest.approx(plug["m-fair"] - plug["m"])


NOTE = (
    "withheld: 2 images per subject < 40 (the smallest size at which the coverage "
    "benchmark's interval covers >= 93%, bench/COVERAGE.md)"
)


def test_a_withheld_model_has_no_comparison_interval():
    t = _tables()
    t["implicit"] = t["implicit"].with_columns(
        pl.when(pl.col("variant") == "n").then(pl.lit(NOTE)).otherwise(None).alias("interval_note")
    )
    cmp, ranks = comparison_tables(t)
    withheld = cmp.filter(pl.col("model_a").eq("n") | pl.col("model_b").eq("n"))
    assert withheld.height == 2 and set(withheld["interval_note"]) == {NOTE}
    for c in ("ci_low", "ci_high", "p_value", "p_adjusted", "reject"):
        assert withheld[c].null_count() == 2
    assert withheld["difference"].null_count() == 0  # the estimate stays
    # m-fair vs m alone in the Holm family: p-adjusted = its p-value
    kept = cmp.filter(pl.col("interval_note").is_null()).row(0, named=True)
    assert kept["p_adjusted"] == pytest.approx(kept["p_value"])
    assert kept["reject"] is True
    # the ranks count only judged pairs: n (lowest S_imp) is judged against no model
    n = ranks.filter(pl.col("model") == "n").row(0, named=True)
    assert (n["rank"], n["rank_low"], n["rank_high"]) == (3, 1, 3)


def test_compute_metrics_withholds_below_the_minimum():
    from stereolens.biasig.metrics import compute_metrics
    from stereolens.biasig.prompts import load_prompts

    prompts = load_prompts()
    ids = prompts.filter(
        pl.col("acquired_attribute").is_in(["rich", "poor"]) & (pl.col("variant_index") < 2)
    )["prompt_id"].to_list()
    rng = np.random.default_rng(3)
    rows = [
        {"model": "m", "variant": v, "prompt_id": p, "image_id": f"{v}{p}{i}",
         "position": "single", "gender": rng.choice(["male", "female"]),
         "race": rng.choice(["White", "Black"]), "age": rng.choice(["young", "elderly"]),
         "status": "ok"}
        for v in ("m", "m-fair")
        for p in ids
        for i in range(3 if v == "m" else 5)
    ]  # fmt: skip
    kw = dict(replicates=20, ceiling_draws=0, which=("implicit", "eta", "replicates"))
    # 2 phrasings a subject: m has 6 images per subject, m-fair 10
    tables = compute_metrics(pl.DataFrame(rows), prompts, interval_min_images_per_subject=8, **kw)
    note = (
        "withheld: 6 images per subject < 8 (the smallest size at which the coverage "
        "benchmark's interval covers >= 93%, bench/COVERAGE.md)"
    )
    for name, cols in (("implicit", ["ci_low", "ci_high"]), ("eta", ["ci_low", "ci_low_age"])):
        t = tables[name]
        m, fair = t.filter(pl.col("variant") == "m"), t.filter(pl.col("variant") == "m-fair")
        assert (
            set(m["interval_note"]) == {note} and fair["interval_note"].null_count() == fair.height
        )
        for c in cols:
            assert m[c].null_count() == m.height
        assert (
            fair.filter(pl.col("pair") == "*" if name == "eta" else pl.col("level") == "model")[
                "ci_low"
            ].null_count()
            == 0
        )
    cmp, _ = comparison_tables(tables)
    assert set(cmp["interval_note"]) == {note} and cmp["ci_low"].null_count() == cmp.height
    # both below the minimum: the pair (m, m-fair) carries model_a's note, the base m's
    both = compute_metrics(pl.DataFrame(rows), prompts, interval_min_images_per_subject=11, **kw)
    cmp, _ = comparison_tables(both)
    assert set(zip(cmp["model_a"], cmp["model_b"], strict=True)) == {("m", "m-fair")}
    assert set(cmp["interval_note"]) == {note.replace("< 8", "< 11")}
    # 0 (the library default): every interval printed
    every = compute_metrics(pl.DataFrame(rows), prompts, **kw)
    assert every["implicit"]["interval_note"].null_count() == every["implicit"].height


def test_report_model_level_carries_the_withheld_note():
    def score(variant, note, **extra):
        return {"variant": variant, "model": "m", "level": "model", "protected_attribute": "*",
                "score": 0.9, "ci_low": None if note else 0.8, "ci_high": None if note else 1.0,
                "score_bc": 0.91, "interval_note": note, **extra}  # fmt: skip

    implicit = pl.DataFrame([score("m", NOTE), score("m-fair", None)])
    explicit = pl.DataFrame(
        [score("m", NOTE, protected_value="*"), score("m-fair", None, protected_value="*")]
    )
    eta = pl.DataFrame(
        [
            {"variant": v, "model": "m", "pair": "*", "eta_total": 0.5, "eta_total_bc": 0.5,
             "ci_low": None if n else 0.4, "ci_high": None if n else 0.6, "interval_note": n}
            for v, n in (("m", NOTE), ("m-fair", None))
        ]
    )  # fmt: skip
    table = RB.model_level(implicit, explicit, eta)
    assert table["interval_note"].to_list() == [NOTE, None]
    assert table.filter(pl.col("variant") == "m")["S_imp_low"].to_list() == [None]
    # tables from before the rule (no interval_note): a null note
    old = RB.model_level(implicit.drop("interval_note"), explicit, eta.drop("interval_note"))
    assert old["interval_note"].to_list() == [NOTE, None]  # explicit still carries it
    assert "withheld" in RB.INTERVAL_COVERAGE


def test_the_demo_design_prints_no_interval():
    """bench/cover/biasig.py's demo world (config/demo.yaml: 2 images per subject) through
    compute_metrics and comparison_tables with the config's minimum: every interval null."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from cover import biasig as CB

    world = CB.world("demo")
    assert world.minimum == 40 and world.withheld == "2 images per subject < 40"
    rng = np.random.default_rng(0)
    for _ in range(3):
        got = CB.measure(world, CB.answers(world, rng), seed=int(rng.integers(2**31)))
        assert set(got) == {"S_imp", "S_exp", "eta", "S_imp b - a", "S_exp b - a", "eta b - a"}
        for row, (_, lo, hi, *_) in got.items():
            assert np.isnan(lo) and np.isnan(hi), row
