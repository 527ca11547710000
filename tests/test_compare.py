"""stereolens.metrics.compare on a fixed table of replicates: differences, Wald intervals from
the bootstrap standard error, Holm's adjustment, rank intervals and groups, hand-computed."""

import numpy as np
import polars as pl
import pytest

from stereolens.metrics.compare import (
    COMPARISON_COLUMNS,
    RANK_COLUMNS,
    WITHHELD,
    compare,
    pairwise,
    withhold,
)

EST = {"a": 0.5, "b": 0.6, "c": 0.9}
REPS = {
    "a": np.array([0.50, 0.50, 0.50, 0.50]),
    "b": np.array([0.55, 0.65, 0.55, 0.65]),
    "c": np.array([0.80, 0.80, 1.00, 1.00]),
}
KW = dict(benchmark="x", metric="m", scope="all", paired=True, resampling="test")


def test_pairwise_hand_computed():
    cmp = pairwise(EST, REPS, better="lower", **KW)
    assert cmp.columns == COMPARISON_COLUMNS
    rows = {(r["model_a"], r["model_b"]): r for r in cmp.iter_rows(named=True)}
    # b - a: replicate differences .05 .15 .05 .15 -> sd sqrt(.01/3)
    ab = rows[("a", "b")]
    assert ab["difference"] == pytest.approx(0.1)
    assert ab["se"] == pytest.approx(0.0577350, rel=1e-5)
    assert (ab["ci_low"], ab["ci_high"]) == pytest.approx((-0.0131586, 0.2131586), rel=1e-5)
    assert ab["p_value"] == pytest.approx(0.0832645, rel=1e-5)
    # c - a: .3 .3 .5 .5 -> sd sqrt(.04/3); c - b: .25 .15 .45 .35 -> sd sqrt(.05/3)
    assert rows[("a", "c")]["p_value"] == pytest.approx(0.000532006, rel=1e-5)
    assert rows[("b", "c")]["p_value"] == pytest.approx(0.0201368, rel=1e-5)
    # Holm: .000532 x 3, .020137 x 2, .083265 x 1
    assert rows[("a", "c")]["p_adjusted"] == pytest.approx(0.00159602, rel=1e-5)
    assert rows[("b", "c")]["p_adjusted"] == pytest.approx(0.0402735, rel=1e-5)
    assert rows[("a", "b")]["p_adjusted"] == pytest.approx(0.0832645, rel=1e-5)
    assert [rows[k]["reject"] for k in [("a", "b"), ("a", "c"), ("b", "c")]] == [
        False,
        True,
        True,
    ]
    assert set(cmp["relation"]) == {"pair"}


def test_ranks_intervals_and_groups():
    _, rk = compare(EST, REPS, better="lower", **KW)
    assert rk.columns == RANK_COLUMNS
    got = {
        r["model"]: (r["rank"], r["rank_low"], r["rank_high"], r["group"])
        for r in rk.iter_rows(named=True)
    }
    # a and b cannot be told apart (ranks 1-2, one group); c is worse than both
    assert got == {"a": (1, 1, 2, 1), "b": (2, 1, 2, 1), "c": (3, 3, 3, 2)}
    # higher is better: the order turns round
    _, rk = compare(EST, REPS, better="higher", **KW)
    got = {
        r["model"]: (r["rank"], r["rank_low"], r["rank_high"], r["group"])
        for r in rk.iter_rows(named=True)
    }
    assert got == {"c": (1, 1, 1, 1), "b": (2, 2, 3, 2), "a": (3, 2, 3, 2)}


def test_variant_against_its_base_and_edge_cases():
    cmp = pairwise(EST, REPS, better="lower", variants={"a": "c"}, **KW)
    row = cmp.filter(cmp["relation"] == "variant_vs_base").row(0, named=True)
    assert (row["model_a"], row["model_b"]) == ("c", "a")
    assert row["difference"] == pytest.approx(-0.4)
    single = pairwise({"a": 0.5}, {"a": REPS["a"]}, better="lower", **KW)
    assert single.height == 0 and single.columns == COMPARISON_COLUMNS
    _, rk = compare({"a": 0.5}, {"a": REPS["a"]}, better="lower", **KW)
    assert rk.row(0, named=True)["metric"] == "m" and rk["rank"].to_list() == [1]
    nan = pairwise({"a": 0.5, "b": np.nan}, REPS, better="lower", **KW)
    assert nan["reject"].to_list() == [False]
    with pytest.raises(ValueError, match="replicate counts differ"):
        pairwise(EST, {**REPS, "c": np.ones(3)}, better="lower", **KW)


