"""Bias estimates corrected for the reader's errors (stereolens.metrics.reader_correction):
hand-computed PPI shares, their stratified weighting, the off-simplex rule, a corrected BI,
the table checks, and a world of known truth where the naive estimate is biased."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl
import pytest

from stereolens.metrics import human_labels as hl
from stereolens.metrics import reader_correction as rc
from stereolens.metrics import reader_double as rd

ppi_mean_ci = rc.ppi_py.ppi_mean_ci  # ppi_py itself, imported by rc (numba and bench/coverage.py)
ppi_mean_pointestimate = rc.ppi_py.ppi_mean_pointestimate


def _tables(reader_labels, human, strata=None, probability=None):
    """Reader table for items i1.. with ``reader_labels``; human table from {item: label}."""
    n = len(reader_labels)
    ids = [f"i{j + 1}" for j in range(n)]
    strata = strata or ["s"] * n
    reader = pl.DataFrame(
        {"item_id": ids, "attribute": "gender", "label": reader_labels, "stratum": strata}
    )
    where = {v: j for j, v in enumerate(ids)}
    prob = probability or {}
    hum = pl.DataFrame(
        {
            "item_id": list(human),
            "attribute": "gender",
            "label": list(human.values()),
            "stratum": [strata[where[i]] for i in human],
            "selection_probability": [prob.get(i, 0.4) for i in human],
        }
    )
    return reader, hum


# A 2-label cell of N = 10 items: the reader calls 6 women (i1-i6) and 4 men (i7-i10); humans
# label i1 (w), i2 (m), i3 (m), i7 (m).
READER = ["w"] * 6 + ["m"] * 4
HUMAN = {"i1": "w", "i2": "m", "i3": "m", "i7": "m"}


def _by_label(table: pl.DataFrame, column: str) -> dict[str, float]:
    return dict(zip(table["label"], table[column], strict=True))


def test_ppi_share_by_hand():
    # lam = 1 (PPI): share_w = mean over the 10 items of 1[reader = w] = 6/10 = 0.6,
    # plus the rectifier mean over the 4 labelled items of 1[human = w] - 1[reader = w]
    # = ((1 - 1) + (0 - 1) + (0 - 1) + (0 - 0)) / 4 = -0.5  ->  0.6 - 0.5 = 0.1.
    # share_m = 0.4 + ((0 - 0) + (1 - 0) + (1 - 0) + (1 - 1)) / 4 = 0.4 + 0.5 = 0.9.
    reader, human = _tables(READER, HUMAN)
    out = rc.corrected_shares(reader, human, lam="ppi")
    assert _by_label(out, "naive") == pytest.approx({"w": 0.6, "m": 0.4})
    assert _by_label(out, "corrected") == pytest.approx({"w": 0.1, "m": 0.9})
    assert out["n_items"].to_list() == [10, 10] and out["n_human"].to_list() == [4, 4]
    assert not out["off_simplex"].any()
    # CLT interval (ppi_py's, ddof 0): imputed sd sqrt(0.6 x 0.4) / sqrt(10) = 0.154919,
    # rectifier (0, -1, -1, 0): sd 0.5 / sqrt(4) = 0.25; se = sqrt(0.024 + 0.0625) = 0.294109;
    # 0.1 +- 1.959964 x 0.294109 = [-0.476443, 0.676443], clipped to [0, 0.676443].
    w = out.filter(pl.col("label") == "w")
    assert w["ci_low"][0] == 0.0
    assert w["ci_high"][0] == pytest.approx(0.1 + 1.959964 * math.sqrt(0.0865), abs=1e-6)
    assert w["lam"][0] == 1.0


def test_the_same_share_through_ppi_py():
    reader, human = _tables(READER, HUMAN)
    y = np.array([1.0, 0.0, 0.0, 0.0])  # 1[human = w] for i1, i2, i3, i7
    yhat = np.array([1.0, 1.0, 1.0, 0.0])
    yhat_all = np.array([1.0] * 6 + [0.0] * 4)
    assert float(ppi_mean_pointestimate(y, yhat, yhat_all, lam=1)[0]) == pytest.approx(0.1)
    # the tuned estimate is ppi_py's PPI++ estimate with lam=None
    tuned = rc.corrected_shares(reader, human, lam="tuned")
    expected = float(ppi_mean_pointestimate(y, yhat, yhat_all)[0])
    assert _by_label(tuned, "corrected_raw")["w"] == pytest.approx(expected)
    lo, hi = ppi_mean_ci(y, yhat, yhat_all, alpha=0.05, lam=tuned["lam"][0])
    assert _by_label(tuned, "ci_high")["w"] == pytest.approx(float(hi[0]))


def test_tuned_lambda_is_ppi_pys_with_weights():
    rng = np.random.default_rng(3)
    truth = rng.integers(0, 3, 400)
    read = np.where(rng.random(400) < 0.8, truth, rng.integers(0, 3, 400))
    onehot = np.eye(3)
    lab = rng.choice(400, 60, replace=False)
    w = rng.uniform(1.0, 4.0, 60)
    y, yhat, yhat_all = onehot[truth[lab]], onehot[read[lab]], onehot[read]
    lam = rc.tuned_lambda(y, yhat, yhat_all, w)
    assert 0.0 < lam < 1.0
    ours = ppi_mean_pointestimate(y, yhat, yhat_all, lam=lam, w=w)
    theirs = ppi_mean_pointestimate(y, yhat, yhat_all, w=w)
    np.testing.assert_allclose(ours, theirs, atol=1e-12)


def test_stratified_weighting_by_hand():
    # stratum a: i1-i6 (N_a = 6), the reader calls 4 women; labelled i1 (r w, h w) and
    # i2 (r w, h m): rectifier_w = (0 - 1) / 2 = -0.5, share_w = 4/6 - 0.5 = 1/6.
    # stratum b: i7-i10 (N_b = 4), the reader calls 1 woman (i7); labelled i8 (r m, h w)
    # and i9 (r m, h m): rectifier_w = (1 + 0) / 2 = 0.5, share_w = 1/4 + 0.5 = 0.75.
    # combined: 6/10 x 1/6 + 4/10 x 0.75 = 0.1 + 0.3 = 0.4 (naive 5/10 = 0.5).
    labels = ["w", "w", "w", "w", "m", "m", "w", "m", "m", "m"]
    strata = ["a"] * 6 + ["b"] * 4
    human = {"i1": "w", "i2": "m", "i8": "w", "i9": "m"}
    reader, hum = _tables(labels, human, strata)
    out = rc.corrected_shares(reader, hum, lam="ppi")
    assert _by_label(out, "corrected")["w"] == pytest.approx(0.4)
    assert _by_label(out, "naive")["w"] == pytest.approx(0.5)
    # its variance (off_simplex "raw": the interval unclipped): per stratum ppi_py's
    # imputed + rectifier variances (ddof 0): a: (2/3 x 1/3) / 6 + 0.25 / 2 = 0.162037,
    # b: (1/4 x 3/4) / 4 + 0.25 / 2 = 0.171875; sum W_h^2 se_h^2 = 0.36 x 0.162037
    # + 0.16 x 0.171875 = 0.085833. With fixed strata: 0.4 + 1.959964 x sqrt(0.085833)
    # = 0.974217. By default the stratum shares are random too: + sum W_h (theta_h -
    # theta)^2 / N = (0.6 x (1/6 - 0.4)^2 + 0.4 x (0.75 - 0.4)^2) / 10 = 0.0081667;
    # 0.4 + 1.959964 x sqrt(0.0940) = 1.000914.
    raw = rc.corrected_shares(reader, hum, lam="ppi", off_simplex="raw")
    fixed = rc.corrected_shares(reader, hum, lam="ppi", off_simplex="raw", fixed_strata=True)
    assert _by_label(fixed, "ci_high")["w"] == pytest.approx(0.974217, abs=1e-6)
    assert _by_label(raw, "ci_high")["w"] == pytest.approx(1.000914, abs=1e-6)
    # unequal selection probabilities inside b: i8 drawn with 0.5, i9 with 0.25 -> weights
    # 2 and 4: rectifier_w = (2 x 1 + 4 x 0) / 6 = 1/3, share_w = 1/4 + 1/3 = 7/12;
    # combined 0.1 + 0.4 x 7/12 = 1/3.
    reader, hum = _tables(labels, human, strata, {"i8": 0.5, "i9": 0.25})
    out = rc.corrected_shares(reader, hum, lam="ppi")
    assert _by_label(out, "corrected")["w"] == pytest.approx(1.0 / 3.0)


def test_off_simplex_rule():
    # the reader calls i1, i2 women (share 0.2); humans say i1-i4 are men, and the reader
    # said w for i1, i2: rectifier_w = (-1 - 1 + 0 + 0) / 4 = -0.5 -> share_w = -0.3,
    # share_m = 0.8 + 0.5 = 1.3. "clip": [0, 1] (renormalised: sums to 1), both flagged;
    # "raw": the unbiased values, and BI of them is undefined.
    reader, human = _tables(["w", "w"] + ["m"] * 8, {f"i{j}": "m" for j in range(1, 5)})
    out = rc.corrected_shares(reader, human, lam="ppi")
    assert _by_label(out, "corrected_raw") == pytest.approx({"w": -0.3, "m": 1.3})
    assert _by_label(out, "corrected") == pytest.approx({"w": 0.0, "m": 1.0})
    assert out["off_simplex"].all()
    raw = rc.corrected_shares(reader, human, lam="ppi", off_simplex="raw")
    assert _by_label(raw, "corrected") == pytest.approx({"w": -0.3, "m": 1.3})
    cells = list(rc.build_cells(reader, human).values())
    kw = {"replicates": 50, "lam": "ppi"}
    bi = rc.corrected_metric(cells, rc.bi_functional(), off_simplex="raw", **kw)
    assert math.isnan(bi["corrected"])
    clipped = rc.corrected_metric(cells, rc.bi_functional(), **kw)
    assert clipped["corrected"] == 1.0  # one label left, K = 2: fully concentrated
    # multi-label shares (items carrying no or several labels) are clipped, not renormalised
    np.testing.assert_allclose(
        rc.apply_off_simplex(np.array([-0.1, 0.5, 1.2]), "clip", False), [0.0, 0.5, 1.0]
    )


def test_corrected_bi_by_hand():
    # corrected shares (0.1, 0.9): H = -(0.1 ln 0.1 + 0.9 ln 0.9) = 0.230259 + 0.094824
    # = 0.325083; BI = 1 - 0.325083 / ln 2 = 1 - 0.468996 = 0.531004. Naive (0.6, 0.4):
    # H = 0.673012, BI = 1 - 0.970951 = 0.029049.
    reader, human = _tables(READER, HUMAN)
    cells = list(rc.build_cells(reader, human).values())
    out = rc.corrected_metric(cells, rc.bi_functional(), replicates=200, lam="ppi")
    assert out["corrected"] == pytest.approx(0.531004, abs=1e-6)
    assert out["naive"] == pytest.approx(0.029049, abs=1e-6)
    assert (out["n_human"], out["n_items"]) == (4, 10)
    assert out["interval_reliable"] is False  # 4 < MIN_HUMAN_RELIABLE: the report withholds
    assert 0.0 <= out["ci_low"] <= out["ci_high"] <= 1.0


def test_bi_functional_is_the_contextbias_bi():
    from stereolens.contextbias.metrics import bi_from_parts
    from stereolens.metrics.entropy import bias_intensity

    s = np.random.default_rng(0).dirichlet(np.ones(4), size=50)
    theirs = bi_from_parts(s.sum(1), (s * np.log(s)).sum(1), np.full(50, 4), np.full(50, 4))
    np.testing.assert_allclose(rc.bi_functional()([s]), theirs, atol=1e-12)
    s[:5, 0] = 0.0  # a label unseen in some rows; K = 4 (the cell's labels) or a larger grid
    for k in (None, 6):
        one = [bias_intensity(row, k or 4) for row in s]
        np.testing.assert_allclose(rc.bi_functional(k)([s]), one, atol=1e-12)
    assert rc.bi_functional(1, 1.0)([np.array([[0.0, 0.7]])])[0] == 1.0
    assert np.isnan(rc.bi_functional()([np.zeros((1, 3))])[0])


def test_bc_normal_interval_is_biasigs():
    from stereolens.biasig.groups import bias_corrected

    reps = np.random.default_rng(1).normal(0.3, 0.05, 500)
    ours = rc._interval(0.32, reps, "bc_normal", 0.95, (0.0, 1.0))
    theirs = bias_corrected(np.array(0.32), reps.mean(), reps.std(ddof=1), 0.95)
    np.testing.assert_allclose(ours, [float(x) for x in theirs])


def test_double_bias_correction_is_biasigs():
    from stereolens.biasig.groups import double_bias_corrected

    rng = np.random.default_rng(3)
    outer = rng.normal(0.5, 0.01, 300)
    inner = outer[:, None] + rng.normal(0.002, 0.01, (300, 20))
    inner[5, 3] = np.nan  # a replicate where the metric is undefined is left out
    ours = rd.double_bias_corrected(0.51, outer, inner, 0.95)
    mean = np.nanmean(inner, 1)
    var = np.nanvar(inner, 1, ddof=1)
    theirs = double_bias_corrected(np.array(0.51), outer, mean, var, 20, 0.95)
    np.testing.assert_allclose(ours, [float(x) for x in theirs])
    assert np.isnan(rd.double_bias_corrected(np.nan, outer, inner, 0.95)[1])


def test_double_bootstrap_resamples_both_samples_at_both_levels():
    cell = rc.build_cells(*_tables(READER, HUMAN))[("gender",)]
    rng = np.random.default_rng(0)
    naive, corr, naive_in, corr_in = rd.double_bootstrap_shares(cell, 400, 20, rng)
    assert naive.shape == corr.shape == (400, 2) and corr_in.shape == (400, 20, 2)
    # the first level is centred on the point estimate, the second on each replicate
    point = rc.cell_shares(cell)
    np.testing.assert_allclose(naive.mean(0), point["naive"], atol=0.02)
    np.testing.assert_allclose(corr.mean(0), point["corrected_raw"], atol=0.04)
    np.testing.assert_allclose(corr_in.mean((0, 1)), corr.mean(0), atol=0.02)
    assert naive_in.std(1).mean() > 0 and corr_in.std(1).mean() > 0
    # humans agreeing everywhere: corrected == naive at both levels
    agree = rc.Cell(cell.labels, cell.strata, cell.stratum, cell.reader, cell.labelled,
                    cell.reader[cell.labelled], cell.weight)  # fmt: skip
    n, c, ni, ci = rd.double_bootstrap_shares(agree, 50, 5, np.random.default_rng(1))
    np.testing.assert_allclose(n, c)
    np.testing.assert_allclose(ni, ci)


def test_bad_tables_say_what_to_do(tmp_path):
    reader, human = _tables(READER, HUMAN)
    with pytest.raises(ValueError, match=r"lacks columns \['selection_probability'\]"):
        hl.check_human_labels(human.drop("selection_probability"))
    with pytest.raises(ValueError, match="column label has 1 nulls; use 'unknown'"):
        hl.check_human_labels(human.with_columns(pl.lit(None, pl.String).alias("label")).head(1))
    with pytest.raises(ValueError, match=r"selection_probability must lie in \(0, 1\]"):
        hl.check_human_labels(human.with_columns(pl.lit(0.0).alias("selection_probability")))
    with pytest.raises(ValueError, match="selection_probability must be a number"):
        hl.check_human_labels(human.with_columns(pl.lit("often").alias("selection_probability")))
    with pytest.raises(ValueError, match="repeats label 'w'"):
        hl.check_human_labels(pl.concat([human, human.head(1)]))
    with pytest.raises(ValueError, match="column stratum differs between rows"):
        two = pl.concat([human.head(1), human.head(1).with_columns(label=pl.lit("m"))])
        hl.check_human_labels(two.with_columns(stratum=pl.Series(["s", "t"])))
    with pytest.raises(ValueError, match="'i99' .* is not in the reader table"):
        rc.build_cells(reader, human.with_columns(item_id=pl.lit("i99")).head(1))
    with pytest.raises(ValueError, match="has stratum 't' but 's' in the reader table"):
        rc.build_cells(reader, human.with_columns(stratum=pl.lit("t")))
    with pytest.raises(ValueError, match=r"strata \['s'\] have fewer than 2 human-labelled"):
        rc.build_cells(reader, human.head(1))
    with pytest.raises(ValueError, match="lam 'half'; allowed: tuned, ppi"):
        rc.corrected_shares(reader, human, lam="half")
    with pytest.raises(ValueError, match="cell columns"):
        rc.build_cells(reader, human, keys=("model",))
    human.write_csv(tmp_path / "human.csv")
    back = hl.read_human_labels(tmp_path / "human.csv")
    assert back.equals(hl.check_human_labels(human))
    with pytest.raises(ValueError, match=r"\.parquet, \.csv or \.tsv"):
        hl.read_human_labels(tmp_path / "human.json")


def _world(rng, n_items=20_000, n_human=1_000, woman_read_man=0.10, man_read_woman=0.02):
    """True shares 50/50; the reader calls 10% of women men and 2% of men women; a simple
    random sample of n_human items labelled by humans (the truth)."""
    woman = rng.random(n_items) < 0.5
    u = rng.random(n_items)
    read = np.where(
        woman, np.where(u < woman_read_man, "m", "w"), np.where(u < man_read_woman, "w", "m")
    )
    return _world_tables(rng, woman, read, n_human)


def _world_tables(rng, woman, read, n_human, stratum="s"):
    ids = np.array([f"{stratum}{j}" for j in range(woman.size)])
    lab = rng.choice(woman.size, n_human, replace=False)
    reader = pl.DataFrame(
        {"item_id": ids, "attribute": "gender", "label": read, "stratum": stratum}
    )
    human = pl.DataFrame(
        {
            "item_id": ids[lab],
            "attribute": "gender",
            "label": np.where(woman[lab], "w", "m"),
            "stratum": stratum,
            "selection_probability": n_human / woman.size,
        }
    )
    return reader, human


def test_known_world_naive_is_biased_and_corrected_covers():
    rng = np.random.default_rng(20)
    reader, human = _world(rng)
    out = rc.corrected_shares(reader, human)
    w = out.filter(pl.col("label") == "w").row(0, named=True)
    # 0.5 x 0.9 + 0.5 x 0.02 = 0.46: the naive share is 0.04 off, far outside its own error
    assert w["naive"] == pytest.approx(0.46, abs=0.01)
    assert w["ci_low"] <= 0.5 <= w["ci_high"]
    assert abs(w["corrected"] - 0.5) < 0.02 and w["ci_high"] - w["ci_low"] < 0.06
    cells = list(rc.build_cells(reader, human).values())
    bi = rc.corrected_metric(cells, rc.bi_functional(), replicates=400)
    assert bi["naive"] == pytest.approx(0.0046, abs=0.003) and bi["naive_low"] > 0.0
    assert bi["ci_low"] == 0.0  # the truth, BI of 50/50, is 0
    assert bi["interval_reliable"]  # 1,000 human labels: at or above MIN_HUMAN_RELIABLE
    # over 30 worlds: the corrected interval covers 0.5 (about 95%), the naive never does
    covered = naive = 0
    for _ in range(30):
        reader, human = _world(rng)
        w = rc.corrected_shares(reader, human).filter(pl.col("label") == "w")
        covered += int(w["ci_low"][0] <= 0.5 <= w["ci_high"][0])
        naive += int(abs(w["naive"][0] - 0.5) < 0.02)
    assert covered >= 25 and naive == 0


def test_generators_read_differently_corrected_difference_covers_zero():
    # two generators with the same truth (50/50); the reader errs more on g1 (10% / 2%) than
    # on g2 (2% / 2%): the naive difference of women's shares is about -0.04, the corrected
    # difference's interval covers 0.
    rng = np.random.default_rng(5)
    cells = []
    for g, (wm, mw) in {"g1": (0.10, 0.02), "g2": (0.02, 0.02)}.items():
        woman = rng.random(8_000) < 0.5
        u = rng.random(8_000)
        read = np.where(woman, np.where(u < wm, "m", "w"), np.where(u < mw, "w", "m"))
        reader, human = _world_tables(rng, woman, read, 600, stratum=g)
        cells += list(rc.build_cells(reader, human).values())
    diff = rc.corrected_metric(
        cells, lambda s: s[0][:, 1] - s[1][:, 1], replicates=500, bounds=None
    )
    assert diff["naive"] == pytest.approx(-0.04, abs=0.015) and diff["naive_high"] < 0
    assert diff["ci_low"] <= 0.0 <= diff["ci_high"]
    assert diff["interval_reliable"]  # 600 human labels in each cell
    # one cell short of MIN_HUMAN_RELIABLE (its first labels only) makes the row unreliable
    keep = slice(rc.MIN_HUMAN_RELIABLE - 1)
    c = cells[1]
    short = dataclasses.replace(
        c, labelled=c.labelled[keep], human=c.human[keep], weight=c.weight[keep]
    )
    again = rc.corrected_metric(
        [cells[0], short], lambda s: s[0][:, 1] - s[1][:, 1], replicates=50, bounds=None
    )
    assert not again["interval_reliable"] and np.isfinite(again["ci_low"])


def test_column_cells_name_each_columns_own_cells():
    """corrected_metrics with column_cells (BiasIG's one bootstrap per model): each column's
    n_human, n_items and interval_reliable are its own cells'; its point values are the
    functional's whatever other cells ride along; without column_cells, every cell's."""
    rng = np.random.default_rng(8)
    cells = []
    for g, n_human in (("g1", rc.MIN_HUMAN_RELIABLE), ("g2", 20)):
        woman = rng.random(1_000) < 0.5
        read = np.where(woman, "w", "m")
        reader, human = _world_tables(rng, woman, read, n_human, stratum=g)
        cells += list(rc.build_cells(reader, human).values())
    both = rc.corrected_metrics(
        cells,
        lambda s: np.stack([s[0][:, 1], s[1][:, 1], s[0][:, 1] - s[1][:, 1]], -1),
        replicates=50,
        bounds=None,
        column_cells=[[0], [1], [0, 1]],
    )
    assert [r["n_human"] for r in both] == [rc.MIN_HUMAN_RELIABLE, 20, rc.MIN_HUMAN_RELIABLE + 20]
    assert [r["n_items"] for r in both] == [1_000, 1_000, 2_000]
    assert [r["interval_reliable"] for r in both] == [True, False, False]
    alone = rc.corrected_metric([cells[0]], lambda s: s[0][:, 1], replicates=50, bounds=None)
    assert both[0]["corrected"] == alone["corrected"] and both[0]["naive"] == alone["naive"]
    # the first cell is drawn first from the same seed: its replicates, and interval, agree
    assert (both[0]["ci_low"], both[0]["ci_high"]) == (alone["ci_low"], alone["ci_high"])
    default = rc.corrected_metrics(cells, lambda s: s[0][:, 1][:, None], replicates=5, bounds=None)
    assert default[0]["n_human"] == rc.MIN_HUMAN_RELIABLE + 20


def test_row_patterns_are_numpy_unique():
    """bootstrap_shares' distinct reader rows (_patterns): np.unique(axis=0)'s rows, order
    and counts, for 0/1 rows (their binary codes) and for others (np.unique itself)."""
    rng = np.random.default_rng(3)
    for rows in (
        (rng.random((500, 5)) < 0.3).astype(float),
        np.eye(4)[rng.integers(4, size=300)],
        rng.integers(0, 3, size=(200, 3)).astype(float),
    ):
        got, counts = rc._patterns(rows)
        want, want_counts = np.unique(rows, axis=0, return_counts=True)
        assert np.array_equal(got, want) and np.array_equal(counts, want_counts)


def test_s_imp_and_group_tvd_plug_in():
    from stereolens.biasig.formulas import s_imp_cell
    from stereolens.lvlm.scores import tvd_from_uniform

    # group a: the hand cell (corrected m 0.9, w 0.1; naive m 0.4, w 0.6). Group b: 4 items
    # the reader calls men, humans label j1, j2 men: shares m 1, w 0; its cell still has the
    # column w (cells of one attribute share their labels, sorted: m, w).
    ra, ha = _tables(READER, HUMAN)
    rb = pl.DataFrame(
        {"item_id": ["j1", "j2", "j3", "j4"], "attribute": "gender", "label": "m", "stratum": "s"}
    )
    hb = pl.DataFrame(
        {
            "item_id": ["j1", "j2"],
            "attribute": "gender",
            "label": "m",
            "stratum": "s",
            "selection_probability": 0.5,
        }
    )
    reader = pl.concat([ra.with_columns(group=pl.lit("a")), rb.with_columns(group=pl.lit("b"))])
    cells = rc.build_cells(reader, pl.concat([ha, hb]), keys=("group",))
    a, b = cells[("a", "gender")], cells[("b", "gender")]
    assert a.labels == b.labels == ("m", "w")
    kw = {"replicates": 100, "lam": "ppi"}
    # S_imp against a 50/50 truth: corrected cos((0.9, 0.1), (0.5, 0.5)) = 0.5 / (sqrt(0.82)
    # x sqrt(0.5)) = 0.780869, S = (0.780869 + 1) / 2 = 0.890434; naive (0.4, 0.6): cos =
    # 0.5 / (sqrt(0.52) x sqrt(0.5)) = 0.980581, S = 0.990290.
    truth = np.array([0.5, 0.5])
    s_imp = rc.corrected_metric([a], lambda s: s_imp_cell(s[0], truth), **kw)
    assert s_imp["corrected"] == pytest.approx(0.890434, abs=1e-6)
    assert s_imp["naive"] == pytest.approx(0.990290, abs=1e-6)
    # story-style TVD between the groups, count-weighted over values (lvlm story_tvd):
    # w: shares 0.1 (a), 0 (b) -> P(group | w) = (1, 0), TVD 0.5; m: 0.9, 1 -> (0.9, 1) / 1.9,
    # TVD 0.026316; weights n_v = 10 x share_a + 4 x share_b: w 1, m 13;
    # 100 x (1 x 0.5 + 13 x 0.026316) / 14 = 6.0150.
    sizes = np.array([10.0, 4.0])

    def story_tvd(shares):
        s = np.stack(shares, axis=1)  # (replicates, groups, labels)
        with np.errstate(invalid="ignore"):  # a replicate where no group shows w: NaN
            tvd = tvd_from_uniform(s / s.sum(1, keepdims=True), axis=1)
        n_v = (s * sizes[None, :, None]).sum(1)
        return 100.0 * (n_v * tvd).sum(-1) / n_v.sum(-1)

    tvd = rc.corrected_metric([a, b], story_tvd, bounds=(0.0, 100.0), **kw)
    assert tvd["corrected"] == pytest.approx(6.0150, abs=1e-4)
    assert (tvd["n_human"], tvd["n_items"]) == (6, 14)


def test_human_labels_needed():
    # the reader on 20,000 items: it disagrees with humans about "woman" on 5% + 1%
    # of items, mean difference 0.04: Var(d) = 0.06 - 0.0016 = 0.0584; reader share 0.46:
    # 0.2484 / 20,000 = 1.242e-5. For width 0.033: (0.033 / 3.919928)^2 = 7.0870e-5;
    # n = 0.0584 / (7.0870e-5 - 1.242e-5) = 999.1 -> 1,000 (the simulated PPI width at
    # n = 1,000 is 0.0330).
    n = rc.human_labels_needed(0.06, 0.033, 20_000, share=0.46, mean_difference=0.04)
    assert n == 1_000
    assert rc.human_labels_needed(0.06, 0.01, 20_000, share=0.46) is None  # N too small
    assert rc.human_labels_needed(0.0, 0.05, 20_000) == 2  # no disagreement: the minimum
