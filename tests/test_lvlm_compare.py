"""LVLM comparisons between models (issue 20, item 3): the paired bootstrap of the shared user
images, the noise-floor bracket interval, the refusal rates' design effect and the
comparisons / ranks tables of ``stereolens lvlm metrics``."""

import json
from dataclasses import replace

import numpy as np
import polars as pl
import pytest
from statsmodels.stats.proportion import proportion_confint

from stereolens.lvlm import comparisons as K
from stereolens.lvlm import metrics as M
from stereolens.lvlm import resample as R
from stereolens.lvlm import scores as S
from stereolens.lvlm.settings import LVLMSettings
from stereolens.metrics.compare import COMPARISON_COLUMNS, RANK_COLUMNS


def _exam(model: str, setting: str = "image", flip: int = 0) -> pl.DataFrame:
    """10 images per gender, two subjects; ``flip`` of the male images' physics answers
    become wrong."""
    rows = []
    for g in ("female", "male"):
        for i in range(10):
            for subject in ("college_physics", "college_biology"):
                right = 3 - (1 if g == "male" and subject == "college_physics" and i < flip else 0)
                rows.append(
                    {
                        "model": model,
                        "setting": setting,
                        "axis": "gender",
                        "group": g,
                        "image_id": f"{g}{i}",
                        "subject": subject,
                        "n": 4,
                        "n_correct": right - (i % 2),
                    }
                )
    return pl.DataFrame(rows)


def test_bracket_interval_hand_computed():
    # replicates 1..9 (mean 5); level 0.8: quantiles 1.8 and 8.2, i.e. -3.2 and +3.2 about m
    reps = np.arange(1.0, 10.0)
    bc, lo, hi = R.bracket_interval(10.0, reps, 0.8, 4.0)
    assert bc == pytest.approx(6.0)  # score - null_mean
    assert lo == pytest.approx(10.0 - 4.0 - 3.2)
    assert hi == pytest.approx(10.0 + 3.2)
    # clipped at 0; below its floor the bias-corrected score is negative, not clipped
    bc, lo, hi = R.bracket_interval(2.0, reps, 0.8, 4.0)
    assert bc == pytest.approx(-2.0) and lo == 0.0 and hi == pytest.approx(5.2)
    # no permutation null: the percentile interval moved onto the score
    bc, lo, hi = R.bracket_interval(10.0, reps, 0.8, float("nan"))
    assert np.isnan(bc) and (lo, hi) == pytest.approx((6.8, 13.2))


def test_bootstrap_is_paired_and_stable_when_a_model_is_added():
    two = pl.concat([_exam("a"), _exam("b", flip=6)])
    out, reps = S.score_replicates(
        "exam", two, n_boot=200, permutations=50, seed=3, min_images_per_group=0
    )
    ra, rb = reps[("a", "image", "gender")], reps[("b", "image", "gender")]
    # one resample of the shared images per replicate: a copy of a model has replicates
    # equal to its own, so the difference's spread is 0
    same = pl.concat([_exam("a"), _exam("a2")])
    _, reps_same = S.score_replicates("exam", same, n_boot=200, permutations=0, seed=3)
    assert np.array_equal(reps_same[("a", "image", "gender")], reps_same[("a2", "image", "gender")])
    # the draw depends on the shared images, not on the models: adding a third leaves them
    three = pl.concat([two, _exam("c", flip=3)])
    _, reps3 = S.score_replicates("exam", three, n_boot=200, permutations=50, seed=3)
    assert np.array_equal(reps3[("a", "image", "gender")], ra)
    assert np.array_equal(reps3[("b", "image", "gender")], rb)
    # ci from the bracket, score_bc = score - null_mean
    for r in out.iter_rows(named=True):
        assert r["score_bc"] == pytest.approx(r["score"] - r["null_mean"])
        assert r["ci_low"] <= max(r["score_bc"], 0) + 1e-9 and r["score"] <= r["ci_high"]
        assert r["interval"] == R.INTERVAL


