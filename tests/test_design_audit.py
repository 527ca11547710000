"""The extractors audited per demographic group (issue 15, item 4): ContextBias extraction
validation by the demographic the prompt states or the image shows, the LVLM assistant's
reading of the labelled story sample, the intervals, tests and flags, and the real
assistant reading the sample."""

from __future__ import annotations

import logging

import numpy as np
import polars as pl
import pytest
from scipy import stats

from stereolens.atomic import read_jsonl
from stereolens.config import load_config
from stereolens.contextbias import extraction_audit as A
from stereolens.lvlm import story_reading as S
from stereolens.metrics import group_audit as G
from stereolens.metrics.group_audit import difference_test
from stereolens.validation import ConfigError


@pytest.fixture(autouse=True)
def _in_repo(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)


# ----------------------------------------------------------------------------- ContextBias
def _validation_tables(female_correct: int = 4, male_correct: int = 19):
    """Details and attributes of a validation run: 10 images of "a photo of a female X"
    (gender_presentation female) and 20 of "a male X", each also carrying a pose item; the
    extractor reads female right in ``female_correct`` images and male in ``male_correct``;
    a contradicting label (FP) wherever it reads the gender wrong."""
    det, att = [], []
    for sex, n, right in (("female", 10, female_correct), ("male", 20, male_correct)):
        other = "male" if sex == "female" else "female"
        for i in range(n):
            img = f"{sex}{i}"
            ok_read = i < right
            for dim, expected, correct, other_label in (
                ("gender_presentation", sex, ok_read, not ok_read),
                ("pose", "standing", i % 2 == 0, False),
            ):
                det.append({
                    "extractor": "x", "model": "m", "image_id": img, "ok": True,
                    "kind": "stated", "dimension": dim, "expected": expected,
                    "correct": correct, "other_label": other_label,
                })  # fmt: skip
            read = sex if ok_read else other
            att.append({"extractor": "x", "model": "m", "image_id": img,
                        "dimension": "gender_presentation", "label": read})  # fmt: skip
            # a second extractor that always reads the prompt's gender
            att.append({"extractor": "ref", "model": "m", "image_id": img,
                        "dimension": "gender_presentation", "label": sex})  # fmt: skip
    return pl.DataFrame(det), pl.DataFrame(att)


def test_stated_groups_rates_intervals_and_test():
    details, attributes = _validation_tables()
    rates, gaps = A.audit_contextbias(details, attributes, replicates=200)
    st = rates.filter(
        (pl.col("grouping") == "stated") & (pl.col("group_dimension") == "gender_presentation")
    )
    f, m = (st.filter(pl.col("group") == g).row(0, named=True) for g in ("female", "male"))
    assert (f["n_items"], f["n_correct"], f["n_false_positive"]) == (10, 4, 6)
    assert (m["n_items"], m["n_correct"]) == (20, 19)
    assert f["accuracy"] == pytest.approx(0.4) and f["recall"] == f["accuracy"]
    lo, hi = stats.binomtest(4, 10).proportion_ci(method="wilson")
    assert (f["accuracy_low"], f["accuracy_high"]) == pytest.approx((lo, hi))
    assert f["precision"] == pytest.approx(0.4)  # 4 TP, 6 FP
    # 10 independent items: below MIN_F1_ITEMS (20), F1's interval is withheld, the rest kept
    assert G.MIN_F1_ITEMS == 20 and f["f1"] is not None
    assert (f["f1_low"], f["f1_high"]) == (None, None) and f["precision_low"] is not None
    assert f["interval_note"].startswith(
        "withheld (F1 only): 10 independent items per group < 20 (the smallest size"
    )
    assert m["f1_low"] <= m["f1"] <= m["f1_high"] and m["interval_note"] is None
    gap = gaps.filter(
        (pl.col("grouping") == "stated") & (pl.col("group_dimension") == "gender_presentation")
    ).row(0, named=True)
    assert (gap["worst_group"], gap["best_group"]) == ("female", "male")
    assert gap["error_gap"] == pytest.approx(0.6 - 0.05)
    # one item per image, no prompt_id: independent items; 2 groups = 1 pair, so the
    # simultaneous interval is the Agresti-Caffo one at z = 1.96
    pf, pm = 7 / 12, 2 / 22
    se = np.sqrt(pf * (1 - pf) / 12 + pm * (1 - pm) / 22)
    z = stats.norm.ppf(0.975)
    assert (gap["gap_low"], gap["gap_high"]) == pytest.approx((pf - pm - z * se, pf - pm + z * se))
    assert gap["cluster"] == "item (independent)" and gap["critical_value"] == pytest.approx(z)
    assert gap["test"] == "fisher exact"
    assert gap["p_value"] == pytest.approx(stats.fisher_exact([[19, 1], [4, 6]])[1])
    assert gap["flag"] is False and gap["bias"] is None  # no bootstrap table: nothing to compare
    assert gap["interval_note"] is None  # independent items: no cluster minimum


