"""ContextBias analyses (paper Sec. 3.5, Tables 2, 3, 8-11, App. E) pinned with hand-computed
values, the paper's CCS examples, scipy agreement and bootstrap determinism."""

import math
from dataclasses import replace

import numpy as np
import polars as pl
import pytest
from scipy import stats

from stereolens.cli import main
from stereolens.contextbias.bootstrap import (
    _bootstrap_data,
    cluster_bootstrap,
    role_multiplicity,
)
from stereolens.contextbias.bootstrap_loop import _bootstrap_loop
from stereolens.contextbias.ccs import (
    CONSISTENCY,
    ccs_mean,
    ccs_table,
    consistency_rule,
    homogeneity,
)
from stereolens.contextbias.metrics import (
    BI_COLUMNS,
    bi_from_parts,
    bi_table,
    pooled_bi,
    role_bi,
)
from stereolens.contextbias.robustness import robustness_summary, robustness_tests
from stereolens.contextbias.settings import ContextBiasSettings
from stereolens.metrics.entropy import bias_intensity

LN2 = math.log(2)
H_31 = 0.75 * math.log(4 / 3) + 0.25 * math.log(4)  # entropy of (.75, .25) = 0.5623351


def _draws(n: int) -> ContextBiasSettings:
    """The paper preset with ``n`` matched-support draws."""
    return replace(ContextBiasSettings.preset(), matched_draws=n)


def _images(spec, dimension="gender_presentation", cohort="people", extra=None):
    """Attributes and images tables from {(model, role, condition): (n, {label: x})}: n
    images, the first x of them carrying the label (labels of one cell in turn)."""
    att, img = [], []
    for (model, role, cond), (n, labels) in spec.items():
        ids = [f"{model}|{role}|{cond}|{i}" for i in range(n)]
        img += [
            {"model": model, "role": role, "condition": cond, "image_id": i, "status": "ok"}
            for i in ids
        ]
        pos = 0
        for label, x in labels.items():
            for i in ids[pos : pos + x]:
                row = {"model": model, "role": role, "condition": cond, "image_id": i}
                att.append({**row, "cohort": cohort, "dimension": dimension, "label": label})
            pos += x
    return pl.DataFrame(att), pl.DataFrame(img)


def _one(frame, **eq):
    out = frame.filter(pl.all_horizontal(pl.col(k) == v for k, v in eq.items()))
    assert out.height == 1, out
    return out.row(0, named=True)


# ----------------------------------------------------------------------------- BI per role
def test_bi_from_parts_matches_bias_intensity():
    for counts, k in (([2, 1, 1], 4), ([2, 1, 1], 3), ([3, 1], 2), ([4, 4], 2), ([7], 1), ([7], 3)):
        c = np.array(counts, dtype=float)
        got = bi_from_parts(c.sum(), (c * np.log(c)).sum(), c.size, k)
        assert got == pytest.approx(bias_intensity(counts, k), abs=1e-12)
    assert np.isnan(bi_from_parts(0.0, 0.0, 0, 3))
    with pytest.raises(ValueError, match="smaller"):
        bi_from_parts(3.0, 0.0, 3, 2)
    # Miller-Madow: (3, 1): H = 0.5623351 + (2 - 1) / (2 * 4) = 0.6873351; / ln 2
    mm = bi_from_parts(4.0, 3 * math.log(3), 2, 2, miller_madow=True)
    assert mm == pytest.approx(1 - (H_31 + 1 / 8) / LN2, abs=1e-12)


@pytest.fixture
def roles():
    # nurse: CF female x3 male x1 (4 images), CA-U female x2 (2 images)
    # carpenter: CF male x2 (2 images), CA-U male x1 female x1 (2 images)
    return _images(
        {
            ("m", "nurse", "CF"): (4, {"female": 3, "male": 1}),
            ("m", "nurse", "CA-U"): (2, {"female": 2}),
            ("m", "carpenter", "CF"): (2, {"male": 2}),
            ("m", "carpenter", "CA-U"): (2, {"male": 1, "female": 1}),
        }
    )


def test_role_bi_hand_values(roles):
    att, img = roles
    bi = role_bi(att, img, matched_draws=1)
    dim = {"dimension": "gender_presentation"}

    def val(aggregation, condition):
        return _one(bi, aggregation=aggregation, condition=condition, **dim)

    # K = 2 (female, male seen for the model). CF: nurse (.75, .25) -> 1 - 0.5623351/ln 2
    # = 0.1887219; carpenter (1) -> 1.0; mean over roles 0.5943609
    assert val("role", "CF")["bi"] == pytest.approx((1 - H_31 / LN2 + 1) / 2, abs=1e-12)
    assert val("role", "CF")["k"] == 2 and val("role", "CF")["n_images"] == 6
    # CA-U: nurse (1) -> 1.0; carpenter (.5, .5) -> 0.0; mean 0.5
    assert val("role", "CA-U")["bi"] == pytest.approx(0.5, abs=1e-12)
    # Miller-Madow CF: nurse H + (2-1)/(2*4) -> 1 - 0.6873351/ln 2 = 0.0083850; carpenter
    # m = 1 -> no correction, 1.0; mean 0.5041925
    mm_cf = (1 - (H_31 + 1 / 8) / LN2 + 1) / 2
    assert val("role_miller_madow", "CF")["bi"] == pytest.approx(mm_cf, abs=1e-12)
    # CA-U: carpenter H = ln 2 + (2-1)/(2*2) -> 1 - (ln 2 + .25)/ln 2 = -0.3606738 (not
    # clipped); nurse 1.0; mean 0.3196631
    mm_cau = (1 + 1 - (LN2 + 0.25) / LN2) / 2
    assert val("role_miller_madow", "CA-U")["bi"] == pytest.approx(mm_cau, abs=1e-12)
    # matched support: nurse cut to min(4, 2) = 2 images per condition, carpenter keeps 2.
    # A CF draw of 2 of nurse's {F, F, F, M} is {F, F} (BI 1) or {F, M} (BI 0): with one draw
    # CF is (1 + 1) / 2 or (0 + 1) / 2; CA-U is unchanged: 0.5
    assert val("role_matched", "CF")["bi"] in (pytest.approx(1.0), pytest.approx(0.5))
    assert val("role_matched", "CA-U")["bi"] == pytest.approx(0.5, abs=1e-12)
    assert val("role_matched", "CF")["n_images"] == 4  # 2 + 2 subsampled images
    # over many draws nurse's CF BI averages P({F, F}) = 3/6 -> matched CF about 0.75
    many = role_bi(att, img, matched_draws=400, seed=3)
    assert _one(many, aggregation="role_matched", condition="CF", **dim)["bi"] == pytest.approx(
        0.75, abs=0.04
    )
    # seeded: the same seed gives the same subsamples
    assert many.equals(role_bi(att, img, matched_draws=400, seed=3))
    # 'cell' K: carpenter CF has one label -> BI 1; nurse CF K = 2 as before; k column null
    cell = role_bi(att, img, k_definition="cell", matched_draws=1)
    assert _one(cell, aggregation="role", condition="CF", **dim)["k"] is None


