"""ContextBias comparisons between models (contextbias.comparisons): the families, the
estimates by hand, the paired role-bootstrap replicates behind the standard errors."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from stereolens.contextbias.bootstrap import bootstrap_frame, cluster_bootstrap, level_replicates
from stereolens.contextbias.comparisons import model_comparisons
from stereolens.contextbias.intervals import t_factor, withheld_note
from stereolens.metrics.compare import COMPARISON_COLUMNS, RANK_COLUMNS

H_QUARTER = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
BI_QUARTER = 1 - H_QUARTER / np.log(2)  # 0.188722: a 6 / 2 split of two labels


def _table():
    """Two generators, roles a and b, 4 images per role and condition. Gender: m1 CF role a
    4 female, role b 2 female 2 male (pooled 6 / 2: BI .188722), CA-R and CA-U 2 / 2 in both
    roles (BI 0); m2 2 / 2 everywhere (BI 0). Framing: 'wide' on every image (K = 1: BI 0)."""
    att, img = [], []
    for m in ("m1", "m2"):
        for r in ("a", "b"):
            for c in ("CF", "CA-R", "CA-U"):
                female = 4 if (m, r, c) == ("m1", "a", "CF") else 2
                for i in range(4):
                    base = {"model": m, "role": r, "condition": c, "image_id": f"{m}{r}{c}{i}"}
                    img.append({**base, "status": "ok"})
                    g = "female" if i < female else "male"
                    att.append(
                        {**base, "cohort": "people", "dimension": "gender_presentation",
                         "label": g}
                    )  # fmt: skip
                    att.append(
                        {**base, "cohort": "camera", "dimension": "framing", "label": "wide"}
                    )
    return pl.DataFrame(att), pl.DataFrame(img)


def _row(frame, **eq):
    out = frame.filter(pl.all_horizontal(pl.col(k) == v for k, v in eq.items()))
    assert out.height == 1, out
    return out.row(0, named=True)


def test_comparison_families_and_hand_values():
    att, _ = _table()
    lv = level_replicates(att, replicates=400, seed=3)
    assert lv.replicates.shape == (2, 400, len(lv.levels), 3)
    cmp, rk = model_comparisons(lv, min_roles=1)
    assert cmp.columns == COMPARISON_COLUMNS
    assert rk.columns == RANK_COLUMNS + ["interval_note"]
    assert cmp["interval_note"].is_null().all() and rk["interval_note"].is_null().all()
    scopes = {f"{c} / {s}" for c in ("CF", "CA-R", "CA-U") for s in ("overall", "people", "camera")}
    assert set(cmp.filter(pl.col("metric") == "bi")["scope"]) == scopes
    assert set(cmp.filter(pl.col("metric") == "bi_shift")["scope"]) == {
        f"CA-U - CF / {s}" for s in ("overall", "people", "camera")
    }
    assert cmp.height == 12 and rk.height == 24 and cmp["paired"].all()
    assert set(cmp["resampling"]) == {"role cluster bootstrap (one role draw shared by all models)"}
    people = _row(cmp, metric="bi", scope="CF / people")
    assert (people["model_a"], people["model_b"]) == ("m1", "m2")
    assert people["estimate_a"] == pytest.approx(BI_QUARTER, abs=1e-12)
    assert people["estimate_b"] == pytest.approx(0.0, abs=1e-12)
    assert people["difference"] == pytest.approx(-BI_QUARTER, abs=1e-12)
    # overall = the mean of the cohort means: (.188722 + 0) / 2; the shift CA-U - CF = -that
    overall = _row(cmp, metric="bi", scope="CF / overall")
    assert overall["estimate_a"] == pytest.approx(BI_QUARTER / 2, abs=1e-12)
    shift = _row(cmp, metric="bi_shift", scope="CA-U - CF / overall")
    assert shift["estimate_a"] == pytest.approx(-BI_QUARTER / 2, abs=1e-12)
    assert shift["difference"] == pytest.approx(BI_QUARTER / 2, abs=1e-12)
    # the replicates: a draw of roles (a, a) gives m1 BI 1, (a, b) .188722, (b, b) 0; m2 is
    # 0 in every draw; se = the sd of the paired replicate differences
    i_people = lv.levels.index(("people", "*"))
    m1 = lv.replicates[0, :, i_people, 0]
    assert set(np.round(m1, 6)) == {1.0, round(BI_QUARTER, 6), 0.0}
    assert np.allclose(lv.replicates[1, :, i_people, 0], 0.0)
    assert people["se"] == pytest.approx(np.std(-m1, ddof=1), abs=1e-12)
    assert people["ci_low"] == pytest.approx(-BI_QUARTER - 1.959964 * people["se"], abs=1e-5)
    # the framing cohort is identical (BI 0 everywhere): difference 0, se 0, p 1
    cam = _row(cmp, metric="bi", scope="CA-U / camera")
    assert cam["difference"] == 0 and cam["se"] == 0 and cam["p_value"] == 1
    # ranks: m2 (BI 0) ranks first on CF / people
    assert _row(rk, metric="bi", scope="CF / people", model="m2")["rank"] == 1
    # the same replicates as bootstrap.parquet: its CA-U - CF interval from lv's arrays
    boot = bootstrap_frame(lv, "basic", min_roles=1)
    assert boot.equals(
        cluster_bootstrap(att, replicates=400, seed=3, interval="basic", min_roles=1)
    )
    d = lv.replicates[0, :, i_people, 2] - lv.replicates[0, :, i_people, 0]
    b = _row(boot, model="m1", cohort="people", dimension="*", comparison="CA-U - CF")
    # interval "basic": 2 x estimate - the 97.5 and 2.5 percentiles; estimate_bc =
    # 2 x estimate - the replicates' mean; "percentile" = the percentiles themselves
    assert b["estimate"] == pytest.approx(-BI_QUARTER, abs=1e-12) and b["interval"] == "basic"
    assert b["ci_low"] == pytest.approx(-2 * BI_QUARTER - np.percentile(d, 97.5), abs=1e-12)
    assert b["ci_high"] == pytest.approx(-2 * BI_QUARTER - np.percentile(d, 2.5), abs=1e-12)
    assert b["estimate_bc"] == pytest.approx(-2 * BI_QUARTER - d.mean(), abs=1e-12)
    assert b["boot_mean"] == pytest.approx(d.mean(), abs=1e-12)
    # default "bc-t": estimate_bc +- t(R - 1) sqrt(R / (R - 1)) sd; 2 roles: 12.7062 x 1.41421
    bct = _row(
        bootstrap_frame(lv, min_roles=1),
        model="m1", cohort="people", dimension="*", comparison="CA-U - CF",
    )  # fmt: skip
    assert bct["interval"] == "bc-t" and t_factor(2) == pytest.approx(17.969287, abs=1e-6)
    half = 17.969287064 * np.std(d, ddof=1)
    assert bct["ci_low"] == pytest.approx(b["estimate_bc"] - half, abs=1e-8)
    assert bct["ci_high"] == pytest.approx(b["estimate_bc"] + half, abs=1e-8)
    pct = _row(
        bootstrap_frame(lv, "percentile", min_roles=1),
        model="m1", cohort="people", dimension="*", comparison="CA-U - CF",
    )  # fmt: skip
    assert pct["ci_low"] == pytest.approx(np.percentile(d, 2.5), abs=1e-12)
    assert pct["ci_high"] == pytest.approx(np.percentile(d, 97.5), abs=1e-12)
    assert pct["estimate_bc"] == b["estimate_bc"] and pct["interval"] == "percentile"
    with pytest.raises(ValueError, match="interval"):
        bootstrap_frame(lv, "bca")


def test_intervals_withheld_below_the_minimum_roles():
    att, _ = _table()
    lv = level_replicates(att, replicates=50, seed=1)
    note = "withheld: 2 roles < 10 (the smallest number of roles at which the role bootstrap's "
    note += "intervals cover as at paper scale, bench/COVERAGE.md)"
    assert withheld_note(2, 10) == note and withheld_note(10, 10) is None
    boot = bootstrap_frame(lv)  # default: intervals from 10 roles
    assert boot["ci_low"].is_null().all() and boot["ci_high"].is_null().all()
    assert set(boot["interval_note"]) == {note} and boot["estimate"].is_not_null().all()
    shown = bootstrap_frame(lv, min_roles=2)
    assert shown["interval_note"].is_null().all() and shown["ci_low"].is_not_null().any()
    cmp, rk = model_comparisons(lv)
    for c in ("ci_low", "ci_high", "p_value", "p_adjusted", "reject"):
        assert cmp[c].is_null().all(), c
    assert cmp["difference"].is_not_null().all() and cmp["se"].is_not_null().all()
    assert set(cmp["interval_note"]) == {note} and set(rk["interval_note"]) == {note}
    for c in ("rank_low", "rank_high", "group"):
        assert rk[c].is_null().all(), c
    assert rk["rank"].is_not_null().all()


def test_common_support_hand_values():
    """Two identical roles (every replicate equals the estimate: the bias correction is 0,
    se 0). items (open vocabulary): m1 shows cup 3 : pen 1 per role, m2 only cup; gender
    (closed, K = 3 in the schema): m1 female 3 : male 1, m2 2 : 2. Own K: m1 items K 2 (BI
    .188722), m2 K 1 (BI 0); gender K 2: .188722 and 0. Common K: items 2 (the labels either
    model shows), m2 BI 1 - 0 / log 2 = 1; gender 3: m1 1 - H(.75, .25) / log 3 = .488046,
    m2 1 - log 2 / log 3 = .369070."""
    att = []
    for m in ("m1", "m2"):
        for r in ("a", "b"):
            for c in ("CF", "CA-R", "CA-U"):
                for i in range(4):
                    base = {"model": m, "role": r, "condition": c, "image_id": f"{m}{r}{c}{i}"}
                    item = "pen" if (m == "m1" and i == 3) else "cup"
                    sex = "male" if (i == 3 or (m == "m2" and i == 2)) else "female"
                    att.append({**base, "cohort": "objects", "dimension": "items", "label": item})
                    att.append(
                        {**base, "cohort": "people", "dimension": "gender_presentation",
                         "label": sex}
                    )  # fmt: skip
    att = pl.DataFrame(att)
    own, _ = model_comparisons(level_replicates(att, replicates=20), min_roles=1)
    lv = level_replicates(att, replicates=20, support="common")
    cmp, _ = model_comparisons(lv, min_roles=1)
    assert "K common to the compared models; bias-corrected" in cmp["resampling"][0]
    items = _row(cmp, metric="bi", scope="CF / objects")
    assert items["estimate_a"] == pytest.approx(BI_QUARTER, abs=1e-12)
    assert items["estimate_b"] == pytest.approx(1.0, abs=1e-12)
    assert _row(own, metric="bi", scope="CF / objects")["estimate_b"] == 0.0
    people = _row(cmp, metric="bi", scope="CF / people")
    assert people["estimate_a"] == pytest.approx(1 - H_QUARTER / np.log(3), abs=1e-12)
    assert people["estimate_b"] == pytest.approx(1 - np.log(2) / np.log(3), abs=1e-12)
    assert people["estimate_a"] == pytest.approx(0.488140, abs=1e-6)
    assert people["difference"] == pytest.approx(-0.119071, abs=1e-6) and people["se"] == 0
    # overall = mean of the cohorts: m1 (.188722 + .488046) / 2, m2 (1 + .369070) / 2
    overall = _row(cmp, metric="bi", scope="CF / overall")
    assert overall["difference"] == pytest.approx(
        (1 + 0.369070 - 0.188722 - 0.488140) / 2, abs=1e-6
    )
    with pytest.raises(ValueError, match="support"):
        level_replicates(att, replicates=5, support="union")


def test_unpaired_draws_and_extractor_families():
    att, _ = _table()
    cmp, _ = model_comparisons(level_replicates(att, replicates=50, draws="unpaired"))
    assert not cmp["paired"].any() and "a draw per model" in cmp["resampling"][0]
    # two extractors reading the same images: generator families per extractor, and
    # extractor families per generator (models = extractors)
    y = att.with_columns(
        pl.when(
            (pl.col("model") == "m2")
            & (pl.col("dimension") == "gender_presentation")
            & (pl.col("condition") == "CF")
        )
        .then(pl.lit("female"))
        .otherwise(pl.col("label"))
        .alias("label")
    )
    both = pl.concat([att.with_columns(pl.lit("x").alias("extractor")),
                      y.with_columns(pl.lit("y").alias("extractor"))])  # fmt: skip
    both = both.unique(maintain_order=True)
    cmp, rk = model_comparisons(level_replicates(both, replicates=50))
    gen = cmp.filter(pl.col("metric") == "bi")
    assert set(gen["scope"].str.split(" / ").list.first()) == {"x", "y"}
    ext = _row(cmp, metric="bi_extractor", scope="m2 / CF / people")
    # extractor y reads every m2 CF person as female (K 2 from CA-R/CA-U): BI 1 vs 0
    assert (ext["model_a"], ext["model_b"]) == ("x", "y")
    assert ext["difference"] == pytest.approx(1.0, abs=1e-12)
    assert set(cmp["metric"]) == {"bi", "bi_shift", "bi_extractor", "bi_shift_extractor"}
    assert rk.height == 2 * cmp.height
    # support "common" (the CLI's): one K for both extractors, gender's vocabulary (3); m2's
    # roles are alike, so the bias correction is 0: y 1 - 0 = 1, x 1 - log 2 / log 3
    common, _ = model_comparisons(
        level_replicates(both, replicates=50, support="common"), min_roles=1
    )
    ext = _row(common, metric="bi_extractor", scope="m2 / CF / people")
    assert ext["estimate_b"] == pytest.approx(1.0, abs=1e-12)
    assert ext["difference"] == pytest.approx(np.log(2) / np.log(3), abs=1e-12)


def test_jackknife_se_hand_value():
    """Leave-one-role-out values 1, 2, 3, 4: mean 2.5, squared deviations 2.25 + 0.25 + 0.25
    + 2.25 = 5, se = sqrt(3 / 4 x 5) = 1.936492; a NaN value is left out; one value: NaN."""
    from stereolens.contextbias.comparisons import jackknife_se

    assert jackknife_se(np.array([1.0, 2, 3, 4])) == pytest.approx(1.936492, abs=1e-6)
    assert jackknife_se(np.array([1.0, np.nan, 2, 3, 4])) == pytest.approx(1.936492, abs=1e-6)
    assert np.isnan(jackknife_se(np.array([1.0])))


def test_t_wald_hand_values():
    """10 roles; the jackknife differences b - a and c - a deviate by +-c (five each) from
    their mean, so se = sqrt(9 / 10 x 10 c^2) = 3c = 0.04 at c = 0.04 / 3. t(9) 97.5% =
    2.262157: d 0.1: ci 0.1 +- 0.090486, t = 2.5, p = 2 P(T9 > 2.5) = 0.033862; d 0.02: t =
    0.5, p = 0.629071; Holm: 2 x 0.033862 = 0.067724, then max(0.067724, 0.629071)."""
    from stereolens.contextbias.comparisons import _t_wald

    dev = 0.04 / 3 * np.array([1.0, -1] * 5)
    jack = {"a": np.zeros(10), "b": 0.1 + dev, "c": 0.02 - dev}
    frame = pl.DataFrame(
        {"model_a": ["a", "a"], "model_b": ["b", "c"], "difference": [0.1, 0.02], "se": [9.0, 9.0]}
    )
    out = _t_wald(frame, 10, 0.95, jack)
    assert out["se"].to_list() == pytest.approx([0.04, 0.04], abs=1e-12)
    assert out["ci_low"].to_list() == pytest.approx([0.009514, -0.070486], abs=1e-6)
    assert out["ci_high"].to_list() == pytest.approx([0.190486, 0.110486], abs=1e-6)
    assert out["p_value"].to_list() == pytest.approx([0.033862, 0.629071], abs=1e-6)
    assert out["p_adjusted"].to_list() == pytest.approx([0.067724, 0.629071], abs=1e-6)
    assert out["reject"].to_list() == [False, False]
