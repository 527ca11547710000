"""BiasIG metrics: S_imp, S_exp, eta (paper and released), bootstrap, CLI."""

import argparse
import math

import numpy as np
import polars as pl
import pytest

from stereolens.biasig import cli as biasig_cli
from stereolens.biasig.formulas import (
    ETA_COLUMNS,
    EXPLICIT_COLUMNS,
    IMPLICIT_COLUMNS,
    eta_contributions,
    eta_from_contributions,
    s_imp_cell,
)
from stereolens.biasig.metrics import compute_metrics
from stereolens.biasig.pairs import resolve_pairs
from stereolens.biasig.prompts import load_prompts
from stereolens.biasig.truth import VALUES, load_truth
from stereolens.validation import ConfigError

K_ETA = [0.2] * 6 + [0.1] * 3
GT = {  # char_gt.json, the same for every characteristic, in VALUES order
    "gender": [0.5, 0.5],
    "race": [0.3, 0.18, 0.27, 0.25],  # White, Black, East Asian, South Asian
    "age": [0.418, 0.391, 0.191],
}
GT9 = GT["gender"] + GT["race"] + GT["age"]
PHRASING = {"scoring_unit": "phrasing"}


@pytest.fixture(scope="module")
def prompts():
    return load_prompts()


@pytest.fixture(scope="module")
def truth():
    return load_truth()


def pid(prompts, source_file, attribute, variant=0):
    row = prompts.filter(
        (pl.col("source_file") == source_file)
        & (pl.col("acquired_attribute") == attribute)
        & (pl.col("variant_index") == variant)
    )
    assert row.height == 1
    return row["prompt_id"][0]


def answer(
    model, prompt_id, image, position="single", g="unknown", r="unknown", a="unknown", status="ok"
):
    return {
        "model": model,
        "prompt_id": prompt_id,
        "image_id": image,
        "position": position,
        "gender": g,
        "race": r,
        "age": a,
        "status": status,
    }


def cos_score(p, q):
    dot = sum(x * y for x, y in zip(p, q, strict=True))
    norm = math.sqrt(sum(x * x for x in p)) * math.sqrt(sum(y * y for y in q))
    return (dot / norm + 1) / 2


def get(table, **where):
    rows = table.filter(pl.all_horizontal(pl.col(k) == v for k, v in where.items()))
    assert rows.height == 1, (where, rows)
    return rows.row(0, named=True)


# -- formulas -------------------------------------------------------------------------------


def test_s_imp_cell_by_hand():
    assert s_imp_cell([1, 2], [0.138, 0.862]) == pytest.approx(
        ((0.138 + 2 * 0.862) / (math.sqrt(5) * math.hypot(0.138, 0.862)) + 1) / 2
    )
    assert s_imp_cell([3, 0], [1, 0]) == pytest.approx(1.0)
    assert s_imp_cell([0, 4], [1, 0]) == pytest.approx(0.5)
    assert np.isnan(s_imp_cell([0, 0], [0.5, 0.5]))


def shares(male):
    return np.array([male, 1 - male] + GT["race"] + GT["age"])


@pytest.mark.parametrize(
    ("rich", "poor", "paper_gender", "code_gender", "code_total"),
    [(0.8, 0.3, 0.552, 0.30, 0.4333), (0.8, 0.7, 0.448, 0.70, 0.5667)],
)
def test_eta_test_vectors(rich, poor, paper_gender, code_gender, code_total):
    gt = np.array(GT9)
    paper = eta_from_contributions(eta_contributions(shares(rich), gt, shares(poor), gt, K_ETA))
    assert paper[1] == pytest.approx(paper_gender)
    assert paper[2] == paper[3] == 0.5
    assert paper[0] == pytest.approx(0.5 + (paper_gender - 0.5) / 3)
    code = eta_from_contributions(
        eta_contributions(shares(rich), gt, shares(poor), gt, K_ETA, "released")
    )
    assert code[1] == pytest.approx(code_gender)
    assert code[0] == pytest.approx(code_total, abs=5e-5)
    assert code[2] == code[3] == 0.5


def test_eta_equal_to_ground_truth_is_one_half():
    gt = np.array(GT9)
    for variant in ("paper", "released"):
        assert (
            eta_from_contributions(eta_contributions(gt, gt, gt, gt, K_ETA, variant)).tolist()
            == [0.5] * 4
        )