def test_bi_table_layout_and_cross_model_rows(roles):
    att, img = roles
    other = att.with_columns(pl.lit("m2").alias("model"))
    other = other.filter(~((pl.col("role") == "nurse") & (pl.col("label") == "male")))
    both = pl.concat([att, other])
    imgs = pl.concat([img, img.with_columns(pl.lit("m2").alias("model"))])
    bi = bi_table(both, imgs, settings=_draws(2))
    assert bi.columns == BI_COLUMNS
    assert bi["aggregation"].unique(maintain_order=True).to_list() == [
        "pooled",
        "role",
        "role_matched",
        "role_miller_madow",
    ]
    assert set(bi["model"]) == {"m", "m2", "*"}
    for agg in ("pooled", "role", "role_matched", "role_miller_madow"):
        for cohort, dimension in (("people", "gender_presentation"), ("*", "*")):
            sel = bi.filter(
                (pl.col("aggregation") == agg)
                & (pl.col("cohort") == cohort)
                & (pl.col("dimension") == dimension)
                & (pl.col("condition") == "CF")
            )
            per = sel.filter(pl.col("model") != "*")
            star = sel.filter(pl.col("model") == "*").row(0, named=True)
            assert star["bi"] == pytest.approx(per["bi"].mean())
            assert star["n_images"] == per["n_images"].sum() and star["k"] is None
    # the pooled rows are exactly pooled_bi's
    pooled = bi.filter((pl.col("aggregation") == "pooled") & (pl.col("model") == "m"))
    assert pooled.equals(pooled_bi(both, imgs).filter(pl.col("model") == "m"))


# ----------------------------------------------------------------------------- homogeneity
def test_homogeneity_hand_value():
    # x = (25, 48, 50) of n = (25, 50, 50): p = 123/125 = .984; n p (1 - p) = .3936, .7872,
    # .7872; x - n p = .4, -1.2, .8 -> chi2 = .16/.3936 + 1.44/.7872 + .64/.7872 = 3.0487805;
    # df 2 -> p = exp(-chi2 / 2) = 0.2177538
    chi2, df, p, tested = homogeneity(np.array([[25, 48, 50]]), np.array([[25, 50, 50]]))
    assert chi2[0] == pytest.approx(3.0487805, abs=1e-7)
    assert df[0] == 2 and tested[0]
    assert p[0] == pytest.approx(math.exp(-3.0487805 / 2), abs=1e-7)
    # skipped: p = 1 (present everywhere), p = 0, one condition with data -> chi2 0, p 1
    chi2, df, p, tested = homogeneity(
        np.array([[5, 5, 5], [0, 0, 0], [3, 0, 0]]), np.array([[5, 5, 5], [5, 5, 5], [6, 0, 0]])
    )
    assert list(chi2) == [0, 0, 0] and list(p) == [1, 1, 1] and not tested.any()
    assert list(df) == [2, 2, 0]


def test_homogeneity_agrees_with_scipy_chi2_contingency():
    rng = np.random.default_rng(7)
    n = rng.integers(20, 200, size=(40, 3))
    x = rng.binomial(n, rng.uniform(0.05, 0.95, size=(40, 1)))
    chi2, df, p, _ = homogeneity(x, n)
    for i in range(len(x)):
        ref = stats.chi2_contingency(np.vstack([x[i], n[i] - x[i]]), correction=False)
        assert chi2[i] == pytest.approx(ref.statistic, rel=1e-10)
        assert df[i] == ref.dof and p[i] == pytest.approx(ref.pvalue, rel=1e-9)
    # two conditions with data (df 1): still Pearson without Yates' correction
    chi2, df, p, _ = homogeneity(np.array([[8, 3, 0]]), np.array([[10, 10, 0]]))
    ref = stats.chi2_contingency(np.array([[8, 3], [2, 7]]), correction=False)
    assert (
        df[0] == 1 and chi2[0] == pytest.approx(ref.statistic) and p[0] == pytest.approx(ref.pvalue)
    )


# ----------------------------------------------------------------------------- CCS
MODELS = ("XL", "3.5", "Flx", "Qwen")


def _paper_tables():
    """Dancer/female and Carpenter/male built to the per-generator values of paper Table 2."""
    spec = {}
    for m in MODELS:
        for c, n in zip(("CF", "CA-R", "CA-U"), (25, 50, 50), strict=True):
            # Dancer: female everywhere, except FLUX.1 CA-R: 48 of 50
            x = 48 if (m == "Flx" and c == "CA-R") else n
            spec[(m, "dancer", c)] = (n, {"female": x, "male": n - x})
        for c, x_flx in zip(("CF", "CA-R", "CA-U"), (30, 28, 29), strict=True):
            # Carpenter: male in 30 of 30 images per condition, FLUX.1 30, 28, 29
            x = x_flx if m == "Flx" else 30
            spec[(m, "carpenter", c)] = (30, {"male": x, "female": 30 - x})
    return _images(spec)