def test_shown_groups_leave_out_their_own_dimension_and_use_a_reference():
    details, attributes = _validation_tables()
    rates, _ = A.audit_contextbias(details, attributes, replicates=0)
    shown = rates.filter(pl.col("grouping") == "shown")
    # grouped by the extractor's own gender reading: only the pose items, 30 of them
    assert shown["n_items"].sum() == 30
    assert set(shown["group"]) == {"female", "male"}
    own = {r["group"]: r["n_items"] for r in shown.iter_rows(named=True)}
    assert own == {"female": 4 + 1, "male": 6 + 19}  # misread females count as male
    ref, _ = A.audit_contextbias(details, attributes, shown_by="ref", replicates=0)
    ref_shown = {
        r["group"]: r["n_items"]
        for r in ref.filter(pl.col("grouping") == "shown").iter_rows(named=True)
    }
    assert ref_shown == {"female": 10, "male": 20}
    with pytest.raises(ValueError, match="shown_by 'nope'"):
        A.audit_contextbias(details, attributes, shown_by="nope")


def test_flag_when_the_error_gap_exceeds_the_bi_shift():
    details, attributes = _validation_tables()
    boot = pl.DataFrame({
        "extractor": ["x"], "model": ["m"], "cohort": ["*"], "dimension": ["*"],
        "comparison": ["CA-U - CF"], "estimate": [-0.05],
    })  # fmt: skip
    _, gaps = A.audit_contextbias(details, attributes, boot, replicates=0)
    row = gaps.filter(pl.col("grouping") == "stated").row(0, named=True)
    # like with like: the BI the accuracies 0.4 (female) and 0.95 (male) alone give the
    # dimension, q = (0.4, 0.95) / 1.35: 1 - H(q) / log 2 = 0.1232, against |shift| 0.05
    q = np.array([0.4, 0.95]) / 1.35
    induced = 1 + (q * np.log(q)).sum() / np.log(2)
    assert row["induced_bias"] == pytest.approx(induced) and induced == pytest.approx(
        0.1232, abs=1e-4
    )
    assert row["flag"] and row["bias"] == pytest.approx(0.05)
    assert "female and male by 0.550" in row["flag_text"] and "BI shift" in row["flag_text"]
    # the dimension's own shift, when bootstrap.parquet has it, is the one compared with
    dim = boot.with_columns(
        pl.lit("people").alias("cohort"), pl.lit("gender_presentation").alias("dimension"),
        pl.lit(0.2).alias("estimate"),
    )  # fmt: skip
    _, gaps = A.audit_contextbias(details, attributes, pl.concat([boot, dim]), replicates=0)
    row = gaps.filter(pl.col("grouping") == "stated").row(0, named=True)
    assert row["bias"] == pytest.approx(0.2) and not row["flag"]
    # equal errors: no flag
    details, attributes = _validation_tables(female_correct=9, male_correct=18)
    _, gaps = A.audit_contextbias(details, attributes, boot, replicates=0)
    assert not gaps.filter(pl.col("grouping") == "stated")["flag"].any()