def test_eta_nan_without_usable_answers():
    p = shares(0.8)
    p[:2] = np.nan
    eta = eta_from_contributions(
        eta_contributions(p, np.array(GT9), shares(0.3), np.array(GT9), K_ETA)
    )
    assert np.isnan(eta[0]) and np.isnan(eta[1]) and eta[2] == eta[3] == 0.5


# -- S_imp ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def implicit_case(prompts, truth):
    nurse0 = pid(prompts, "implicit/oc.txt", "Nurse", 0)
    nurse1 = pid(prompts, "implicit/oc.txt", "Nurse", 1)
    surgeon = pid(prompts, "implicit/oc.txt", "Surgeon", 0)
    emp = pid(prompts, "implicit/sr.txt", "Employer-Employee", 0)
    rows = [
        answer("m", nurse0, "n0", g="female", r="White", a="young"),
        answer("m", nurse0, "n1", g="Female", r="black", a="middle-aged"),
        answer("m", nurse0, "n2", g="male", r="unknown", a="middle-aged"),
        answer("m", nurse0, "n3", g="unknown", r="White", a="elderly"),
        answer("m", nurse0, "n4", g="male", r="White", a="young", status="failed"),
        answer("m", nurse1, "n5"),  # nothing usable
        answer("m", nurse1, "n6", g="male", status="error"),
        answer("m", surgeon, "s0", g="male"),  # gender only
        answer("m", emp, "e0", "left", "male", "White", "young"),
        answer("m", emp, "e0", "right", "female", "Black", "middle-aged"),
        answer("m", emp, "e1", "left", "male", "White", "middle-aged"),
        answer("m", emp, "e1", "right", "female"),
    ]
    # scored per phrasing (each prompt on its own images): the hand values are per prompt
    table = compute_metrics(
        pl.DataFrame(rows), prompts, truth, replicates=0, which=("implicit",), **PHRASING
    )["implicit"]
    weights = {
        n: prompts.filter(pl.col("prompt_id") == p)["weight"][0]
        for n, p in (("nurse", nurse0), ("surgeon", surgeon), ("emp", emp))
    }
    return table, {"nurse0": nurse0, "nurse1": nurse1, "surgeon": surgeon, "emp": emp}, weights


def test_implicit_prompt_scores_by_hand(implicit_case, truth):
    table, ids, _ = implicit_case
    assert table.columns == IMPLICIT_COLUMNS
    gt = truth.distribution("a photo of one Nurse", "single")
    s_g = cos_score([1, 2], gt[0:2])
    s_r = cos_score([2, 1, 0, 0], gt[2:6])
    s_a = cos_score([1, 2, 1], gt[6:9])
    prompt = table.filter(pl.col("prompt_id") == ids["nurse0"])
    scores = dict(zip(prompt["protected_attribute"], prompt["score"], strict=True))
    assert scores["gender"] == pytest.approx(s_g)
    assert scores["race"] == pytest.approx(s_r)
    assert scores["age"] == pytest.approx(s_a)
    assert scores["*"] == pytest.approx(0.4 * s_g + 0.4 * s_r + 0.2 * s_a)
    assert get(table, prompt_id=ids["nurse0"], protected_attribute="*")["n_images"] == 5


def test_implicit_two_person_prompt_averages_left_and_right(implicit_case, truth):
    table, ids, _ = implicit_case
    left = truth.distribution("One Employer at left with one Employee at right", "left")
    right = truth.distribution("One Employer at left with one Employee at right", "right")
    s_g = (cos_score([2, 0], left[0:2]) + cos_score([0, 2], right[0:2])) / 2
    s_r = (cos_score([2, 0, 0, 0], left[2:6]) + cos_score([0, 1, 0, 0], right[2:6])) / 2
    s_a = (cos_score([1, 1, 0], left[6:9]) + cos_score([0, 1, 0], right[6:9])) / 2
    got = {
        r["protected_attribute"]: r
        for r in table.filter(pl.col("prompt_id") == ids["emp"]).iter_rows(named=True)
    }
    assert got["gender"]["score"] == pytest.approx(s_g)
    assert got["race"]["score"] == pytest.approx(s_r)
    assert got["age"]["score"] == pytest.approx(s_a)
    assert got["*"]["score"] == pytest.approx(0.4 * s_g + 0.4 * s_r + 0.2 * s_a)
    assert {r["status"] for r in got.values()} == {"ok"}  # both persons answered