def test_ccs_reproduces_paper_examples():
    att, img = _paper_tables()
    ccs = ccs_table(att, img)
    dancer = _one(ccs, model="Flx", role="dancer", label="female")
    # Prev = 123/125 = 98.4 %; range = 100 (1 - 48/50) = 4 pp; CCS = 98.4 / 5 = 19.68
    assert dancer["prevalence_pct"] == pytest.approx(98.4)
    assert dancer["range_pp"] == pytest.approx(4.0)
    assert dancer["ccs"] == pytest.approx(19.68)
    assert dancer["chi2"] == pytest.approx(3.0487805, abs=1e-7) and dancer["consistent"]
    assert (dancer["x_CF"], dancer["x_CA-R"], dancer["n_CA-R"]) == (25, 48, 50)
    xl = _one(ccs, model="XL", role="dancer", label="female")
    # 100 % everywhere: CCS 100; the test is skipped (p = 1), as in the paper's table
    assert xl["ccs"] == pytest.approx(100.0) and xl["chi2"] == 0 and xl["p"] == 1
    assert xl["consistent"] and not xl["tested"] and xl["p_bh"] == 1
    carp = _one(ccs, model="Flx", role="carpenter", label="male")
    # Prev = 87/90 = 96.667 %; range = 100 (1 - 28/30) = 6.667 pp -> CCS = 96.667 / 7.667
    # = 12.609; not consistent: range > 5 pp
    assert carp["prevalence_pct"] == pytest.approx(100 * 87 / 90)
    assert carp["range_pp"] == pytest.approx(100 * 2 / 30)
    assert carp["ccs"] == pytest.approx((100 * 87 / 90) / (1 + 100 * 2 / 30))
    assert not carp["consistent"]
    mean = ccs_mean(ccs)
    d = _one(mean, role="dancer", label="female")
    # (100 + 100 + 19.68 + 100) / 4 = 79.92 (paper: 79.9, 4/4)
    assert d["ccs_mean"] == pytest.approx(79.92) and round(d["ccs_mean"], 1) == 79.9
    assert (d["n_invariant"], d["n_models"], d["n_ccs"]) == (4, 4, 4)
    assert d["range_pp_mean"] == pytest.approx(1.0)  # paper: Delta-bar = 1.0 pp
    c = _one(mean, role="carpenter", label="male")
    # (100 + 100 + 12.609 + 100) / 4 = 78.152 (paper: 78.2, 3/4)
    assert c["ccs_mean"] == pytest.approx(78.152, abs=1e-3) and round(c["ccs_mean"], 1) == 78.2
    assert c["n_invariant"] == 3
    # minority labels: dancer/male under FLUX.1 (0, 2, 0): not in all conditions -> no CCS
    assert _one(ccs, model="Flx", role="dancer", label="male")["ccs"] is None


def test_ccs_table2_dancer_female_flux_row():
    # paper Table 2, Dancer/female under FLUX.1: n = (20, 60, 50) images, x = (20, 60, 48)
    # with the label. Prev = 128/130 = 98.46 % ("98"); range = 100 (1 - 48/50) = 4.0 pp;
    # p = 128/130, n p (1 - p) = .30296, .90888, .75740; x - n p = .30769, .92308, -1.23077
    # -> chi2 = .31250 + .93750 + 2.00000 = 3.25, df 2, p = exp(-3.25 / 2) = 0.197
    att, img = _images(
        {
            ("Flx", "dancer", "CF"): (20, {"female": 20}),
            ("Flx", "dancer", "CA-R"): (60, {"female": 60}),
            ("Flx", "dancer", "CA-U"): (50, {"female": 48, "male": 2}),
        }
    )
    row = _one(ccs_table(att, img), label="female")
    assert round(row["prevalence_pct"]) == 98
    assert row["prevalence_pct"] == pytest.approx(100 * 128 / 130)
    assert row["range_pp"] == pytest.approx(4.0)
    assert row["chi2"] == pytest.approx(3.25, abs=1e-9) and round(row["chi2"], 2) == 3.25
    assert row["p"] == pytest.approx(math.exp(-3.25 / 2), abs=1e-12)
    assert round(row["p"], 3) == 0.197
    assert row["ccs"] == pytest.approx((100 * 128 / 130) / 5) and round(row["ccs"], 1) == 19.7
    assert row["consistent"]