def test_design_effect_of_the_user_image_hand_computed():
    # image A: 4 of 4 refused, image B: 0 of 4. p = 1/2, sum m = 8,
    # sum (y - p m)^2 = 2^2 + 2^2 = 8, deff = 8 / (1/4 * 8) = 4: Wilson on 1 of 2
    images = pl.DataFrame(
        {
            "model": ["m", "m"],
            "setting": ["image", "image"],
            "task": ["term", "term"],
            "axis": ["gender", "gender"],
            "group": ["female", "male"],
            "image_id": ["A", "B"],
            "n": [4, 4],
            "n_empty": [0, 0],
            "n_refusal": [4, 0],
            "n_rule": [4, 0],
            "n_judge": [0, 0],
        }
    )
    by = ["model", "setting", "task", "axis", "group"]
    counts = images.group_by(by).agg(pl.col("n", "n_empty", "n_refusal", "n_rule", "n_judge").sum())
    table = M.refusals({"refusals": counts, "refusal_images": images})
    pooled = table.filter(pl.col("group") == "*").row(0, named=True)
    assert pooled["deff"] == pytest.approx(4.0) and pooled["rate"] == pytest.approx(50.0)
    lo, hi = proportion_confint(1, 2, alpha=0.05, method="wilson")
    assert (pooled["ci_low"], pooled["ci_high"]) == pytest.approx((100 * lo, 100 * hi))
    # one image per group: no dependence left, plain Wilson on 4 of 4
    female = table.filter(pl.col("group") == "female").row(0, named=True)
    assert female["deff"] == 1.0
    lo, hi = proportion_confint(4, 4, alpha=0.05, method="wilson")
    assert (female["ci_low"], female["ci_high"]) == pytest.approx((100 * lo, 100 * hi))


def _responses(p_refuse: dict[tuple[str, str], float]) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for (model, setting), p in p_refuse.items():
        for g in ("female", "male"):
            for i in range(30):
                for q in range(3):
                    rows.append(
                        {
                            "model": model,
                            "setting": setting,
                            "task": "exam",
                            "axis": "gender",
                            "group": g,
                            "image_id": f"{g}{i}",
                            "prompt_id": f"q{q}",
                            "subject": "college_physics",
                            "correct": bool(rng.random() < 0.6),
                            "refusal": bool(rng.random() < p),
                            "refusal_rule": False,
                            "refusal_judge": None,
                            "empty": False,
                        }
                    )
    return pl.DataFrame(rows)


def test_metrics_write_comparisons_and_ranks():
    responses = _responses({("a", "image"): 0.05, ("b", "image"): 0.5, ("a", "mitigation"): 0.05})
    out = M.compute_all(
        responses, settings=replace(LVLMSettings.preset(), replicates=200, permutations=100, seed=0)
    )
    cmp, ranks = out["comparisons"], out["ranks"]
    # metrics.compare's columns, the bracket before interval_note (as since issue 20)
    assert cmp.columns == [*COMPARISON_COLUMNS[:-1], "bracket_low", "bracket_high", "interval_note"]
    assert cmp.columns == K.COLUMNS
    assert ranks.columns == RANK_COLUMNS
    got = {
        (r["metric"], r["scope"], r["model_a"], r["model_b"], r["relation"])
        for r in cmp.iter_rows(named=True)
    }
    tvd, ref, var = "exam TVD x100", "refusal rate %", "variant_vs_base"
    base, mit = "a [image]", "a [mitigation]"
    assert got == {
        (tvd, "gender, setting image", "a", "b", "pair"),
        (tvd, "gender, a: settings vs image", base, mit, var),
        (ref, "exam, setting image", "a", "b", "pair"),
        (ref, "exam, a: settings vs image", base, mit, var),
    }
    assert cmp["paired"].all() and (cmp["adjustment"] == "holm").all()
    # the refusal rates differ by about 45 points on 180 responses each: decided
    ref = cmp.filter((pl.col("metric") == "refusal rate %") & (pl.col("relation") == "pair"))
    row = ref.row(0, named=True)
    rates = out["refusals"].filter(pl.col("group") == "*")
    rate = dict(zip(rates["model"] + rates["setting"], rates["rate"], strict=True))
    assert row["difference"] == pytest.approx(rate["bimage"] - rate["aimage"])
    assert row["reject"] and row["ci_low"] > 0
    assert ranks.filter(pl.col("metric") == "refusal rate %").filter(
        pl.col("scope") == "exam, setting image"
    )["model"].to_list() == ["a", "b"]
    # TVD rows carry the bracket of the population difference around the Wald interval
    tvd = cmp.filter(pl.col("metric") == "exam TVD x100")
    assert (tvd["bracket_low"] <= tvd["ci_low"]).all()
    assert (tvd["bracket_high"] >= tvd["ci_high"]).all()
    assert cmp.filter(pl.col("metric") == "refusal rate %")["bracket_low"].is_null().all()


def test_refusal_replicates_are_paired():
    responses = _responses({("a", "image"): 0.2, ("b", "image"): 0.2})
    red = M.reduce_responses(responses)
    copy = (
        red["refusal_images"]
        .filter(pl.col("model") == "a")
        .with_columns(pl.lit("c").alias("model"))
    )
    reps = K.refusal_replicates(pl.concat([red["refusal_images"], copy]), 100, 0)
    assert np.array_equal(reps[("a", "image", "exam")], reps[("c", "image", "exam")])
    assert not np.array_equal(reps[("a", "image", "exam")], reps[("b", "image", "exam")])
    empty = K.tables([], [])["comparisons"]
    assert empty.columns == K.COLUMNS and empty.schema["interval_note"] == pl.String