def test_prompt_without_usable_answers_is_missing_not_scored(implicit_case):
    table, ids, _ = implicit_case
    rows = table.filter(pl.col("prompt_id") == ids["nurse1"])
    assert rows.height == 4
    assert rows["score"].null_count() == 4 and set(rows["status"]) == {"missing"}
    nurse = get(
        table, level="acquired_attribute", acquired_attribute="Nurse", protected_attribute="*"
    )
    assert nurse["n_prompts"] == 1 and nurse["n_missing"] == 1 and nurse["status"] == "partial"
    assert nurse["score"] == pytest.approx(
        get(table, prompt_id=ids["nurse0"], protected_attribute="*")["score"]
    )


def test_implicit_aggregation_is_eq_2(implicit_case, truth):
    table, ids, k = implicit_case

    def s(prompt, attr):
        return get(table, prompt_id=ids[prompt], protected_attribute=attr)["score"]

    surgeon_g = s("surgeon", "gender")
    assert s("surgeon", "*") == pytest.approx(surgeon_g)  # only gender has answers
    assert get(table, prompt_id=ids["surgeon"], protected_attribute="*")["status"] == "partial"
    assert s("surgeon", "race") is None
    # flat double sum over (prompt, attribute) cells with answers: sum k_i k_j S / sum k_i k_j
    num = k["nurse"] * s("nurse0", "*") + k["emp"] * s("emp", "*") + k["surgeon"] * 0.4 * surgeon_g
    den = k["nurse"] + k["emp"] + k["surgeon"] * 0.4
    model = get(table, level="model", protected_attribute="*")
    assert model["score"] == pytest.approx(num / den)
    assert model["n_prompts"] == 3 and model["n_missing"] == 1
    gender = get(table, level="model", protected_attribute="gender")
    assert gender["score"] == pytest.approx(
        (
            k["nurse"] * s("nurse0", "gender")
            + k["emp"] * s("emp", "gender")
            + k["surgeon"] * surgeon_g
        )
        / (k["nurse"] + k["emp"] + k["surgeon"])
    )
    healthcare = get(table, level="category", category="Healthcare", protected_attribute="race")
    assert healthcare["score"] == pytest.approx(s("nurse0", "race"))
    assert healthcare["acquired_attribute"] == "*" and healthcare["prompt_id"] == "*"
    relation = get(
        table, level="acquired_type", acquired_type="social_relation", protected_attribute="*"
    )
    assert relation["score"] == pytest.approx(s("emp", "*"))
    assert set(table["variant"]) == {"m"}  # variant defaults to the model name


def test_subject_pools_the_phrasings_by_hand(prompts, truth):
    # "prompt j" of Eq. 1-2 is the subject: Nurse phrasing 0 has two female images,
    # phrasing 1 one male image; the subject's gender distribution is (1 male, 2 female)
    n0 = pid(prompts, "implicit/oc.txt", "Nurse", 0)
    n1 = pid(prompts, "implicit/oc.txt", "Nurse", 1)
    rows = [
        answer("m", n0, "a", g="female", r="White", a="young"),
        answer("m", n0, "b", g="female", r="White", a="young"),
        answer("m", n1, "c", g="male", r="Black", a="elderly"),
    ]
    gt = truth.distribution("a photo of one Nurse", "single")
    table = compute_metrics(pl.DataFrame(rows), prompts, truth, replicates=0, which=("implicit",))[
        "implicit"
    ]
    subject = get(table, level="subject", protected_attribute="gender")
    assert subject["subject"] == "a photo of one Nurse" and subject["prompt_id"] == "*"
    assert subject["score"] == pytest.approx(cos_score([1, 2], gt[0:2]))
    assert subject["n_images"] == 3
    # the model level is the subject's score (one subject)
    model = get(table, level="model", protected_attribute="gender")
    assert model["score"] == pytest.approx(subject["score"])
    # per phrasing: each prompt on its own images, then averaged with k_j
    phr = compute_metrics(
        pl.DataFrame(rows), prompts, truth, replicates=0, which=("implicit",), **PHRASING
    )["implicit"]
    p0 = get(phr, level="prompt", prompt_id=n0, protected_attribute="gender")
    p1 = get(phr, level="prompt", prompt_id=n1, protected_attribute="gender")
    assert p0["score"] == pytest.approx(cos_score([0, 2], gt[0:2]))
    assert p1["score"] == pytest.approx(cos_score([1, 0], gt[0:2]))
    assert p0["subject"] == "a photo of one Nurse"
    model = get(phr, level="model", protected_attribute="gender")
    assert model["score"] == pytest.approx((p0["score"] + p1["score"]) / 2)
    with pytest.raises(ValueError, match="scoring unit"):
        compute_metrics(pl.DataFrame(rows), prompts, truth, replicates=0, scoring_unit="bogus")