def test_consistency_and_bh_family_options():
    # label "a": in CF and CA-U only (0 of 100 in CA-R), 1 of 100 each -> range 1 pp, p >
    # .05, but 2 < 5 occurrences: not consistent by default ("released", tb3_pipeline.py's
    # MIN_TOTAL_LABEL_COUNT), consistent under "paper" (p > .05 and range <= 5 pp only);
    # CCS undefined (not in all three conditions), so not under "ccs".
    # label "c": CF 3, CA-R 0, CA-U 2 of 100: 5 occurrences, range 3 pp; pooled p = 1/60,
    # chi2 = sum (x - 100/60)^2 / (100 (1/60)(59/60)) = (1.7778 + 2.7778 + .1111) / 1.63889
    # = 2.84746, df 2, p = exp(-2.84746 / 2) = .24081: consistent by default although it is
    # absent from CA-R (the released "consistent proportions but not present in all 3")
    att, img = _images(
        {
            ("m", "r", "CF"): (100, {"a": 1, "b": 30, "c": 3}),
            ("m", "r", "CA-R"): (100, {"b": 10}),
            ("m", "r", "CA-U"): (100, {"a": 1, "b": 20, "c": 2}),
        }
    )
    released = _one(ccs_table(att, img), label="a")
    assert released["ccs"] is None and released["range_pp"] == pytest.approx(1.0)
    assert released["p"] > 0.05 and not released["consistent"]
    assert _one(ccs_table(att, img, consistency="paper"), label="a")["consistent"]
    assert not _one(ccs_table(att, img, consistency="ccs"), label="a")["consistent"]
    c = _one(ccs_table(att, img), label="c")
    assert c["chi2"] == pytest.approx(2.847457627, abs=1e-8) and c["df"] == 2
    assert c["p"] == pytest.approx(np.exp(-2.847457627 / 2), abs=1e-9)
    assert c["range_pp"] == pytest.approx(3.0) and c["ccs"] is None and c["consistent"]
    assert _one(ccs_table(att, img, consistency="paper"), label="c")["consistent"]
    assert not _one(ccs_table(att, img, consistency="ccs"), label="c")["consistent"]
    # min_count moves the released threshold: 2 occurrences suffice at min_count 2
    assert _one(ccs_table(att, img, min_count=2), label="a")["consistent"]
    # "b" (60 of 300, range 20 pp) is context-sensitive under every rule
    for rule in CONSISTENCY:
        assert not _one(ccs_table(att, img, consistency=rule), label="b")["consistent"]
    assert consistency_rule() == "at least 5 occurrences, p > 0.05 and range <= 5 pp"
    assert consistency_rule("paper") == "p > 0.05 and range <= 5 pp"
    with pytest.raises(ValueError, match="consistency"):
        ccs_table(att, img, consistency="bogus")
    # BH family: "tested" adjusts over the tested rows only; "all" also counts the skipped
    # rows (p = 1), so the family is larger and p_bh can only grow
    att2, img2 = _paper_tables()
    tested = ccs_table(att2, img2).filter(pl.col("model") == "Flx")
    every = ccs_table(att2, img2, bh_family="all").filter(pl.col("model") == "Flx")
    ref = stats.false_discovery_control(every["p"].to_numpy(), method="bh")
    assert np.allclose(every["p_bh"].to_numpy(), ref)
    assert (every["p_bh"].to_numpy() >= tested["p_bh"].to_numpy() - 1e-12).all()
    with pytest.raises(ValueError, match="bh_family"):
        ccs_table(att2, img2, bh_family="bogus")


def test_ccs_columns_bh_and_edge_cases():
    att, img = _paper_tables()
    ccs = ccs_table(att, img)
    for col in (
        "model",
        "role",
        "cohort",
        "dimension",
        "label",
        "prevalence_pct",
        "range_pp",
        "chi2",
        "p",
        "p_bh",
        "ccs",
        "consistent",
    ):
        assert col in ccs.columns
    flx = ccs.filter((pl.col("model") == "Flx") & pl.col("tested"))
    assert flx.height == 4  # female/male of dancer and carpenter
    ref = stats.false_discovery_control(flx["p"].to_numpy(), method="bh")
    assert np.allclose(flx["p_bh"].to_numpy(), ref)
    # fewer than ccs_min_count occurrences -> no CCS; range exactly 5 pp stays consistent
    att2, img2 = _images(
        {
            ("m", "r", "CF"): (20, {"a": 20}),
            ("m", "r", "CA-R"): (20, {"a": 19}),
            ("m", "r", "CA-U"): (20, {"a": 20}),
        }
    )
    # plus item "b" on the first image of each condition (3 occurrences)
    b = att2.filter(pl.col("image_id").str.ends_with("|0")).with_columns(
        pl.lit("objects").alias("cohort"),
        pl.lit("items").alias("dimension"),
        pl.lit("b").alias("label"),
    )
    att2 = pl.concat([att2, b])
    out = ccs_table(att2, img2)
    a = _one(out, label="a")
    # range = 100 (1 - 19/20) = 5.000000000000004 in floating point: still <= 5 pp;
    # chi2 = 2.0339 (p .36) -> consistent
    assert a["range_pp"] == pytest.approx(5.0) and a["consistent"]
    b_row = _one(out, label="b")  # 3 < 5 occurrences: no CCS, and not consistent by default
    assert b_row["ccs"] is None and b_row["p"] == 1 and not b_row["consistent"]
    assert _one(ccs_table(att2, img2, consistency="paper"), label="b")["consistent"]
    b3 = _one(ccs_table(att2, img2, min_count=3), label="b")
    assert b3["ccs"] is not None and b3["consistent"]
    assert not _one(ccs_table(att2, img2, max_range_pp=4.9), label="a")["consistent"]
    # an image without labels still counts in n when the images table is given
    extra = pl.DataFrame(
        [{"model": "m", "role": "r", "condition": "CF", "image_id": "blank", "status": "ok"}]
    )
    n_cf = _one(ccs_table(att2, pl.concat([img2, extra])), label="a")["n_CF"]
    assert n_cf == 21 and _one(ccs_table(att2), label="a")["n_CF"] == 20
    with pytest.raises(ValueError, match="conditions"):
        ccs_table(att2.with_columns(pl.lit("XX").alias("condition")))


# ----------------------------------------------------------------------------- robustness
@pytest.fixture
def robustness_data():
    # roles A, B; 10 images per condition (CF, CA-U); items label x in A: CF 6 (prompt p1:
    # 4 of 5, p2: 2 of 5), CA-U 2; in B: CF 3, CA-U 5; y only in one A image; framing "wide"
    # in every image.
    rows, imgs = [], []
    plan = {
        ("A", "CF"): [("p1", 5, 4), ("p2", 5, 2)],
        ("A", "CA-U"): [("p3", 10, 2)],
        ("B", "CF"): [("q1", 10, 3)],
        ("B", "CA-U"): [("q2", 10, 5)],
    }
    for (role, cond), prompts in plan.items():
        for prompt, n, x in prompts:
            for i in range(n):
                iid = f"{role}{cond}{prompt}{i}"
                base = {
                    "model": "m",
                    "role": role,
                    "condition": cond,
                    "image_id": iid,
                    "prompt_id": prompt,
                    "variant": "phrasing",
                }
                imgs.append({**base, "status": "ok"})
                rows.append({**base, "cohort": "camera", "dimension": "framing", "label": "wide"})
                if i < x:
                    rows.append({**base, "cohort": "objects", "dimension": "items", "label": "x"})
                if role == "A" and cond == "CF" and prompt == "p1" and i == 0:
                    rows.append({**base, "cohort": "objects", "dimension": "items", "label": "y"})
    return pl.DataFrame(rows), pl.DataFrame(imgs)