def test_withheld_pairs_leave_holms_family_and_keep_their_estimates():
    cmp = pairwise(EST, REPS, better="lower", **KW)  # (a, b), (a, c), (b, c)
    assert cmp["interval_note"].dtype == pl.String and cmp["interval_note"].is_null().all()
    assert withhold(cmp, {}).equals(cmp) and withhold(cmp, {"a": None}).equals(cmp)
    out = withhold(cmp, {"a": NOTE})
    assert out.columns == COMPARISON_COLUMNS
    assert out["interval_note"].to_list() == [NOTE, NOTE, None]
    for c in WITHHELD:
        assert out[c].to_list()[:2] == [None, None], c
    assert out["difference"].to_list() == pytest.approx([0.1, 0.4, 0.3])  # the estimates stay
    assert out["se"].to_list() == cmp["se"].to_list()
    # b - c alone in Holm's family: its adjusted p is its p-value (0.0402735 among three)
    assert out["p_adjusted"][2] == pytest.approx(0.0201368, rel=1e-5)
    assert out["reject"].to_list() == [None, None, True]
    # a pair of two withheld models takes model_a's note; nothing left to adjust
    both = withhold(cmp, {"a": "note a", "c": "note c"})
    assert both["interval_note"].to_list() == ["note a", "note a", "note c"]
    assert both["p_adjusted"].null_count() == 3 and both["reject"].null_count() == 3
    # a pair still tested whose p-value is undefined stays undecided (False), as unwithheld
    nan = {**REPS, "b": np.full(4, np.nan)}
    out = withhold(pairwise(EST, nan, better="lower", **KW), {"c": NOTE})
    assert out["reject"].to_list() == [False, None, None]
    assert out["p_adjusted"].to_list() == [None, None, None]
    # the ranks count only the pairs still tested: c differs from b alone
    _, rk = compare(EST, REPS, withheld={"a": NOTE}, better="lower", **KW)
    got = {
        r["model"]: (r["rank"], r["rank_low"], r["rank_high"], r["group"])
        for r in rk.iter_rows(named=True)
    }
    assert got == {"a": (1, 1, 3, 1), "b": (2, 1, 2, 1), "c": (3, 2, 3, 1)}


def test_withheld_note_wording_of_each_benchmark():
    from stereolens.biasig.formulas import INTERVAL_MIN_WHY
    from stereolens.contextbias.intervals import withheld_note as roles
    from stereolens.lvlm.resample import withheld_note as images
    from stereolens.metrics.withheld import withheld_note

    assert withheld_note(8, 8, "images per subject", INTERVAL_MIN_WHY) is None
    assert withheld_note(7.5, 8, "images per subject", INTERVAL_MIN_WHY) == (
        "withheld: 7.5 images per subject < 8 (the smallest size at which the coverage "
        "benchmark's interval covers >= 93%, bench/COVERAGE.md)"
    )
    assert withheld_note(2.0, 40, "x", "y") == "withheld: 2 x < 40 (y, bench/COVERAGE.md)"
    assert images(30, 30) is None
    assert images(10, 30) == (
        "withheld: 10 images per group < 30 (the smallest size at which the LVLM intervals "
        "cover >= 93%, bench/COVERAGE.md)"
    )
    assert roles(1, 10) == (
        "withheld: 1 role < 10 (the smallest number of roles at which the role bootstrap's "
        "intervals cover as at paper scale, bench/COVERAGE.md)"
    )
    assert roles(3, 10).startswith("withheld: 3 roles < 10 (")


def test_empty_comparison_tables_have_every_column(tmp_path):
    from stereolens.biasig.comparisons import comparison_tables
    from stereolens.metrics.compare import write_comparison_tables

    cmp, rk = comparison_tables({})
    write_comparison_tables([cmp], [rk], tmp_path)
    written = pl.read_parquet(tmp_path / "comparisons.parquet")
    assert written.height == 0 and written.columns == COMPARISON_COLUMNS
    assert written.schema["interval_note"] == pl.String
    assert pl.read_parquet(tmp_path / "ranks.parquet").columns == RANK_COLUMNS


def test_report_first_screen_orders_models_by_group():
    from types import SimpleNamespace

    from stereolens.report import comparisons as rc
    from stereolens.report.inputs import Inputs

    cmp, rk = compare(EST, REPS, better="lower", **KW)
    assert rc.ordering(rk) == "a 0.500 [1-2] ≈ b 0.600 [1-2] < c 0.900 [3]"
    mod = SimpleNamespace(KEY="x", TITLE="X bench")
    inputs = Inputs.from_frames({"x_comparisons": cmp, "x_ranks": rk})
    (block,) = rc.blocks(inputs, [mod])
    assert block.title == "X bench"
    assert block.families[0].decided == "2 of 3 pairs differ (Holm, 5%)"
    section = rc.section(inputs, [mod])
    assert [t.id for s in section.walk() for t in s.tables] == ["x-ranks", "x-comparisons"]
    assert rc.blocks(Inputs.from_frames({}), [mod]) == []
    # a family of one model is left off the first screen; a benchmark with only those says so
    one_cmp, one_rk = compare({"a": 0.5}, {"a": REPS["a"]}, better="lower", **{**KW, "scope": "s"})
    both = Inputs.from_frames(
        {"x_comparisons": pl.concat([cmp, one_cmp]), "x_ranks": pl.concat([rk, one_rk])}
    )
    assert [f.scope for f in rc.blocks(both, [mod])[0].families] == ["all"]
    alone = Inputs.from_frames({"x_comparisons": one_cmp, "x_ranks": one_rk})
    (only,) = rc.blocks(alone, [mod])[0].families
    assert (only.ordering, only.decided) == ("a", "one model in this run: nothing to compare")
    none = Inputs.from_frames({"x_ranks": rk.clear()})
    assert rc.blocks(none, [mod])[0].families[0].decided.startswith("one model")
    assert rc.section(Inputs.from_frames({}), [mod]) is None