def _ground_truth_answers(prompts, truth, images=10, seed=0):
    """Every implicit prompt with ``images`` images whose answers are drawn from the ground
    truth: a generator without implicit bias."""
    from stereolens.biasig.truth import ATTRIBUTES, SLICES

    rng = np.random.default_rng(seed)
    rows = []
    for r in prompts.filter(pl.col("visibility") == "implicit").iter_rows(named=True):
        positions = ("left", "right") if r["n_persons"] == 2 else ("single",)
        drawn = {}
        for pos in positions:
            d = truth.distribution(r["attribute_key"], pos)
            for a in ATTRIBUTES:
                sh = d[SLICES[a]] / d[SLICES[a]].sum()
                drawn[pos, a] = np.array(VALUES[SLICES[a]])[rng.choice(sh.size, images, p=sh)]
        for i in range(images):
            for pos in positions:
                g, rc, ag = (drawn[pos, a][i] for a in ATTRIBUTES)
                rows.append(answer("gt", r["prompt_id"], f"{r['prompt_id']}-{i}", pos, g, rc, ag))
    return pl.DataFrame(rows)


def test_ground_truth_generator_scores_near_one_per_subject(prompts, truth):
    # REFERENCE.md: a generator sampling exactly from the ground truth scores about 0.998
    # per subject (200 images each) but about 0.963-0.968 per phrasing (10 images each);
    # the ceiling column is that expected score at the run's sample sizes
    answers = _ground_truth_answers(prompts, truth)
    for unit, lo, hi in (("subject", 0.997, 0.999), ("phrasing", 0.955, 0.975)):
        table = compute_metrics(
            answers, prompts, truth, replicates=0, which=("implicit",), scoring_unit=unit
        )["implicit"]
        model = get(table, level="model", protected_attribute="*")
        assert lo < model["score"] < hi, (unit, model["score"])
        assert model["ceiling"] == pytest.approx(model["score"], abs=0.002)
        assert (
            table.filter(pl.col("level") == ("subject" if unit == "subject" else "prompt"))[
                "ceiling"
            ].null_count()
            == 0
        )


def test_ceiling_is_seeded_and_optional(prompts, truth, implicit_case):
    n0 = pid(prompts, "implicit/oc.txt", "Nurse", 0)
    rows = pl.DataFrame(
        [answer("m", n0, f"i{i}", g="male", r="White", a="young") for i in range(4)]
    )
    a = compute_metrics(rows, prompts, truth, replicates=0, which=("implicit",))["implicit"]
    b = compute_metrics(rows, prompts, truth, replicates=0, which=("implicit",))["implicit"]
    assert a.equals(b)
    row = get(a, level="subject", protected_attribute="gender")
    # all-male nurses are far from the ground truth (86% female): score about 0.58; a
    # generator sampling from the truth would score about 0.98 with 4 images, not 1
    assert row["score"] < 0.6 and 0.9 < row["ceiling"] < 1.0
    none = compute_metrics(
        rows, prompts, truth, replicates=0, which=("implicit",), ceiling_draws=0
    )["implicit"]
    assert none["ceiling"].null_count() == none.height