def test_robustness_hand_values(robustness_data):
    att, img = robustness_data
    tests = robustness_tests(att, img, cells="condition")
    ax = _one(tests, role="A", label="x")
    # q = x in B / images of B = 8/20 = .4; expected A: 10 x .4 = 4 per condition; observed
    # 6, 2 -> chi2 = 4/4 + 4/4 = 2, df 1, p = 0.1572992
    assert ax["q"] == pytest.approx(0.4) and ax["chi2"] == pytest.approx(2.0)
    assert ax["df"] == 1 and ax["p"] == pytest.approx(0.1572992, abs=1e-7) and ax["invariant"]
    assert ax["cf_prevalence"] == pytest.approx(60.0)
    bx = _one(tests, role="B", label="x")
    # q = 8/20 again; observed 3, 5 -> chi2 = 1/4 + 1/4 = .5, p = 0.4795001
    assert bx["chi2"] == pytest.approx(0.5) and bx["p"] == pytest.approx(0.4795001, abs=1e-7)
    aw = _one(tests, role="A", label="wide")
    assert aw["chi2"] == pytest.approx(0.0) and aw["p"] == pytest.approx(1.0)
    ay = _one(tests, role="A", label="y")  # in no other role: q = 0, untested
    assert not ay["tested"] and ay["p"] is None and ay["chi2"] is None
    summary = robustness_summary(tests)
    objects = _one(summary, model="m", cohort="objects")
    assert objects["pct_invariant"] == pytest.approx(100.0)
    assert objects["mean_p"] == pytest.approx((0.1572992 + 0.4795001) / 2, abs=1e-7)
    assert objects["cf_prevalence"] == pytest.approx(45.0)  # (60 + 30) / 2
    assert (objects["n_tuples"], objects["n_untested"]) == (2, 1)
    overall = _one(summary, model="m", cohort="*")
    # four tested tuples: p = .1573, .4795, 1, 1; CF prevalence 60, 30, 100, 100
    assert overall["mean_p"] == pytest.approx((0.1572992 + 0.4795001 + 2) / 4, abs=1e-7)
    assert overall["cf_prevalence"] == pytest.approx(72.5) and overall["n_tuples"] == 4
    star = _one(summary, model="*", cohort="*")
    assert star["pct_invariant"] == overall["pct_invariant"] and star["cells"] == "condition"


def test_robustness_prompt_cells(robustness_data):
    att, img = robustness_data
    ax = _one(robustness_tests(att, img, cells="prompt"), role="A", label="x")
    # cells p1 (5 images, x 4), p2 (5, 2), p3 (10, 2); expected 5 x .4 = 2, 2, 4 ->
    # chi2 = (4-2)^2/2 + 0 + (2-4)^2/4 = 3, df 2 -> p = exp(-1.5) = 0.2231302
    assert ax["chi2"] == pytest.approx(3.0) and ax["df"] == 2
    assert ax["p"] == pytest.approx(math.exp(-1.5))
    variant = _one(robustness_tests(att, img, cells="variant"), role="A", label="x")
    assert variant["chi2"] == pytest.approx(2.0)  # one variant: the same cells as conditions
    with pytest.raises(ValueError, match="variant"):
        robustness_tests(att.drop("variant"), cells="variant")


def _released_data():
    """Roles A and B, 10 images per condition. items x: A (CF 6, CA-R 4, CA-U 2), B (3, 4,
    5); items z only on one image of B CA-U; framing wide and mood calm on every image."""
    plan = {"A": (6, 4, 2), "B": (3, 4, 5)}
    rows, imgs = [], []
    for role, xs in plan.items():
        for cond, x in zip(("CF", "CA-R", "CA-U"), xs, strict=True):
            for i in range(10):
                base = {
                    "model": "m",
                    "role": role,
                    "condition": cond,
                    "image_id": f"{role}{cond}{i}",
                }
                imgs.append({**base, "status": "ok"})
                rows.append({**base, "cohort": "camera", "dimension": "framing", "label": "wide"})
                rows.append({**base, "cohort": "scene", "dimension": "mood", "label": "calm"})
                if i < x:
                    rows.append({**base, "cohort": "objects", "dimension": "items", "label": "x"})
                if role == "B" and cond == "CA-U" and i == 9:
                    rows.append({**base, "cohort": "objects", "dimension": "items", "label": "z"})
    return pl.DataFrame(rows), pl.DataFrame(imgs)


