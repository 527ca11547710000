"""The reader correction's bootstrap over clusters (stereolens.metrics.cluster_bootstrap;
issue 21, LVLM term rounds): a ``cluster`` column makes the bootstrap resample whole
clusters within strata; without it the draws are those of before."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from test_reader_correction import HUMAN, READER, _tables

from stereolens.metrics import reader_correction as rc


def _women(shares):
    return shares[0][:, 1]


def test_without_a_cluster_column_the_draws_are_those_of_before():
    # pinned on main 08e9603 (before the cluster bootstrap), seed 0, 200 replicates
    reader, human = _tables(READER, HUMAN)
    cells = list(rc.build_cells(reader, human).values())
    assert cells[0].cluster is None
    out = rc.corrected_metric(cells, rc.bi_functional(), replicates=200)
    assert out["naive_high"] == 0.2367003546226251
    assert out["estimate_bc"] == 0.5282693351326525


def _pairs_table(clustered: bool):
    """10 items, the reader calling i1, i3, ... women and i2, i4, ... men; clusters (i1, i2),
    (i3, i4), ...; humans agree on i1, i4, i5, i8, i9 (one item of each cluster)."""
    labels = ["w", "m"] * 5
    reader, human = _tables(labels, {f"i{j}": labels[j - 1] for j in (1, 4, 5, 8, 9)})
    if clustered:
        reader = reader.with_columns(cluster=pl.Series([f"c{j // 2}" for j in range(10)]))
    return reader, human


def test_clusters_alike_give_no_spread_items_do():
    """Every cluster holds one woman and one man (as the reader and the humans see them):
    resampling clusters leaves the share at 0.5 in every replicate, naive and corrected;
    resampling items does not."""
    reader, human = _pairs_table(True)
    cell = rc.build_cells(reader, human)[("gender",)]
    assert cell.cluster.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    out = rc.corrected_metric([cell], _women, replicates=300, bounds=None)
    assert (out["naive"], out["corrected"]) == (0.5, 0.5)
    assert out["naive_low"] == pytest.approx(0.5) and out["naive_high"] == pytest.approx(0.5)
    assert out["ci_low"] == pytest.approx(0.5) and out["ci_high"] == pytest.approx(0.5)
    flat = rc.build_cells(*_pairs_table(False))[("gender",)]
    items = rc.corrected_metric([flat], _women, replicates=300, bounds=None)
    assert items["naive_high"] - items["naive_low"] > 0.3


def test_cluster_spread_is_the_clusters():
    """N = 400 items in 80 clusters of 5 alike (a cluster all women with probability 1/2):
    the replicates' sd of the naive share is the clusters', sqrt(0.25 / 80) = 0.0559, not the
    items', sqrt(0.25 / 400) = 0.025; a human sample of 100 items that agrees adds nothing."""
    rng = np.random.default_rng(3)
    woman = np.repeat(rng.random(80) < 0.5, 5)
    eye = np.eye(2)
    labelled = np.sort(rng.choice(400, 100, replace=False))
    cell = rc.Cell(
        labels=("m", "w"), strata=("s",), stratum=np.zeros(400, np.int64),
        reader=eye[woman.astype(int)], labelled=labelled, human=eye[woman[labelled].astype(int)],
        weight=np.full(100, 4.0), cluster=np.repeat(np.arange(80), 5),
    )  # fmt: skip
    naive, corr = rc.bootstrap_shares(cell, 4000, np.random.default_rng(0))
    p = woman.mean()
    assert naive[:, 1].std() == pytest.approx(np.sqrt(p * (1 - p) / 80), rel=0.06)
    assert np.allclose(naive, corr)
    items = rc.bootstrap_shares(
        rc.Cell(**{**cell.__dict__, "cluster": None}), 4000, np.random.default_rng(0)
    )
    assert items[0][:, 1].std() < 0.6 * naive[:, 1].std()


