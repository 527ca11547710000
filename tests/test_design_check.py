"""The planner's predicted power against the rejection rate of the real metric pipeline
(cluster_bootstrap, compute_metrics, overall_scores) on independently simulated datasets with
a planted effect, at a small scale (issue 15, item 3; bench/power_check.py runs a larger
one). Agreement = within three combined Monte Carlo standard errors."""

from __future__ import annotations

import pytest
from design_worlds import cb_design, small_biasig

from stereolens.config import load_config
from stereolens.design import check as K
from stereolens.design import lvlm as L
from stereolens.design.priors import load_priors


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
    r = K.contextbias_check(
        cb_design(n_roles=12), 4, w, name=name, datasets=120, sims=600, replicates=200
    )
    _agrees(r)
    if w > 0:
        assert 0.3 < r.predicted < 0.95  # a point where the check can fail


@pytest.mark.parametrize(
    ("name", "n", "w"),
    [("biasig.s_exp_diff", 3, 0.15), ("biasig.eta", 3, 0.5), ("biasig.s_imp_diff", 10, 0.5)],
)
def test_biasig_power_matches_compute_metrics(name, n, w):
    r = K.biasig_check(small_biasig(), name, n, w, datasets=60, sims=400, replicates=100)
    _agrees(r)
    assert r.predicted > 0.1


@pytest.mark.parametrize("task", ["story", "term", "exam"])
def test_lvlm_power_matches_permutation_test(task):
    config, _ = load_config("config/demo.yaml")
    d = next(x for x in L.build(config, load_priors(), None) if x.task == task)
    r = K.lvlm_check(d, "gender", 20, 0.15, datasets=60, sims=400, permutations=100)
    _agrees(r)
    assert 0.1 < r.predicted < 0.95
