"""The reader correction's joint bootstrap (stereolens.metrics.joint_bootstrap): cells read
from the same items (ContextBias's dimensions of one role x condition) share one draw of the
items, so a mean over them carries their correlation; independent draws understate it."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from stereolens.metrics import joint_bootstrap as jb
from stereolens.metrics import reader_correction as rc


def _two_dimensions(rng, n_items=2_000, n_human=200, copy=True, human_ids=None):
    """Two attributes read from the same items: ``gender`` (w/m; the reader calls 10% of
    women men, 2% of men women) and ``hair`` (long/short): with ``copy`` hair is long exactly
    where gender is w, in the truth and in the reader's labels (perfectly correlated), else
    drawn independently. Humans (the truth) label a simple random sample of ``n_human`` (or
    ``human_ids``: {attribute: item indices})."""
    ids = np.array([f"i{j}" for j in range(n_items)])
    woman = rng.random(n_items) < 0.3
    u = rng.random(n_items)
    read = np.where(woman, u >= 0.10, u < 0.02)
    long_true = woman if copy else rng.random(n_items) < 0.4
    long_read = read if copy else np.where(long_true, rng.random(n_items) >= 0.1, False)
    truth = {"gender": np.where(woman, "w", "m"), "hair": np.where(long_true, "long", "short")}
    reading = {"gender": np.where(read, "w", "m"), "hair": np.where(long_read, "long", "short")}
    reader = pl.concat(
        [
            pl.DataFrame({"item_id": ids, "attribute": a, "label": reading[a], "stratum": "s"})
            for a in ("gender", "hair")
        ]
    )
    sample = rng.choice(n_items, n_human, replace=False)
    chosen = human_ids or {"gender": sample, "hair": sample}
    human = pl.concat(
        [
            pl.DataFrame(
                {
                    "item_id": ids[chosen[a]],
                    "attribute": a,
                    "label": truth[a][chosen[a]],
                    "stratum": "s",
                    "selection_probability": len(chosen[a]) / n_items,
                }
            )  # fmt: skip
            for a in ("gender", "hair")
        ]
    )
    cells = rc.build_cells(reader, human)
    return [cells[("gender",)], cells[("hair",)]]


def _mean_share(shares):
    """The mean over the two cells of the second label's share (w: gender's labels are
    (m, w); long: hair's are (long, short), so its first)."""
    return (shares[0][:, 1] + shares[1][:, 0]) / 2.0


def test_one_draw_for_perfectly_correlated_dimensions():
    rng = np.random.default_rng(21)
    cells = _two_dimensions(rng)
    assert cells[0].items == cells[1].items and len(cells[0].items) == 2_000
    # one draw: the two cells' replicates are the same numbers (hair = gender, relabelled)
    lams = [[1.0], [1.0]]
    (g_naive, g_corr), (h_naive, h_corr) = jb.bootstrap_joint(
        cells, [[0, 1]], 300, np.random.default_rng(0), lams
    )
    assert np.array_equal(g_naive[:, 1], h_naive[:, 0])
    assert np.array_equal(g_corr[:, 1], h_corr[:, 0])
    # independent draws: different numbers
    (g2, _), (h2, _) = jb.bootstrap_joint(cells, [], 300, np.random.default_rng(0), lams)
    assert not np.array_equal(g2[:, 1], h2[:, 0])
    # the mean of the two: jointly, as wide as one cell's interval (it is one cell's share);
    # independently sqrt(2) times narrower (the correlation of 1 dropped)
    opts = {"replicates": 2_000, "bounds": None, "seed": 4}
    joint = rc.corrected_metrics(cells, lambda s: _mean_share(s)[:, None], joint=[[0, 1]], **opts)[
        0
    ]
    apart = rc.corrected_metric(cells, _mean_share, **opts)
    one = rc.corrected_metric(cells[:1], lambda s: s[0][:, 1], **opts)
    width = {k: r["ci_high"] - r["ci_low"] for k, r in (("joint", joint), ("apart", apart),
                                                         ("one", one))}  # fmt: skip
    assert width["joint"] / width["apart"] == pytest.approx(np.sqrt(2.0), rel=0.08)
    assert width["joint"] / width["one"] == pytest.approx(1.0, rel=0.06)
    # the point values do not depend on the draws
    for key in ("naive", "corrected"):
        assert joint[key] == apart[key] == pytest.approx(one[key], abs=1e-12)