def test_robustness_released_hand_values():
    att, img = _released_data()
    tests = robustness_tests(att, img, cells="released")
    assert set(tests["cells"]) == {"released"}
    # N = 60 images of the model, X(x) = 24. (A, x): CA-R q = (24 - 4) / (60 - 10) = .4,
    # exp 4, obs 4 -> 0; CA-U q = (24 - 2) / 50 = .44, exp 4.4, obs 2 -> 5.76 / 4.4 =
    # 1.3090909; df 1 -> p = 0.2525593
    ax = _one(tests, role="A", label="x")
    assert ax["chi2"] == pytest.approx(5.76 / 4.4) and ax["df"] == 1
    assert ax["p"] == pytest.approx(0.2525593171851649, abs=1e-12) and ax["invariant"]
    assert ax["cf_prevalence"] == pytest.approx(60.0)
    # (B, x): CA-R exp 4 obs 4; CA-U q = (24 - 5) / 50 = .38, exp 3.8, obs 5 -> 1.44 / 3.8
    bx = _one(tests, role="B", label="x")
    assert bx["chi2"] == pytest.approx(1.44 / 3.8)
    assert bx["p"] == pytest.approx(0.538167125969846, abs=1e-12)
    # (A, z): the zero-filled grid tests a label the role never shows: q = 1/50 in both
    # cells, exp .2, obs 0 -> chi2 = .2 + .2 = .4, p = 0.5270893; CF prevalence 0
    az = _one(tests, role="A", label="z")
    assert az["x_role"] == 0 and az["chi2"] == pytest.approx(0.4)
    assert az["p"] == pytest.approx(0.5270892568655381, abs=1e-12) and az["cf_prevalence"] == 0
    # (B, z): CA-U leaves out its own cell, q = (1 - 1) / 50 = 0 -> exp 0, only CA-R is
    # testable -> df 0: untested, counted invariant with p = 1
    bz = _one(tests, role="B", label="z")
    assert not bz["tested"] and bz["p"] == 1.0 and bz["invariant"] and bz["chi2"] is None
    summary = robustness_summary(tests)
    objects = _one(summary, model="m", cohort="objects")
    p_obj = [0.2525593171851649, 0.538167125969846, 0.5270892568655381, 1.0]
    assert objects["mean_p"] == pytest.approx(sum(p_obj) / 4, abs=1e-12)
    assert objects["pct_invariant"] == pytest.approx(100.0)
    assert objects["cf_prevalence"] == pytest.approx((60 + 30 + 0 + 0) / 4)
    assert (objects["n_tuples"], objects["n_untested"]) == (4, 1)
    # "All" (cohort "*"): People, Objects and Camera, not Scene: 4 + 2 tuples
    overall = _one(summary, model="m", cohort="*")
    assert overall["n_tuples"] == 6
    assert overall["mean_p"] == pytest.approx((sum(p_obj) + 2) / 6, abs=1e-12)
    assert _one(summary, model="m", cohort="scene")["n_tuples"] == 2
    assert set(summary["all_cohorts"]) == {"released"}
    # all_cohorts "all": every cohort, Scene's 2 tuples (calm on every image: p = 1) too
    every = _one(robustness_summary(tests, all_cohorts="all"), model="m", cohort="*")
    assert every["n_tuples"] == 8 and every["all_cohorts"] == "all"
    assert every["mean_p"] == pytest.approx((sum(p_obj) + 4) / 8, abs=1e-12)
    # the released family patterns are case-insensitive: "Scene" stays out, "Camera" in
    caps = tests.with_columns(pl.col("cohort").str.to_titlecase())
    assert _one(robustness_summary(caps), model="m", cohort="*")["n_tuples"] == 6
    with pytest.raises(ValueError, match="all_cohorts"):
        robustness_summary(tests, all_cohorts="bogus")
    # today's computation ("condition") on the same data leaves whole roles out and tests
    # every condition: a different p for (A, x)
    cond = _one(robustness_tests(att, img, cells="condition"), role="A", label="x")
    assert cond["p"] != pytest.approx(ax["p"])


# ----------------------------------------------------------------------------- bootstrap
def _bootstrap_table():
    """Two models, four roles, two dimensions in two cohorts, three conditions."""
    rng = np.random.default_rng(11)
    spec_rows, imgs = [], []
    for m in ("m1", "m2"):
        for r in ("a", "b", "c", "d"):
            for cond in ("CF", "CA-R", "CA-U"):
                for i in range(12):
                    iid = f"{m}{r}{cond}{i}"
                    base = {"model": m, "role": r, "condition": cond, "image_id": iid}
                    imgs.append({**base, "status": "ok"})
                    g = rng.choice(["female", "male"], p=[0.8, 0.2] if r in "ab" else [0.3, 0.7])
                    f = rng.choice(["tight", "medium", "wide"])
                    spec_rows.append(
                        {**base, "cohort": "people", "dimension": "gender_presentation", "label": g}
                    )
                    spec_rows.append(
                        {**base, "cohort": "camera", "dimension": "framing", "label": f}
                    )
    return pl.DataFrame(spec_rows), pl.DataFrame(imgs)


def test_role_multiplicity():
    draws = np.array([[0, 0, 2], [1, 2, 2]])
    assert role_multiplicity(draws, 3).tolist() == [[2, 0, 1], [0, 1, 2]]


def test_bootstrap_shape_determinism_and_estimate():
    att, _ = _bootstrap_table()
    boot = cluster_bootstrap(att, replicates=60, seed=0, min_roles=1)
    assert boot.columns == [
        "model",
        "cohort",
        "dimension",
        "comparison",
        "estimate",
        "boot_mean",
        "ci_low",
        "ci_high",
        "replicates",
        "seed",
        "k_definition",
        "overall_definition",
        "draws",
        "estimate_bc",
        "interval",
        "interval_note",
    ]
    # (2 models + "*") x (2 cohorts + all + 2 dimensions) x 3 comparisons
    assert boot.height == 3 * 5 * 3
    assert set(boot["comparison"]) == {"CA-R - CF", "CA-U - CF", "CA-U - CA-R"}
    assert (boot["ci_low"] <= boot["ci_high"]).all()
    assert boot.equals(cluster_bootstrap(att, replicates=60, seed=0, min_roles=1))
    other = cluster_bootstrap(att, replicates=60, seed=1, min_roles=1)
    assert not boot["ci_low"].equals(other["ci_low"])
    # the estimate is the difference of pooled BI values on the original data
    for k in ("model", "cell"):
        pooled = pooled_bi(att, k_definition=k)
        b = cluster_bootstrap(att, replicates=5, k_definition=k)
        for m in ("m1", "m2"):
            for cohort, dim in (("camera", "framing"), ("*", "*"), ("people", "*")):

                def v(cond, m=m, cohort=cohort, dim=dim, pooled=pooled):
                    return _one(pooled, model=m, cohort=cohort, dimension=dim, condition=cond)["bi"]

                row = _one(b, model=m, cohort=cohort, dimension=dim, comparison="CA-U - CF")
                assert row["estimate"] == pytest.approx(v("CA-U") - v("CF"), abs=1e-12)
    star = _one(boot, model="*", cohort="*", dimension="*", comparison="CA-U - CF")
    per = boot.filter(
        (pl.col("model") != "*") & (pl.col("cohort") == "*") & (pl.col("comparison") == "CA-U - CF")
    )
    assert star["estimate"] == pytest.approx(per["estimate"].mean())


