"""The planner's predicted power against the rejection rate of the real metric pipeline
(cluster_bootstrap, compute_metrics, overall_scores) on independently simulated datasets with
a planted effect, at a small scale (issue 15, item 3; bench/power_check.py runs a larger
one and its goodness of fit). Agreement = within three combined Monte Carlo standard errors;
the report's test of two models and eta's calibrated test on fixed tables."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from design_worlds import cb_design, small_biasig
from scipy import stats

from stereolens.biasig.design_check import difference_rejects, eta_rejects
from stereolens.config import load_config
from stereolens.design import check as K
from stereolens.design.priors import load_priors
from stereolens.lvlm import design as L


@pytest.fixture(autouse=True)
def _in_repo(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)


def _agrees(r: K.CheckResult) -> None:
    assert abs(r.z) <= 3.0, (
        f"{r.name} at w={r.w}: predicted {r.predicted:.3f} +- {r.predicted_se:.3f}, "
        f"pipeline {r.observed:.3f} +- {r.observed_se:.3f}"
    )


@pytest.mark.parametrize(
    ("w", "name"),
    [
        (0.0, "contextbias.bi_shift"),
        (0.2, "contextbias.bi_shift"),
        (0.2, "contextbias.bi_shift:g1"),
    ],
)
def test_contextbias_power_matches_cluster_bootstrap(w, name):
    size = K.CheckSize(datasets=120, sims=600, draws=200)
    r = K.check("contextbias", cb_design(n_roles=12), name, 4, w, size)
    _agrees(r)
    if w > 0:
        assert 0.3 < r.predicted < 0.95  # a point where the check can fail


def test_contextbias_power_with_few_roles_is_the_pipelines():
    """6 roles, below FEW_ROLES: the bc-t row's se is the emulated role bootstrap's. At w =
    0.27 the planner predicts 0.597 and the pipeline rejects 0.568 of these 400 datasets, z
    -0.9 (0.574 and 0.579 at 4,000 simulations and 3,000 datasets); the estimate's spread in
    the se's place predicted 0.708 here, z -4.6 (bench/power_check.py runs 6 and 12 roles)."""
    size = K.CheckSize(datasets=400, sims=600, draws=200)
    r = K.check("contextbias", cb_design(n_roles=6), "contextbias.bi_shift", 4, 0.27, size)
    _agrees(r)
    assert 0.3 < r.predicted < 0.8


@pytest.mark.parametrize(("level", "w", "datasets"), [(0.01, 0.2, 300), (0.10, 0.0, 120)])
def test_contextbias_power_matches_at_other_levels(level, w, datasets):
    """At levels other than 0.05 the bc-t row's test is t_(1 - level/2, R - 1) x se. At 0.01
    and w = 0.2 (12 roles) the planner predicts 0.52 against the pipeline's 0.57 (z +1.4 at
    300 datasets; 0.61, z -1.5, with the estimate's spread in place of the emulated se); the
    old rule's z_(0.995) x t_0.975 / z_0.975 predicted 0.68 (z -3.7)."""
    size = K.CheckSize(datasets=datasets, sims=1000, draws=200, level=level)
    _agrees(K.check("contextbias", cb_design(n_roles=12), "contextbias.bi_shift", 4, w, size))


@pytest.mark.parametrize(
    ("name", "n", "w"),
    [("biasig.s_exp_diff", 3, 0.15), ("biasig.eta", 3, 0.5), ("biasig.s_imp_diff", 10, 0.5)],
)
def test_biasig_power_matches_compute_metrics(name, n, w):
    size = K.CheckSize(datasets=60, sims=400, draws=100)
    r = K.check("biasig", small_biasig(), name, n, w, size)
    _agrees(r)
    assert r.predicted > 0.1


def test_eta_test_has_its_size_and_the_interval_does_not():
    # the calibrated test rejects at about the level with no effect, in the planner and in
    # the pipeline; the report's interval almost never does (the 0.000)
    r = K.check("biasig", small_biasig(), "biasig.eta", 10, 0.0, K.CheckSize(60, 400))
    _agrees(r)
    assert 0.03 <= r.predicted <= 0.08
    size = K.CheckSize(datasets=30, sims=400)
    r = K.check("biasig", small_biasig(), "biasig.eta_interval", 10, 0.0, size)
    _agrees(r)
    assert r.predicted < 0.02