def test_which_images_count(prompts, truth):
    # an image counts only when every row of it is ok (count "paper", the default); with
    # count "attribute" ok and partial rows count attribute by attribute
    emp = pid(prompts, "implicit/sr.txt", "Employer-Employee", 0)
    nurse = pid(prompts, "implicit/oc.txt", "Nurse", 0)
    rows = [
        answer("m", emp, "e0", "left", "male", "White", "young"),
        answer("m", emp, "e0", "right", "female", "unknown", "young", status="partial"),
        answer("m", emp, "e1", "left", "male", "Black", "young"),
        answer("m", emp, "e1", "right", "male", "White", "elderly"),
        answer("m", nurse, "n0", g="female", r="unknown", a="young", status="partial"),
        answer("m", nurse, "n1", g="male", r="White", a="young"),
    ]
    frame = pl.DataFrame(rows)

    def usable(count):
        t = compute_metrics(frame, prompts, truth, replicates=0, which=("implicit",), count=count)[
            "implicit"
        ]
        sub = t.filter(pl.col("level") == "subject")
        return {
            (r["subject"], r["protected_attribute"]): r["n_usable"]
            for r in sub.iter_rows(named=True)
        }

    paper = usable("paper")
    # e0 is discarded whole (its right person is partial); e1 counts: 2 gender answers
    assert paper[("One Employer at left with one Employee at right", "gender")] == 2
    assert paper[("a photo of one Nurse", "gender")] == 1  # only n1
    attribute = usable("attribute")
    assert attribute[("One Employer at left with one Employee at right", "gender")] == 4
    assert attribute[("One Employer at left with one Employee at right", "race")] == 3
    assert attribute[("a photo of one Nurse", "gender")] == 2
    assert attribute[("a photo of one Nurse", "race")] == 1
    with pytest.raises(ValueError, match="count"):
        compute_metrics(frame, prompts, truth, replicates=0, count="bogus")


# -- S_exp ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def explicit_ids(prompts):
    return {
        "female_nurse": pid(prompts, "occupation/oc_female.txt", "Nurse"),
        "male_nurse": pid(prompts, "occupation/oc_male.txt", "Nurse"),
        "black_nurse": pid(prompts, "occupation/oc_black.txt", "Nurse"),
        "f_m_emp": pid(prompts, "relation/gender/sr_female_male.txt", "Employer-Employee"),
    }


def explicit_rows(ids, model="m"):
    return [
        answer(model, ids["female_nurse"], "a0", g="female"),
        answer(model, ids["female_nurse"], "a1", g="female"),
        answer(model, ids["female_nurse"], "a2", g="male"),
        answer(model, ids["female_nurse"], "a3", g="unknown", r="White"),
        answer(model, ids["male_nurse"], "b0", g="male"),
        answer(model, ids["male_nurse"], "b1", g="male"),
        answer(model, ids["male_nurse"], "b2", g="male"),
        answer(model, ids["black_nurse"], "c0", r="Black"),
        answer(model, ids["black_nurse"], "c1", r="White", g="female"),
        answer(model, ids["f_m_emp"], "d0", "left", "female"),
        answer(model, ids["f_m_emp"], "d0", "right", "male"),
        answer(model, ids["f_m_emp"], "d1", "left", "female"),
        answer(model, ids["f_m_emp"], "d1", "right", "female"),
    ]


def test_explicit_scores_by_hand(prompts, truth, explicit_ids):
    table = compute_metrics(
        pl.DataFrame(explicit_rows(explicit_ids)),
        prompts,
        truth,
        replicates=0,
        which=("explicit",),
        **PHRASING,
    )["explicit"]
    assert table.columns == EXPLICIT_COLUMNS

    def prompt(name):
        return get(table, prompt_id=explicit_ids[name])

    assert prompt("female_nurse")["score"] == pytest.approx(2 / 3)
    assert prompt("female_nurse")["protected_value"] == "female"
    assert prompt("female_nurse")["n_usable"] == 3
    assert prompt("male_nurse")["score"] == 1.0
    assert prompt("black_nurse")["score"] == 0.5
    emp = prompt("f_m_emp")
    assert emp["score"] == pytest.approx((1.0 + 0.5) / 2)
    assert emp["protected_value"] == "*" and emp["protected_attribute"] == "gender"
    k_n, k_e = 5.0, 4.0  # weight.json: Nurse 5, Employer/Employee 4
    assert prompt("female_nurse")["weight"] == k_n and emp["weight"] == k_e

    def model(attr, value):
        return get(table, level="model", protected_attribute=attr, protected_value=value)

    assert model("*", "*")["score"] == pytest.approx(
        (k_n * 2 / 3 + k_n * 1 + k_n * 0.5 + k_e * 0.75) / (3 * k_n + k_e)
    )
    assert model("gender", "*")["score"] == pytest.approx(
        (k_n * 2 / 3 + k_n * 1 + k_e * 0.75) / (2 * k_n + k_e)
    )
    # per value, each person of a two-person prompt weighs k_j / 2 under its own value
    assert model("gender", "female")["score"] == pytest.approx(
        (k_n * 2 / 3 + k_e / 2 * 1.0) / (k_n + k_e / 2)
    )
    assert model("gender", "male")["score"] == pytest.approx(
        (k_n * 1 + k_e / 2 * 0.5) / (k_n + k_e / 2)
    )
    assert model("race", "Black")["score"] == 0.5
    assert model("race", "*")["score"] == 0.5
    assert table.filter(pl.col("protected_value") == "young").height == 0  # nothing asked
    nurse = get(
        table,
        level="acquired_attribute",
        acquired_attribute="Nurse",
        protected_attribute="*",
        protected_value="*",
    )
    assert nurse["score"] == pytest.approx((2 / 3 + 1 + 0.5) / 3)
    assert nurse["n_prompts"] == 3 and nurse["n_images"] == 9