def test_bootstrap_against_hand_loop():
    # independent check for one model and dimension: draw roles with the same generator,
    # pool counts, BI via bias_intensity with K = labels seen in the resample, percentiles
    att, _ = _bootstrap_table()
    att = att.filter(pl.col("model") == "m1")
    b_count = 40
    boot = cluster_bootstrap(att, replicates=b_count, seed=5, interval="basic", min_roles=1)
    roles = sorted(att["role"].unique())
    draws = np.random.default_rng(5).integers(0, len(roles), size=(b_count, len(roles)))
    frame = att.filter(pl.col("dimension") == "framing")
    diffs = []
    for b in range(b_count):
        chosen = pl.DataFrame({"role": [roles[i] for i in draws[b]]})
        pooled = chosen.join(frame, on="role")  # a role drawn twice counts twice
        k = pooled["label"].n_unique()
        bi = {
            cond: bias_intensity(
                pooled.filter(pl.col("condition") == cond)["label"]
                .value_counts()["count"]
                .to_list(),
                k,
            )
            for cond in ("CF", "CA-U")
        }
        diffs.append(bi["CA-U"] - bi["CF"])
    row = _one(boot, model="m1", dimension="framing", comparison="CA-U - CF")
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    # the basic interval: 2 x estimate - the 97.5 and 2.5 percentiles
    est = row["estimate"]
    assert row["interval"] == "basic"
    assert row["ci_low"] == pytest.approx(2 * est - hi, abs=1e-12)
    assert row["ci_high"] == pytest.approx(2 * est - lo, abs=1e-12)
    assert row["boot_mean"] == pytest.approx(np.mean(diffs), abs=1e-12)
    assert row["estimate_bc"] == pytest.approx(2 * est - np.mean(diffs), abs=1e-12)
    pct = cluster_bootstrap(att, replicates=b_count, seed=5, interval="percentile", min_roles=1)
    prow = _one(pct, model="m1", dimension="framing", comparison="CA-U - CF")
    assert (prow["ci_low"], prow["ci_high"]) == (pytest.approx(lo, abs=1e-12),
                                                 pytest.approx(hi, abs=1e-12))  # fmt: skip
    # the default bc-t: estimate_bc +- t(R - 1) sqrt(R / (R - 1)) x the replicates' sd
    n_roles = len(roles)
    tf = stats.t.ppf(0.975, n_roles - 1) * np.sqrt(n_roles / (n_roles - 1))
    trow = _one(
        cluster_bootstrap(att, replicates=b_count, seed=5, min_roles=1),
        model="m1", dimension="framing", comparison="CA-U - CF",
    )  # fmt: skip
    assert trow["interval"] == "bc-t" and trow["interval_note"] is None
    bc = 2 * est - np.mean(diffs)
    assert trow["ci_low"] == pytest.approx(bc - tf * np.std(diffs, ddof=1), abs=1e-12)
    assert trow["ci_high"] == pytest.approx(bc + tf * np.std(diffs, ddof=1), abs=1e-12)


def test_bootstrap_vectorised_equals_loop():
    att, _ = _bootstrap_table()
    for k in ("model", "cell", "vocabulary"):
        fast = cluster_bootstrap(att, replicates=25, seed=3, k_definition=k)
        slow = _bootstrap_loop(_bootstrap_data(att, k, None), replicates=25, seed=3)
        assert fast.equals(slow)


def test_bootstrap_overall_definitions():
    att, _ = _bootstrap_table()
    for overall in ("cohort", "dimension"):
        pooled = pooled_bi(att, overall=overall)
        b = cluster_bootstrap(att, replicates=5, overall=overall)
        for m in ("m1", "m2"):

            def v(cond, m=m, pooled=pooled):
                return _one(pooled, model=m, cohort="*", dimension="*", condition=cond)["bi"]

            row = _one(b, model=m, cohort="*", dimension="*", comparison="CA-U - CF")
            assert row["estimate"] == pytest.approx(v("CA-U") - v("CF"), abs=1e-12)
            assert row["overall_definition"] == overall
    # two cohorts of one dimension each: both definitions agree here
    a = cluster_bootstrap(att, replicates=5)
    b = cluster_bootstrap(att, replicates=5, overall="dimension")
    assert np.allclose(a["estimate"].to_numpy(), b["estimate"].to_numpy())