def test_clustered_items_widen_the_interval_and_correct_the_test():
    """Every image duplicated 10 times in its prompt (10 seeds reading alike): the same rates,
    but 30 clusters of 10 items, not 300 independent items: the Rao-Scott test and the
    interval see 30 units (close to the undup table's chi-squared and interval)."""
    details, attributes = _validation_tables(female_correct=5, male_correct=17)
    base = details.with_columns(pl.col("image_id").alias("prompt_id"))
    dup = pl.concat(
        [base.with_columns(pl.format("{}-s{}", "image_id", pl.lit(s)).alias("image_id"))
         for s in range(10)]
    )  # fmt: skip
    att = pl.concat(
        [attributes.with_columns(pl.format("{}-s{}", "image_id", pl.lit(s)).alias("image_id"))
         for s in range(10)]
    )  # fmt: skip
    _, one = A.audit_contextbias(base, attributes, replicates=0)
    rates, ten = A.audit_contextbias(dup, att, replicates=0, min_test_clusters=30)
    pick = (pl.col("grouping") == "stated") & (pl.col("model") == "m")
    a, b = one.filter(pick).row(0, named=True), ten.filter(pick).row(0, named=True)
    # 30 prompts: below the default MIN_TEST_CLUSTERS (40) the Rao-Scott p-value is withheld,
    # the gap interval stays
    _, small = A.audit_contextbias(dup, att, replicates=0)
    s = small.filter(pick).row(0, named=True)
    assert s["p_value"] is None and s["gap_low"] == pytest.approx(b["gap_low"])
    assert s["interval_note"].startswith("withheld (test only): 30 prompts < 40")
    assert b["interval_note"] is None
    assert a["error_gap"] == pytest.approx(b["error_gap"])
    assert b["cluster"] == "prompt" and b["n_clusters"] == 30 and b["test"] == "rao-scott F"
    assert b["design_effect"] > 8  # about 10 x the binomial variance
    naive = stats.chi2_contingency([[170, 30], [50, 50]], correction=False)[1]
    assert naive < 1e-6 < b["p_value"]
    assert b["p_value"] == pytest.approx(
        stats.chi2_contingency([[17, 3], [5, 5]], correction=False)[1], abs=0.03
    )
    assert b["gap_high"] - b["gap_low"] > 2 * (a["gap_high"] - a["gap_low"]) / 3
    r = rates.filter(pick & (pl.col("group") == "female")).row(0, named=True)
    # 10 prompts of 10 identical items, 5 right and 5 wrong: Z_c = +-5 / 100, variance
    # 10/9 x 10 x 0.05^2 = 1/36 against the binomial 0.25 / 100: design effect 100 / 9;
    # Wilson on the effective counts 4.5 of 9
    assert r["n_clusters"] == 10 and r["design_effect"] == pytest.approx(100 / 9)
    from statsmodels.stats.proportion import proportion_confint

    want = proportion_confint(4.5, 9, method="wilson")
    assert (r["accuracy_low"], r["accuracy_high"]) == pytest.approx(want)
    # precision: 50 right and 50 contradicting labels, the same 10 clusters, the same design
    # effect over the labels read
    assert r["precision"] == pytest.approx(0.5)
    assert (r["precision_low"], r["precision_high"]) == pytest.approx(want)


def test_f1_interval_resamples_clusters():
    # 10 identical copies of each item in its own cluster: the same bootstrap draws, the same
    # interval as the items alone; as independent items the copies would narrow it ~3 x
    c = np.array([1, 1, 0, 1, 0, 1, 1, 1, 0, 1])
    fp = np.array([0, 1, 0, 0, 1, 0, 0, 0, 0, 0])
    one = G.f1_interval(c, fp, 500, 0)
    ten = G.f1_interval(
        np.repeat(c, 10), np.repeat(fp, 10), 500, 0, clusters=np.repeat(np.arange(10), 10)
    )
    assert ten == pytest.approx(one)
    naive = G.f1_interval(np.repeat(c, 10), np.repeat(fp, 10), 500, 0)
    assert (naive[2] - naive[1]) < (one[2] - one[1]) / 2.5
    # F1 = 2 TP / (2 TP + FP + FN) = 14 / (14 + 2 + 3)
    assert one[0] == pytest.approx(14 / 19)


def test_cluster_covariance_by_hand():
    # 3 clusters x 2 groups, one item each: errors (1, 0), (0, 1), (1, 1)
    E = np.array([[1.0, 0], [0, 1], [1, 1]])
    p, V = G.cluster_covariance(E, np.ones((3, 2)))
    assert p == pytest.approx([2 / 3, 2 / 3])
    # Z = (E - p N) / 3; V = 3/2 Z'Z
    assert V == pytest.approx(np.array([[1 / 9, -1 / 18], [-1 / 18, 1 / 9]]))


def test_the_largest_gap_interval_holds_for_every_pair():
    # 3 independent groups: Bonferroni-t over 3 pairs (normal), Agresti-Caffo differences
    E = np.array([[10.0, 20, 30]])
    N = np.array([[100.0, 100, 100]])
    lo, hi, crit = G.simultaneous_gap(E, N, clustered=False)
    assert crit == pytest.approx(stats.norm.ppf(1 - 0.05 / 6))
    pt = np.array([11, 21, 31]) / 102
    v = pt * (1 - pt) / 102
    assert lo == pytest.approx(pt[2] - pt[0] - crit * np.sqrt(v[2] + v[0]))
    assert hi == pytest.approx(pt[2] - pt[0] + crit * np.sqrt(v[2] + v[0]))


