"""ContextBias comparisons between models (contextbias.comparisons): the families, the
estimates by hand, the paired role-bootstrap replicates behind the standard errors."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from stereolens.contextbias.bootstrap import bootstrap_frame, cluster_bootstrap, level_replicates
from stereolens.contextbias.comparisons import model_comparisons
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
    cmp, rk = model_comparisons(lv)
    assert cmp.columns == COMPARISON_COLUMNS and rk.columns == RANK_COLUMNS
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
    boot = bootstrap_frame(lv)
    assert boot.equals(cluster_bootstrap(att, replicates=400, seed=3))
    d = lv.replicates[0, :, i_people, 2] - lv.replicates[0, :, i_people, 0]
    b = _row(boot, model="m1", cohort="people", dimension="*", comparison="CA-U - CF")
    # default interval "basic": 2 x estimate - the 97.5 and 2.5 percentiles; estimate_bc =
    # 2 x estimate - the replicates' mean; "percentile" = the percentiles themselves
    assert b["estimate"] == pytest.approx(-BI_QUARTER, abs=1e-12) and b["interval"] == "basic"
    assert b["ci_low"] == pytest.approx(-2 * BI_QUARTER - np.percentile(d, 97.5), abs=1e-12)
    assert b["ci_high"] == pytest.approx(-2 * BI_QUARTER - np.percentile(d, 2.5), abs=1e-12)
    assert b["estimate_bc"] == pytest.approx(-2 * BI_QUARTER - d.mean(), abs=1e-12)
    assert b["boot_mean"] == pytest.approx(d.mean(), abs=1e-12)
    pct = _row(
        bootstrap_frame(lv, "percentile"),
        model="m1", cohort="people", dimension="*", comparison="CA-U - CF",
    )  # fmt: skip
    assert pct["ci_low"] == pytest.approx(np.percentile(d, 2.5), abs=1e-12)
    assert pct["ci_high"] == pytest.approx(np.percentile(d, 97.5), abs=1e-12)
    assert pct["estimate_bc"] == b["estimate_bc"] and pct["interval"] == "percentile"
    with pytest.raises(ValueError, match="interval"):
        bootstrap_frame(lv, "bca")


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