def test_bootstrap_unpaired_draws_against_hand_loop():
    # unpaired: each model x condition draws its own roles from the stream
    # default_rng([seed, stable_id("contextbias-bootstrap", model, condition)])
    from stereolens.ids import stable_id

    att, _ = _bootstrap_table()
    b_count, seed = 30, 2
    # the released design: unpaired draws and percentile intervals
    boot = cluster_bootstrap(
        att, replicates=b_count, seed=seed, draws="unpaired", interval="percentile", min_roles=1
    )
    assert set(boot["draws"]) == {"unpaired"} and set(boot["interval"]) == {"percentile"}
    roles = sorted(att["role"].unique())
    frame = att.filter((pl.col("model") == "m2") & (pl.col("dimension") == "framing"))
    draws = {
        cond: np.random.default_rng(
            [seed, int(stable_id("contextbias-bootstrap", "m2", cond, length=15), 16)]
        ).integers(0, len(roles), size=(b_count, len(roles)))
        for cond in ("CF", "CA-R", "CA-U")
    }
    diffs = []
    for b in range(b_count):
        pooled = {}
        for cond in ("CF", "CA-U", "CA-R"):
            chosen = pl.DataFrame({"role": [roles[i] for i in draws[cond][b]]})
            pooled[cond] = chosen.join(frame.filter(pl.col("condition") == cond), on="role")
        # K ('model'): labels with a positive pooled count in any condition of the resample
        k = pl.concat(list(pooled.values()))["label"].n_unique()
        bi = {
            cond: bias_intensity(pooled[cond]["label"].value_counts()["count"].to_list(), k)
            for cond in ("CF", "CA-U")
        }
        diffs.append(bi["CA-U"] - bi["CF"])
    row = _one(boot, model="m2", dimension="framing", comparison="CA-U - CF")
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    assert row["ci_low"] == pytest.approx(lo, abs=1e-12)
    assert row["ci_high"] == pytest.approx(hi, abs=1e-12)
    assert row["boot_mean"] == pytest.approx(np.mean(diffs), abs=1e-12)
    paired = cluster_bootstrap(att, replicates=b_count, seed=seed, min_roles=1)
    assert paired["estimate"].equals(boot["estimate"])  # the estimate does not resample
    assert not paired["ci_low"].equals(boot["ci_low"])
    # adding a model leaves the others' unpaired draws as they were
    m3 = att.filter(pl.col("model") == "m1").with_columns(pl.lit("m3").alias("model"))
    more = cluster_bootstrap(
        pl.concat([att, m3]), replicates=b_count, seed=seed, draws="unpaired",
        interval="percentile", min_roles=1,
    )  # fmt: skip
    keep = pl.col("model") == "m2"
    assert more.filter(keep).equals(boot.filter(keep))
    with pytest.raises(ValueError, match="draws"):
        cluster_bootstrap(att, replicates=5, draws="bogus")


def test_bootstrap_identical_roles_give_a_point_interval():
    # all roles alike: every replicate pools the same proportions -> CI = estimate
    one = {
        ("m", r, c): (4, {"female": 3, "male": 1} if c == "CF" else {"female": 2, "male": 2})
        for r in ("a", "b", "c")
        for c in ("CF", "CA-R", "CA-U")
    }
    att, _ = _images(one)
    boot = cluster_bootstrap(att, replicates=20, min_roles=1)
    row = _one(boot, model="m", cohort="*", comparison="CA-U - CF")
    # CF: 1 - 0.5623351/ln 2 = .1887219; CA-U: 0 -> -.1887219
    assert row["estimate"] == pytest.approx(-(1 - H_31 / LN2), abs=1e-12)
    assert row["ci_low"] == pytest.approx(row["estimate"], abs=1e-12)
    assert row["ci_high"] == pytest.approx(row["estimate"], abs=1e-12)


# ----------------------------------------------------------------------------- CLI
def test_cli_writes_every_table(tmp_path, robustness_data):
    att, img = _bootstrap_table()
    att.write_parquet(tmp_path / "a.parquet")
    img.write_parquet(tmp_path / "i.parquet")
    out = tmp_path / "out"
    argv = [
        "contextbias",
        "metrics",
        "--attributes",
        str(tmp_path / "a.parquet"),
        "--images",
        str(tmp_path / "i.parquet"),
        "--out",
        str(out),
        "--preset",
        '{"metrics": {"replicates": 30, "matched_draws": 2}}',
    ]
    assert main(argv) == 0
    names = {"bi", "ccs", "ccs_mean", "robustness", "bootstrap", "comparisons", "ranks"}
    assert {p.stem for p in out.glob("*.parquet")} == names
    cmp = pl.read_parquet(out / "comparisons.parquet")
    assert set(cmp["metric"]) == {"bi", "bi_shift"} and cmp.height == 4 * 3  # 3 levels
    assert pl.read_parquet(out / "ranks.parquet").height == 2 * cmp.height
    assert not list(out.glob(".*"))  # no temporary files left behind
    assert pl.read_parquet(out / "bootstrap.parquet")["replicates"][0] == 30
    assert set(pl.read_parquet(out / "bi.parquet")["aggregation"]) == {
        "pooled",
        "role",
        "role_matched",
        "role_miller_madow",
    }
    for col in ("role", "dimension", "label", "ccs_mean", "n_invariant", "n_models"):
        assert col in pl.read_parquet(out / "ccs_mean.parquet").columns
    for col in ("model", "cohort", "pct_invariant", "mean_p", "cf_prevalence", "n_tuples"):
        assert col in pl.read_parquet(out / "robustness.parquet").columns
    # variant cells on a table without a variant column: a clear error, exit code 2
    assert main(argv + ["--robustness-cells", "variant"]) == 2


def test_extractor_column_splits_every_table(robustness_data):
    att, img = _bootstrap_table()
    both = pl.concat([att.with_columns(pl.lit(e).alias("extractor")) for e in ("x", "y")])
    boot = cluster_bootstrap(both, replicates=10)
    assert boot.columns[:2] == ["extractor", "model"]
    assert boot.height == 2 * cluster_bootstrap(att, replicates=10).height
    assert set(boot.filter(pl.col("model") == "*")["extractor"]) == {"x", "y"}
    single = cluster_bootstrap(att, replicates=10)
    assert boot.filter(pl.col("extractor") == "x").drop("extractor").equals(single)
    ccs = ccs_table(both, img)  # images without an extractor count for every extractor
    assert ccs.height == 2 * ccs_table(att, img).height
    assert ccs_mean(ccs)["n_models"].to_list() == [2] * ccs_mean(ccs).height
    bi = bi_table(both, img, settings=_draws(1))
    assert bi.height == 2 * bi_table(att, img, settings=_draws(1)).height
    assert set(bi["extractor"]) == {"x", "y"}
    r_att, r_img = robustness_data
    r_both = pl.concat([r_att.with_columns(pl.lit(e).alias("extractor")) for e in ("x", "y")])
    summary = robustness_summary(robustness_tests(r_both, r_img))
    assert summary.height == 2 * robustness_summary(robustness_tests(r_att, r_img)).height