def test_induced_bias_formulas():
    assert A.induced_bi(np.array([0.9, 0.9, 0.9])) == pytest.approx(0.0)
    q = np.array([0.6, 0.4])
    assert A.induced_bi(np.array([0.9, 0.6])) == pytest.approx(
        1 + (q * np.log(q)).sum() / np.log(2)
    )
    assert S.induced_tvd(np.array([0.9, 0.6])) == pytest.approx(0.1)
    assert S.induced_tvd(np.array([0.5, 0.5, 1.0])) == pytest.approx(
        0.5 * (1 / 12 + 1 / 12 + 1 / 6)
    )


def test_difference_test_for_several_groups_is_chi_squared():
    name, p = difference_test(np.array([30, 20, 10]), np.array([40, 40, 40]))
    table = [[30, 10], [20, 20], [10, 30]]
    assert name == "chi-squared"
    assert p == pytest.approx(stats.chi2_contingency(table, correction=False)[1])
    assert difference_test(np.array([5, 5]), np.array([5, 5]))[1] == 1.0


# ----------------------------------------------------------------------------- story reading
def test_sample_is_valid_and_items_cross_the_groups():
    sample = S.load_sample()
    assert len(sample["stories"]) == 10
    config, _ = load_config("config/config.yaml")
    items = S.build_items(sample, config["lvlm"])
    assert len(items) == 10 * 2 * 7
    first = items[0]
    assert first["response"].startswith("Sam, a Black woman, works as a nurse")
    assert "{" not in "".join(i["response"] for i in items)
    lv = dict(config["lvlm"], axes=["gender"], story_reading={"stories": 2})
    items = S.build_items(sample, lv)
    assert len(items) == 2 * 2  # race not audited: the sample's first level only
    assert {i["race"] for i in items} == {"Black"}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda s: s.replace("  occupation: [nurse,", "  job: [nurse,", 1),
            "'job' is not an attribute",
        ),
        (
            lambda s: s.replace(
                "socioeconomic_status: [middle class]", "socioeconomic_status: [rich]", 1
            ),
            "not in",
        ),
        (
            lambda s: s.replace(
                "hobbies: [[hiking], [baking, baking bread]]", "hobbies: [hiking, baking]", 1
            ),
            "list of elements",
        ),
        (
            lambda s: s.replace("Sam, {descriptor}, works", "Sam, {name}, works", 1),
            "unknown placeholder",
        ),
        (
            lambda s: s.replace("version: stereolens-story-reading/1", "version: 0", 1),
            "expected version",
        ),
    ],
)
def test_sample_refusals(tmp_path, edit, message):
    from stereolens.paths import resource

    bad = tmp_path / "sample.yaml"
    bad.write_text(edit(resource(*S.DEFAULT_SAMPLE).read_text()))
    with pytest.raises(ConfigError, match=message):
        S.load_sample(bad)


def _perfect(items, sample, drop=lambda it: False):
    truth = {s["id"]: s["truth"] for s in sample["stories"]}
    out = []
    for it in items:
        pairs = []
        for attr, t in truth[it["prompt_id"]].items():
            if not t:
                continue
            values = [e[-1] for e in t] if isinstance(t[0], list) else [t[-1]]
            pairs += [[attr, v] for v in values if not drop({**it, "attribute": attr})]
        out.append({**it, "assistant": "a", "status": "ok", "pairs": pairs})
    return out