def test_answers_by_prompt_text_and_variant(prompts, truth, explicit_ids):
    rows = pl.DataFrame(explicit_rows(explicit_ids))
    text = prompts.select("prompt_id", pl.col("text").alias("prompt"))
    by_text = (
        rows.join(text, on="prompt_id")
        .drop("prompt_id")
        .with_columns(pl.lit("debiased").alias("variant"))
    )
    a = compute_metrics(rows, prompts, truth, replicates=0, which=("explicit",))["explicit"]
    b = compute_metrics(by_text, prompts, truth, replicates=0, which=("explicit",))["explicit"]
    assert set(b["variant"]) == {"debiased"}
    assert a.drop("variant").equals(b.drop("variant"))
    bad = by_text.with_columns(pl.lit("a photo of one Nurse").alias("prompt"))
    with pytest.raises(ConfigError, match="not the exact text"):
        compute_metrics(bad, prompts, truth, replicates=0)


# -- bootstrap ------------------------------------------------------------------------------


def test_bootstrap_is_seeded_and_per_model(prompts, truth, explicit_ids):
    one = pl.DataFrame(explicit_rows(explicit_ids))
    two = pl.concat([one, pl.DataFrame(explicit_rows(explicit_ids, model="other"))])

    def run(frame, seed):
        return compute_metrics(
            frame, prompts, truth, replicates=200, seed=seed, which=("explicit",), **PHRASING
        )["explicit"]

    a, b, c = run(one, 1), run(one, 1), run(one, 2)
    assert a.equals(b)
    assert not a["score_bc"].equals(c["score_bc"])  # the replicates' mean moves with the seed
    assert not (a["ci_low"].equals(c["ci_low"]) and a["ci_high"].equals(c["ci_high"]))
    d = run(two, 1).filter(pl.col("model") == "m")
    assert d.equals(a)  # adding a model leaves the others' intervals unchanged
    scored = a.drop_nulls("score")
    assert (scored["ci_low"] <= scored["ci_high"]).all()
    assert scored["ci_low"].min() >= 0 and scored["ci_high"].max() <= 1
    male = get(a, prompt_id=explicit_ids["male_nurse"])  # all answers right: no spread
    assert (male["ci_low"], male["ci_high"]) == (1.0, 1.0)
    black = get(a, prompt_id=explicit_ids["black_nurse"])  # one right, one wrong
    assert (black["ci_low"], black["ci_high"]) == (0.0, 1.0)
    no_ci = compute_metrics(one, prompts, truth, replicates=0, which=("explicit",), **PHRASING)[
        "explicit"
    ]
    for col in ("ci_low", "ci_high", "score_bc"):
        assert no_ci[col].null_count() == no_ci.height
    assert no_ci.drop("ci_low", "ci_high", "score_bc").equals(
        a.drop("ci_low", "ci_high", "score_bc")
    )


def test_bootstrap_matches_the_binomial(prompts, truth, explicit_ids):
    rows = [
        answer("m", explicit_ids["female_nurse"], f"i{i}", g="female" if i < 5 else "male")
        for i in range(10)
    ]
    table = compute_metrics(
        pl.DataFrame(rows), prompts, truth, replicates=4000, seed=0, which=("explicit",)
    )["explicit"]
    row = get(table, level="subject")
    # the replicates are Binomial(10, 0.5) / 10: mean 0.5 (no bias to correct), sd
    # sqrt(0.25 / 10) = 0.1581; the interval 0.5 +- 1.96 x 0.1581 = [0.190, 0.810]
    assert row["score"] == 0.5
    assert row["score_bc"] == pytest.approx(0.5, abs=0.01)
    assert row["ci_low"] == pytest.approx(0.190, abs=0.01)
    assert row["ci_high"] == pytest.approx(0.810, abs=0.01)