def test_holm_equals_statsmodels():
    from statsmodels.stats.multitest import multipletests

    from stereolens.metrics.compare import holm

    rng = np.random.default_rng(3)
    for m in (1, 2, 7, 40):
        p = rng.uniform(0, 0.2, m) ** 2
        np.testing.assert_allclose(holm(p), multipletests(p, method="holm")[1])
    got = holm(np.array([0.01, np.nan, 0.04]))
    np.testing.assert_allclose(got, [0.02, np.nan, 0.04])


def _withheld(cmp: pl.DataFrame, note: str, which=None) -> pl.DataFrame:
    """The contract of a comparison whose design is below the minimum: ci_low, ci_high,
    p_value, p_adjusted and reject null, interval_note says why (``which``: a row mask)."""
    mask = pl.lit(True) if which is None else which
    return cmp.with_columns(
        *[pl.when(mask).then(None).otherwise(pl.col(c)).alias(c)
          for c in ("ci_low", "ci_high", "p_value", "p_adjusted", "reject")],
        pl.when(mask).then(pl.lit(note)).otherwise(None).alias("interval_note"),
    )  # fmt: skip


NOTE = (
    "withheld: 2 images per subject < 20 (the smallest size at which the interval covers "
    ">= 93%, bench/COVERAGE.md)"
)


def test_report_never_counts_a_withheld_test_and_says_so():
    from types import SimpleNamespace

    from stereolens.report import comparisons as rc
    from stereolens.report.inputs import Inputs

    cmp, rk = compare(EST, REPS, better="lower", **KW)
    # every pair withheld: nothing differs, no rank intervals, '?' between the models
    allw = _withheld(cmp, NOTE)
    assert rc.decided(allw) == (
        "the 3 pairs cannot be judged at this size (interval withheld: 2 images per subject < 20)"
    )
    assert rc.ordering(rk, allw) == "a 0.500 ? b 0.600 ? c 0.900"
    # one pair withheld (a, c): the other two are judged, the withheld one is never a 'differs'
    part = _withheld(cmp, NOTE, (pl.col("model_a") == "a") & (pl.col("model_b") == "c"))
    assert rc.decided(part) == (
        "1 of 2 pairs differ (Holm, 5%); 1 pair cannot be judged at this size (interval "
        "withheld: 2 images per subject < 20)"
    )
    assert rc.ordering(rk, part) == "a 0.500 [1-2] ≈ b 0.600 [1-2] < c 0.900 [3]"
    one = _withheld(cmp.filter(pl.col("model_b") == "b"), NOTE)
    assert rc.decided(one).startswith("the pair cannot be judged at this size")
    # the section shows the note in the difference cell and lists the full note
    mod = SimpleNamespace(KEY="x", TITLE="X bench")
    section = rc.section(Inputs.from_frames({"x_comparisons": allw, "x_ranks": rk}), [mod])
    table = [t for s in section.walk() for t in s.tables if t.id == "x-comparisons"][0]
    assert "interval_note" not in table.columns()
    assert table.rows()[0][5].text == "0.100 (interval withheld: 2 images per subject < 20)"
    assert table.withheld_notes() == [NOTE]
    # an older table without interval_note: a null decision alone marks the pair withheld
    old = allw.drop("interval_note")
    assert rc.decided(old) == "the 3 pairs cannot be judged at this size"
    assert rc.decided(cmp) == "2 of 3 pairs differ (Holm, 5%)"


def test_ordering_prints_enough_digits_to_tell_a_significant_pair_apart():
    from stereolens.report import comparisons as rc

    est = {"tiny-sd": 0.85412, "tiny-sd-intervention": 0.85396}
    reps = {
        "tiny-sd": np.array([0.85410, 0.85414, 0.85411, 0.85413]),
        "tiny-sd-intervention": np.array([0.85395, 0.85397, 0.85396, 0.85396]),
    }
    cmp, rk = compare(est, reps, better="lower", **KW)
    assert cmp["reject"].to_list() == [True]
    # 0.854 and 0.854 at 3 decimals, 0.8540 and 0.8541 at 4
    assert rc.ordering(rk, cmp) == "tiny-sd-intervention 0.8540 [1] < tiny-sd 0.8541 [2]"
    # a pair that cannot be told apart keeps 3 decimals even where they print alike
    same = {"a": 0.8541, "b": 0.8542}
    flat = {"a": np.array([0.80, 0.90, 0.80, 0.90]), "b": np.array([0.85, 0.85, 0.85, 0.86])}
    cmp, rk = compare(same, flat, better="lower", **KW)
    assert rc.ordering(rk, cmp) == "a 0.854 [1-2] ≈ b 0.854 [1-2]"