def test_an_item_has_one_cluster():
    reader, human = _pairs_table(True)
    two = pl.concat([reader, reader.head(1).with_columns(label=pl.lit("m"), cluster=pl.lit("c9"))])
    with pytest.raises(ValueError, match="item 'i1' has two clusters"):
        rc.build_cells(two, human)
    moved = human.with_columns(cluster=pl.lit("c0"))
    with pytest.raises(ValueError, match="item 'i4' has cluster 'c0' but 'c1'"):
        rc.build_cells(reader, moved)
    agreed = human.join(reader.select("item_id", "cluster"), on="item_id")
    assert rc.build_cells(reader, agreed)[("gender",)].cluster is not None


def test_double_bootstrap_keeps_clusters_at_both_levels():
    """Two clusters of one stratum, A = 3 items all read women, B = 1 item read a man, one
    labelled item in each (humans agree): a resample of the two clusters is AA, AB or BB,
    women's share 1, 3/4 or 0 (items 6, 4 or 2), with probability 1/4, 1/2, 1/4; a
    second-level resample of AA (or BB) is AA (BB) again: it draws from the first level's
    clusters, whole. Items one by one would give other shares (e.g. 1/2)."""
    from stereolens.metrics import reader_double as rd

    eye = np.eye(2)
    read = eye[[1, 1, 1, 0]]
    cell = rc.Cell(
        labels=("m", "w"), strata=("s",), stratum=np.zeros(4, np.int64), reader=read,
        labelled=np.array([0, 3]), human=read[[0, 3]], weight=np.full(2, 2.0),
        cluster=np.array([0, 0, 0, 1]),
    )  # fmt: skip
    naive, corr, naive_in, corr_in = rd.double_bootstrap_shares(
        cell, 4000, 6, np.random.default_rng(0), fixed_strata=True
    )
    women, women_in = naive[:, 1], naive_in[..., 1]
    assert set(np.round(women, 12)) == {0.0, 0.75, 1.0}
    assert set(np.round(women_in.ravel(), 12)) <= {0.0, 0.75, 1.0}
    assert np.mean(women == 0.75) == pytest.approx(0.5, abs=0.03)
    assert (women_in[women == 1.0] == 1.0).all() and (women_in[women == 0.0] == 0.0).all()
    mixed = women_in[women == 0.75]
    assert np.mean(mixed == 0.75) == pytest.approx(0.5, abs=0.03)
    np.testing.assert_allclose(corr, naive)
    np.testing.assert_allclose(corr_in, naive_in)


def test_double_bias_corrected_once_centre_by_hand():
    """centre "once": the estimate 2 x point - mean theta* (the bc-normal centre), the
    error the double bootstrap's. point 5, theta* (4, 6, 5, 8) (mean 5.75): estimate 4.25;
    theta** rows (4, 4), (6.5, 7.5), (5, 5), (8.5, 9.5), means (4, 7, 5, 9), variances (0,
    0.5, 0, 0.5); once-corrected 2 theta* - means = (4, 5, 5, 7), variance 19 / 12; less
    the means' noise mean(var) / J = 0.25 / 2 = 1 / 8: se = sqrt(35 / 24). centre "double":
    3 x 5 - 3 x 5.75 + 6.25 = 4.0, the same se."""
    from stereolens.metrics import reader_double as rd

    outer = np.array([4.0, 6.0, 5.0, 8.0])
    inner = np.array([[4.0, 4.0], [6.5, 7.5], [5.0, 5.0], [8.5, 9.5]])
    half = 1.959963984540054 * np.sqrt(35 / 24)
    once = rd.double_bias_corrected(5.0, outer, inner, 0.95, centre="once")
    np.testing.assert_allclose(once, [4.25, 4.25 - half, 4.25 + half])
    double = rd.double_bias_corrected(5.0, outer, inner, 0.95)
    np.testing.assert_allclose(double, [4.0, 4.0 - half, 4.0 + half])
    with pytest.raises(ValueError, match="centre 'twice'"):
        rd.double_bias_corrected(5.0, outer, inner, 0.95, centre="twice")