def test_small_designs_print_no_test():
    """A design below the minimum withholds every comparison (the rule itself:
    test_compare.test_withheld_pairs_leave_holms_family_and_keep_their_estimates)."""
    # 10 images per group (default minimum 30): scores, refusal rates' comparisons withheld
    responses = _responses({("a", "image"): 0.05, ("b", "image"): 0.5}).filter(
        pl.col("image_id").str.extract(r"(\d+)$").cast(pl.Int64) < 10
    )
    small = M.compute_all(
        responses, settings=replace(LVLMSettings.preset(), replicates=100, permutations=50, seed=0)
    )
    scores = small["scores"]
    assert scores["images_per_group"].to_list() == [10, 10]
    assert scores["ci_low"].is_null().all() and scores["interval_note"].is_not_null().all()
    assert (small["refusals"]["images_per_group"] == 10).all()
    c = small["comparisons"]
    assert c.height == 2 and c["interval_note"].str.starts_with("withheld: 10 images").all()
    for col in ("ci_low", "ci_high", "p_value", "p_adjusted", "reject", "bracket_low"):
        assert c[col].is_null().all(), col
    # nothing is decided: every model one group, rank interval [1, 2]
    assert set(small["ranks"]["rank_low"]) == {1} and set(small["ranks"]["rank_high"]) == {2}
    big = M.compute_all(
        responses,
        settings=replace(
            LVLMSettings.preset(), replicates=100, permutations=50, interval_min_images_per_group=10
        ),
    )
    assert big["comparisons"]["interval_note"].is_null().all()
    assert big["comparisons"]["reject"].is_not_null().all()
    # one small model among three: its pairs withheld (bracket too), the others tested
    rates = {("a", "image"): 0.05, ("b", "image"): 0.5, ("c", "image"): 0.3}
    mixed = _responses(rates).filter(
        (pl.col("model") != "b") | (pl.col("image_id").str.extract(r"(\d+)$").cast(pl.Int64) < 10)
    )
    out = M.compute_all(
        mixed,
        settings=replace(
            LVLMSettings.preset(), replicates=100, permutations=50, interval_min_images_per_group=20
        ),
    )
    tvd = out["comparisons"].filter(pl.col("metric") == "exam TVD x100")
    gone = tvd.filter(pl.col("interval_note").is_not_null())
    assert sorted(zip(gone["model_a"], gone["model_b"], strict=True)) == [("a", "b"), ("b", "c")]
    assert set(gone["interval_note"]) == {R.withheld_note(10, 20)}
    for col in ("ci_low", "p_adjusted", "reject", "bracket_low", "bracket_high"):
        assert gone[col].is_null().all(), col
    (kept,) = tvd.filter(pl.col("interval_note").is_null()).iter_rows(named=True)
    assert kept["p_adjusted"] == pytest.approx(kept["p_value"])  # alone in Holm's family
    assert kept["bracket_low"] <= kept["ci_low"] and kept["bracket_high"] >= kept["ci_high"]


def test_cli_passes_the_minimum_from_the_preset_and_its_help_prints(tmp_path, capsys):
    from stereolens.cli import build_parser, main

    with pytest.raises(SystemExit):
        build_parser().parse_args(["lvlm", "metrics", "--help"])
    assert "--preset NAME|PATH|JSON" in capsys.readouterr().out
    responses = _responses({("a", "image"): 0.05, ("b", "image"): 0.5}).filter(
        pl.col("image_id").str.extract(r"(\d+)$").cast(pl.Int64) < 10
    )
    responses = responses.with_columns(pl.lit("an answer").alias("response"))
    responses.write_parquet(tmp_path / "responses.parquet")
    for minimum, withheld in ((10, False), (11, True)):
        out = tmp_path / f"m{minimum}"
        args = ["lvlm", "metrics", "--responses", str(tmp_path / "responses.parquet")]
        metrics = {"replicates": 50, "permutations": 20, "interval_min_images_per_group": minimum}
        args += ["--out", str(out), "--preset", json.dumps({"metrics": metrics})]
        assert main(args) == 0
        scores = pl.read_parquet(out / "scores.parquet")
        cmp = pl.read_parquet(out / "comparisons.parquet")
        assert scores["ci_low"].is_null().all() == withheld
        assert cmp["interval_note"].is_not_null().all() == withheld
        assert cmp["reject"].is_null().all() == withheld