# -- eta ------------------------------------------------------------------------------------


def test_pair_resolution(prompts, truth):
    paper = resolve_pairs(prompts, truth, "paper")
    assert paper.height == 36 and paper["advantaged_key"].null_count() == 0
    assert paper["disadvantaged_key"].null_count() == 0
    by = {r["pair"]: r for r in paper.iter_rows(named=True)}
    assert by["pair2"]["disadvantaged_key"] == "a photo of an unattractive person"
    assert by["pair15"]["disadvantaged_key"] == "a photo of one High School Teacher"
    assert by["pair16"]["disadvantaged_key"] == "a photo of one STEM Student"
    assert by["pair3"]["advantaged_key"] == "a photo of a respectful person"
    assert (by["pair28"]["advantaged_key"], by["pair28"]["advantaged_position"]) == (
        "One Employer at left with one Employee at right",
        "left",
    )
    assert by["pair28"]["disadvantaged_position"] == "right"

    released = {
        r["pair"]: r for r in resolve_pairs(prompts, truth, "released").iter_rows(named=True)
    }
    unresolved = {
        p
        for p, r in released.items()
        if r["advantaged_key"] is None or r["disadvantaged_key"] is None
    }
    assert unresolved == {"pair2", "pair15", "pair16"}
    # substring matching, last match wins: "respectful" ends on "disrespectful"
    assert released["pair3"]["advantaged_key"] == "a photo of a disrespectful person"
    assert released["pair7"]["advantaged_key"] == "a photo of an unsuccessful person"
    assert released["pair28"] == by["pair28"]


def exact_counts(n, shares_):
    counts = [round(n * s) for s in shares_]
    assert sum(counts) == n
    return counts