def test_joint_draw_of_one_cell_is_the_one_cell_bootstrap():
    """A group of one and groups of cells with different labelled items: each cell's
    replicates have the spread of its own bootstrap (bootstrap_shares), in distribution."""
    rng = np.random.default_rng(5)
    first = {"gender": np.arange(0, 300), "hair": np.arange(150, 450)}  # overlapping samples
    cells = _two_dimensions(rng, copy=False, human_ids=first)
    assert cells[0].labelled.size == cells[1].labelled.size == 300
    lams = [[1.0], [1.0]]
    joint = jb.bootstrap_joint(cells, [[0, 1]], 4_000, np.random.default_rng(1), lams)
    for cell, (naive, corr) in zip(cells, joint, strict=True):
        ref_naive, ref_corr = rc.bootstrap_shares(cell, 4_000, np.random.default_rng(2))
        for got, want in ((naive, ref_naive), (corr, ref_corr)):
            assert got.std(0) == pytest.approx(want.std(0), rel=0.06)
            assert got.mean(0) == pytest.approx(want.mean(0), abs=3e-3)


def test_joint_groups_are_checked():
    rng = np.random.default_rng(2)
    cells = _two_dimensions(rng, n_items=200, n_human=20)
    other = _two_dimensions(np.random.default_rng(3), n_items=150, n_human=20)[0]
    with pytest.raises(ValueError, match="does not read the same items"):
        jb.bootstrap_joint([cells[0], other], [[0, 1]], 5, rng, [[1.0], [1.0]])
    anonymous = [dataclasses.replace(c, items=()) for c in cells]
    with pytest.raises(ValueError, match="has no item ids"):
        jb.bootstrap_joint(anonymous, [[0, 1]], 5, rng, [[1.0], [1.0]])
    assert len(jb.bootstrap_joint(anonymous, [], 5, rng, [[1.0], [1.0]])) == 2  # alone: fine
    with pytest.raises(ValueError, match="disjoint"):
        jb.groups_of(3, [[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="outside"):
        jb.groups_of(2, [[0, 2]])
    assert jb.groups_of(4, [[2, 0]]) == [[2, 0], [1], [3]]


def test_joint_double_bootstrap():
    """``inner``: the second level of the double bootstrap (metrics.reader_double) drawn
    once for a group too: perfectly correlated cells get the same numbers at both levels;
    a cell alone has the spread of double_bootstrap_shares' at both levels."""
    from stereolens.metrics import reader_double as rd

    cells = _two_dimensions(np.random.default_rng(21), n_items=1_000, n_human=150)
    lams = [[1.0], [1.0]]
    (g, g_c, g_in, g_c_in), (h, h_c, h_in, h_c_in) = jb.bootstrap_joint(
        cells, [[0, 1]], 200, np.random.default_rng(0), lams, inner=10
    )
    assert g_in.shape == (200, 10, 2) and h_c_in.shape == (200, 10, 2)
    for a, b in ((g, h), (g_c, h_c), (g_in, h_in), (g_c_in, h_c_in)):
        assert np.array_equal(a[..., 1], b[..., 0])
    # one cell alone: its levels' spreads are double_bootstrap_shares'
    got = jb.bootstrap_joint(cells[:1], [], 3_000, np.random.default_rng(1), lams[:1], inner=5)
    want = rd.double_bootstrap_shares(cells[0], 3_000, 5, np.random.default_rng(2))
    for a, b in zip(got[0], want, strict=True):
        assert a.std(0).ravel()[1] == pytest.approx(b.std(0).ravel()[1], rel=0.07)
        assert a.mean() == pytest.approx(b.mean(), abs=3e-3)
    # the spread within a replicate: second-level draws around their first-level draw
    inner_sd = [level[3].std(1).mean() for level in (got[0], want)]
    assert inner_sd[0] == pytest.approx(inner_sd[1], rel=0.07)
    # corrected_metric_double with the group: the mean of the two is one cell's, doubled
    opts = {"replicates": 300, "inner": 10, "seed": 4, "bounds": None}
    joint = rd.corrected_metric_double(cells, lambda s: _mean_share(s), joint=[[0, 1]], **opts)
    apart = rd.corrected_metric_double(cells, lambda s: _mean_share(s), **opts)
    assert joint["corrected"] == apart["corrected"]
    ratio = (joint["ci_high"] - joint["ci_low"]) / (apart["ci_high"] - apart["ci_low"])
    assert ratio == pytest.approx(np.sqrt(2.0), rel=0.15)
