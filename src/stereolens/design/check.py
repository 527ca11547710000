"""The check's harness: a planner's predicted power against its pipeline's rejection rate on
simulated datasets (each benchmark's plug-in hook power_check), with a goodness of fit."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from stereolens.design.power import power_curve


@dataclass(frozen=True)
class CheckSize:
    """How large a check is: the same for every benchmark's power_check."""

    datasets: int = 100
    """Simulated datasets the real pipeline runs on."""
    sims: int = 400
    """Simulations of the planner's prediction."""
    draws: int = 200
    """The pipeline's resampling draws per dataset (bootstrap replicates, permutations)."""
    level: float = 0.05
    seed: int = 0


@dataclass
class CheckResult:
    name: str
    size: int
    w: float
    effect: float
    """Population effect at w."""
    predicted: float
    predicted_se: float
    observed: float
    observed_se: float
    predicted_sims: int
    observed_datasets: int

    @property
    def z(self) -> float:
        """The two-proportion z of observed against predicted, at their pooled rate (>= 1/(2n))."""
        n_p, n_o = self.predicted_sims, self.observed_datasets
        pooled = (self.predicted * n_p + self.observed * n_o) / (n_p + n_o)
        var = max(pooled * (1 - pooled), 0.5 / min(n_p, n_o)) * (1 / n_p + 1 / n_o)
        return (self.observed - self.predicted) / math.sqrt(var)


def goodness_of_fit(results: list[CheckResult]) -> dict[str, float]:
    """Predicted against observed rejection rates over ``results``: chi2 = sum of z^2 on
    ``rows`` degrees of freedom, its p-value and the mean z (observed - predicted)."""
    z = np.array([r.z for r in results], dtype=float)
    chi2 = float((z**2).sum())
    return {
        "rows": int(z.size),
        "chi2": chi2,
        "p_value": float(stats.chi2.sf(chi2, z.size)) if z.size else float("nan"),
        "mean_z": float(z.mean()) if z.size else float("nan"),
    }


def rate_se(p: float, n: int) -> float:
    # a floor of 1/(2n) keeps 0 and 1 from claiming no error at all
    return math.sqrt(max(p * (1 - p), 0.5 / n) / n)


def predicted_power(design, name: str, n: int, w: float, sims: int, level: float, seed: int):
    """(rate, se) of the planner's prediction at strength w (grid [0, w])."""
    rng = np.random.default_rng([seed, 101])
    grid = np.array([0.0, w]) if w > 0 else np.array([0.0])
    sim = design.simulate(n, grid, sims, rng)
    spec = next(s for s in design.specs() if s.name == name)
    curve = power_curve(spec, sim.estimates[name], level, **sim.curve_args(name))
    p = float(curve[-1])
    return p, rate_se(p, sims)


def check_result(design, name, n, w, pred, sims, rejected: list[bool]) -> CheckResult:
    """The result of one check: ``pred`` = (rate, se) of the prediction, ``rejected`` = the
    pipeline's decision on each dataset."""
    effect = float(design.effects(np.array([w]))[name][0])
    obs = float(np.mean(rejected))
    return CheckResult(
        name, n, w, effect, pred[0], pred[1], obs, rate_se(obs, len(rejected)), sims, len(rejected)
    )


def check(benchmark: str, design, name: str, n: int, w: float, size: CheckSize = CheckSize()):
    """Predicted power of the effect ``name`` of ``design`` at sample size ``n`` and planted
    strength ``w`` against the benchmark's real pipeline (its plug-in's power_check)."""
    from stereolens.benchmark import benchmark as plugin
    from stereolens.benchmark import resolve

    hook = plugin(benchmark).power_check
    if hook is None:
        raise ValueError(f"benchmark {benchmark!r} has no power_check")
    return resolve(hook)(design, name, n, w, size)