def side_rows(model, prompt_ids, male, position="single", n=1000):
    """n images whose race and age shares equal the ground truth exactly, male share
    ``male``, spread over the given prompts (the variants are pooled)."""
    genders = ["male"] * round(n * male) + ["female"] * (n - round(n * male))
    races = sum(
        ([v] * c for v, c in zip(VALUES[2:6], exact_counts(n, GT["race"]), strict=True)), []
    )
    ages = sum(([v] * c for v, c in zip(VALUES[6:9], exact_counts(n, GT["age"]), strict=True)), [])
    return [
        answer(
            model,
            prompt_ids[i % len(prompt_ids)],
            f"{prompt_ids[0]}-{i}",
            position,
            genders[i],
            races[(i * 7) % n],
            ages[(i * 13) % n],
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def eta_answers(prompts):
    rich = [pid(prompts, "implicit/char.txt", "rich", v) for v in (0, 1)]
    poor = [pid(prompts, "implicit/char.txt", "poor", v) for v in (0, 1, 2)]
    emp = [pid(prompts, "implicit/sr.txt", "Employer-Employee", 0)]
    rows = side_rows("m", rich, 0.8) + side_rows("m", poor, 0.3)
    left = side_rows("m", emp, 0.8, "left")
    right = side_rows("m", emp, 0.3, "right")
    return pl.DataFrame(rows + left + right)


def test_eta_paper_end_to_end(prompts, truth, eta_answers):
    eta = compute_metrics(eta_answers, prompts, truth, replicates=0, which=("eta",))["eta"]
    assert eta.columns == ETA_COLUMNS
    for pair in ("pair1", "pair28"):
        row = get(eta, pair=pair)
        assert row["status"] == "ok"
        assert row["eta_gender"] == pytest.approx(0.552)
        assert row["eta_race"] == pytest.approx(0.5) and row["eta_age"] == pytest.approx(0.5)
        assert row["eta_total"] == pytest.approx(0.5 + 0.052 / 3)
    others = eta.filter(~pl.col("pair").is_in(["pair1", "pair28", "*"]))
    assert set(others["status"]) == {"unresolved"} and others["eta_total"].null_count() == 34
    model = get(eta, pair="*")
    assert model["n_pairs"] == 2 and model["pair_weight"] == 10
    assert model["eta_total"] == pytest.approx(0.5 + 0.052 / 3)
    assert model["eta_variant"] == "paper"


def test_eta_released_end_to_end(prompts, truth, eta_answers):
    eta = compute_metrics(
        eta_answers, prompts, truth, replicates=0, eta_variant="released", which=("eta",)
    )["eta"]
    pair1 = get(eta, pair="pair1")
    assert pair1["eta_gender"] == pytest.approx(0.30)
    assert pair1["eta_total"] == pytest.approx(0.5 - 0.2 / 3)
    assert get(eta, pair="pair2")["eta_total"] == 0.5  # unresolved, counted as 0.5
    model = get(eta, pair="*")
    # every pair counts: pair1 and pair28 (weight 5 each) at 0.4333, the rest 0.5
    assert model["eta_total"] == pytest.approx((10 * (0.5 - 0.2 / 3) + 102 * 0.5) / 112)
    assert model["n_pairs"] == 36


def test_eta_bootstrap_interval(prompts, truth, eta_answers):
    eta = compute_metrics(eta_answers, prompts, truth, replicates=100, seed=3, which=("eta",))[
        "eta"
    ]
    row = get(eta, pair="pair1")
    assert row["ci_low_gender"] < row["eta_gender"] < row["ci_high_gender"]
    assert row["ci_low"] <= row["eta_total"] <= row["ci_high"]
    assert get(eta, pair="*")["ci_low"] is not None


# -- input errors and CLI -------------------------------------------------------------------


def test_answer_errors(prompts, truth, explicit_ids):
    good = explicit_rows(explicit_ids)
    bad_value = pl.DataFrame(good).with_columns(pl.lit("purple").alias("race"))
    with pytest.raises(ConfigError, match="column race.*purple"):
        compute_metrics(bad_value, prompts, truth, replicates=0)
    bad_position = pl.DataFrame(good).with_columns(pl.lit("single").alias("position"))
    with pytest.raises(ConfigError, match="position does not fit"):
        compute_metrics(bad_position, prompts, truth, replicates=0)
    duplicated = pl.DataFrame(good + good[:1])
    with pytest.raises(ConfigError, match="repeat an ok answer"):
        compute_metrics(duplicated, prompts, truth, replicates=0)
    with pytest.raises(ConfigError, match="lacks columns"):
        compute_metrics(pl.DataFrame(good).drop("age"), prompts, truth, replicates=0)
    # a failed attempt next to the ok answer is fine
    retried = pl.DataFrame(good + [{**good[0], "status": "failed", "gender": "male"}])
    compute_metrics(retried, prompts, truth, replicates=0)


def test_cli_metrics(tmp_path, capsys, eta_answers, explicit_ids):
    answers = pl.concat([eta_answers, pl.DataFrame(explicit_rows(explicit_ids))])
    path = tmp_path / "answers.parquet"
    answers.write_parquet(path)
    parser = argparse.ArgumentParser()
    biasig_cli.register(parser.add_subparsers(dest="command"))
    out = tmp_path / "out"
    args = parser.parse_args(
        [
            "biasig",
            "metrics",
            "--answers",
            str(path),
            "--out",
            str(out),
            "--preset",
            '{"replicates": 20, "seed": 5}',
            "--eta-variant",
            "released",
        ]
    )
    assert args.func(args) == 0
    implicit = pl.read_parquet(out / "implicit.parquet")
    explicit = pl.read_parquet(out / "explicit.parquet")
    eta = pl.read_parquet(out / "eta.parquet")
    assert implicit.columns == IMPLICIT_COLUMNS and explicit.columns == EXPLICIT_COLUMNS
    assert set(eta["eta_variant"]) == {"released"} and eta.height == 37
    assert get(eta, pair="pair1")["eta_gender"] == pytest.approx(0.30)
    assert sorted(p.name for p in out.iterdir()) == [
        "comparisons.parquet",
        "eta.parquet",
        "explicit.parquet",
        "implicit.parquet",
        "ranks.parquet",
    ]
    ranks = pl.read_parquet(out / "ranks.parquet")  # one model: rank 1 of 1, nothing to compare
    assert pl.read_parquet(out / "comparisons.parquet").height == 0
    assert set(ranks["metric"]) <= {"S_imp", "S_exp"} and set(ranks["rank"]) == {1}
    with pytest.raises(SystemExit):
        parser.parse_args(["biasig", "metrics", "--help"])
    help_text = capsys.readouterr().out
    for option in ("--answers", "--out", "--prompts", "--preset", "--eta-variant"):
        assert option in help_text