def _model_rows(scores: dict[str, tuple[float, float, float]]) -> pl.DataFrame:
    """Model rows with score_bc, ci_low, ci_high as given; the plug-in score 0.01 off
    towards the other model (A up, B down), so that a test on the plug-ins would differ."""
    rows = [
        {"variant": m, "level": "model", "protected_attribute": "*", "score_bc": s,
         "score": s + (0.01 if m == "A" else -0.01), "ci_low": lo, "ci_high": hi}
        for m, (s, lo, hi) in scores.items()
    ]  # fmt: skip
    return pl.DataFrame(rows)


def test_difference_rejects_is_the_reports_wald_test_with_holm():
    # the bias-corrected scores (score_bc) are compared, as biasig.comparisons does: 0.93 -
    # 0.90 (the plug-ins' 0.92 - 0.91 = 0.01 would not reject: z 0.69);
    # se of each model = 0.02 / 1.96; difference 0.03 / hypot = 2.079: rejected alone
    # (1.96), not at Holm's first step over 3 pairs (z_(1 - 0.05/6) = 2.394) nor 28 (3.20)
    t = _model_rows({"A": (0.90, 0.88, 0.92), "B": (0.93, 0.91, 0.95)})
    z = 0.03 / np.hypot(0.02 / 1.959964, 0.02 / 1.959964)
    assert z == pytest.approx(2.0789, abs=1e-4)
    assert difference_rejects(t, "A", "B")
    assert not difference_rejects(t, "A", "B", family=3)
    assert stats.norm.ppf(1 - 0.05 / 6) == pytest.approx(2.394, abs=1e-3)
    assert difference_rejects(t, "A", "B", level=0.05 * 3, family=3)  # 0.05 per test


def test_eta_rejects_against_the_null_quantile():
    null = np.linspace(-0.01, 0.01, 201)  # |null| 0.95 quantile = 0.0095
    assert eta_rejects(0.5096, null) and eta_rejects(0.4904, null)
    assert not eta_rejects(0.5094, null)


def test_goodness_of_fit_hand_computed():
    # two-proportion z with the pooled rate, 100 simulations and 100 datasets each:
    # 0.50 vs 0.60: pooled 0.55, se sqrt(0.55 x 0.45 x 0.02) = 0.070356, z = 1.4213;
    # 0.50 vs 0.40: z = -1.4213; 0.05 vs 0.01: pooled 0.03, se 0.024125, z = -1.6581
    rows = [
        K.CheckResult("x", 1, 0.1, 0.1, 0.50, 0.05, 0.60, 0.05, 100, 100),
        K.CheckResult("x", 1, 0.1, 0.1, 0.50, 0.05, 0.40, 0.05, 100, 100),
        K.CheckResult("x", 1, 0.1, 0.1, 0.05, 0.02, 0.01, 0.01, 100, 100),
    ]
    assert [r.z for r in rows] == pytest.approx([1.4213, -1.4213, -1.6581], abs=1e-4)
    fit = K.goodness_of_fit(rows)
    chi2 = 2 * 1.4213**2 + 1.6581**2  # 6.7896
    assert fit["rows"] == 3 and fit["chi2"] == pytest.approx(chi2, abs=1e-3)
    assert fit["p_value"] == pytest.approx(stats.chi2.sf(chi2, 3), abs=1e-4)  # 0.0789
    assert fit["mean_z"] == pytest.approx(-1.6581 / 3, abs=1e-4)


@pytest.mark.parametrize("task", ["story", "term", "exam"])
def test_lvlm_power_matches_permutation_test(task):
    config, _ = load_config("config/demo.yaml")
    d = next(x for x in L.build(config, load_priors(), None) if x.task == task)
    size = K.CheckSize(datasets=60, sims=400, draws=100)
    r = K.check("lvlm", d, d.name("gender"), 20, 0.15, size)
    _agrees(r)
    assert 0.1 < r.predicted < 0.95