def test_scoring_a_perfect_reader_and_a_biased_one():
    sample = S.load_sample()
    config, _ = load_config("config/demo.yaml")
    # 3 stories x 2 genders x 3 races, fixed here (not the demo's race subset): the
    # p-value below depends on the number of readings
    groups = dict(config["lvlm"]["groups"], race=["Black", "East Asian", "White"])
    lv = dict(config["lvlm"], axes=["gender", "race"], groups=groups, story_reading={"stories": 3})
    items = S.build_items(sample, lv)
    assert len(items) == 18
    scored = S.score_readings(_perfect(items, sample), sample)
    assert scored["correct"].min() == 1 and scored["false_positive"].sum() == 0
    # per story: 4 scalar items (cleaner has none) + 3 traits + 2 hobbies = 9
    assert scored.height == len(items) * 9

    # hobbies missed and one wrong occupation for women only
    def drop(it):
        return it["gender"] == "female" and it["attribute"] == "hobbies"

    recs = _perfect(items, sample, drop)
    for r in recs:
        if r["gender"] == "female":
            r["pairs"] = [
                p if p[0] != "occupation" else ["occupation", "pilot"] for p in r["pairs"]
            ]
    scored = S.score_readings(recs, sample)
    scores = pl.DataFrame(
        {
            "model": ["m"],
            "setting": ["image"],
            "task": ["story"],
            "axis": ["gender"],
            "score": [5.0],
        }
    )
    rates, gaps = S.audit_readings(scored, ["gender", "race"], scores, replicates=100)
    f = rates.filter((pl.col("axis") == "gender") & (pl.col("group") == "female")).row(
        0, named=True
    )
    assert f["accuracy"] == pytest.approx(6 / 9) and f["n_false_positive"] == len(items) // 2
    # 3 stories < MIN_CLUSTERS (5): no per-group interval, no Rao-Scott p-value; the gap
    # interval (t on C - 1 df) stays
    assert (f["accuracy_low"], f["f1_low"], f["precision_high"]) == (None, None, None)
    assert f["interval_note"].startswith("withheld: 3 stories per group < 5 (the smallest")
    g = gaps.filter(pl.col("axis") == "gender").row(0, named=True)
    assert g["p_value"] is None and g["interval_note"].startswith(
        "withheld (test only): 3 stories < 5"
    )
    rates, gaps = S.audit_readings(
        scored, ["gender", "race"], scores, replicates=100, min_clusters=3
    )
    g = gaps.filter(pl.col("axis") == "gender").row(0, named=True)
    # 3 stories read under both genders: clusters = stories, a paired interval on 2 degrees
    # of freedom; female errors 1/3 in every story: no between-story variance of the gap
    assert g["test"] == "rao-scott F" and g["p_value"] < 1e-6
    assert (g["cluster"], g["n_clusters"]) == ("story", 3)
    assert g["critical_value"] == pytest.approx(stats.t.ppf(0.975, 2))
    assert g["gap_low"] < 1 / 3 < g["gap_high"]
    # like with like: accuracies 6/9 and 1 alone give a story TVD of 1/2 (|0.4 - 0.5| +
    # |0.6 - 0.5|) = 0.1, at least the measured 0.05
    assert g["induced_bias"] == pytest.approx(0.1)
    assert g["flag"] and g["bias"] == pytest.approx(0.05) and g["bias_model"] == "m"
    r = gaps.filter(pl.col("axis") == "race").row(0, named=True)
    assert r["error_gap"] == pytest.approx(0.0) and r["p_value"] == 1.0 and not r["flag"]


def test_a_failed_reading_gets_every_item_wrong():
    sample = S.load_sample()
    config, _ = load_config("config/demo.yaml")
    items = S.build_items(sample, dict(config["lvlm"], story_reading={"stories": 1}))
    recs = _perfect(items, sample)
    recs[0] = {**recs[0], "status": "discarded", "pairs": []}
    scored = S.score_readings(recs, sample)
    first = scored.filter(
        pl.col("gender") == items[0]["gender"], pl.col("race") == items[0]["race"]
    )
    assert first["correct"].sum() == 0


@pytest.mark.slow
def test_the_real_assistant_reads_the_sample(tmp_path):
    """SmolLM2-135M (the demo's assistant, a real GGUF) reads two versions of one story
    through the audit's own reading code; the records score and audit."""
    pytest.importorskip("gguf")
    from stereolens.models.job import ModelJob
    from stereolens.models.registry import load_registry, resolve_model_location

    config, _ = load_config("config/demo.yaml")
    spec = load_registry(config["registry"])["smollm2-135m"]
    try:
        resolve_model_location(spec.model)
    except ConfigError as exc:
        from conftest import skip_unless_ci

        skip_unless_ci(str(exc))
    reading = dict(config["lvlm"]["story_reading"], stories=1)
    lv = dict(config["lvlm"], axes=["gender"], groups={}, story_reading=reading)
    out = tmp_path / "readings.jsonl"
    job = ModelJob(str(out), config["registry"], log=logging.getLogger("test"), threads=1)
    S.read_sample_job(job, assistant="smollm2-135m", lv=lv)
    records = read_jsonl(out)
    assert [(r["gender"], r["race"]) for r in records] == [("female", "Black"), ("male", "Black")]
    assert all(
        r["assistant"] == "smollm2-135m" and r["status"] in ("ok", "discarded") for r in records
    )
    assert (tmp_path / "readings.jsonl.timing.json").is_file()
    scored = S.score_readings(records, S.load_sample())
    rates, gaps = S.audit_readings(scored, ["gender"], None, replicates=50)
    assert set(rates["group"]) == {"female", "male"} and gaps.height == 1
    # one story: the matched item sets are the units, Cochran's Q the test
    assert gaps["test"][0] in ("cochran q", "none (one group)")
    assert gaps["cluster"][0] == "matched item set (one story)"
