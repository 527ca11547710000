"""The adaptive audit's statistics: group-sequential boundaries from an alpha-spending function,
repeated confidence intervals and a goal's interim decision table (``width``, ``difference``,
``equivalence``); the method and why: docs/planner.md, "The rule"."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import optimize, stats

SPENDINGS = ("obrien_fleming", "pocock", "hsd")
TIMINGS = ("size", "information")
GOALS = ("width", "difference", "equivalence")
DECISION_COLUMNS = (
    "round", "cell", "estimate", "se", "critical", "ci_low", "ci_high", "decision", "reason",
)  # fmt: skip
"""The decision table's columns (a contract of the workflow's interim tables): round (1..K),
cell (what is decided on: a metric cell, a model or a comparison), estimate and se after the
round, critical (c_k), ci_low / ci_high (the RCI), decision (``stop`` or ``continue``) and
reason (``width reached``, ``excludes 0``, ``within the margin``, ``cap reached``,
``open``)."""
_CDF_ABSEPS = {2: 1e-8, 3: 1e-6}
"""Absolute error of the rectangle probabilities by dimension (Genz's algorithm): an error
e moves a critical value near 2 by about e / 0.1."""
_BIG = 40.0
"""A critical value that is never crossed (no alpha is spent at that round)."""


def spent(t: float | np.ndarray, alpha: float, spending: str, gamma: float = -4.0):
    """Two-sided alpha spent by time ``t`` in [0, 1]: ``obrien_fleming`` (Lan-DeMets:
    2 - 2 Phi(z_(1 - alpha/2) / sqrt(t))), ``pocock`` (Lan-DeMets: alpha log(1 + (e - 1) t)),
    ``hsd`` (Hwang-Shih-DeCani: alpha (1 - exp(-gamma t)) / (1 - exp(-gamma)); gamma -4 is
    close to O'Brien-Fleming, 1 close to Pocock). Each is 0 at 0 and alpha at 1."""
    t = np.clip(np.asarray(t, dtype=float), 0.0, 1.0)
    if spending == "obrien_fleming":
        with np.errstate(divide="ignore"):
            z = stats.norm.ppf(1 - alpha / 2) / np.sqrt(t)
        out = 2 - 2 * stats.norm.cdf(z)
    elif spending == "pocock":
        out = alpha * np.log1p((math.e - 1) * t)
    elif spending == "hsd":
        out = alpha * t if gamma == 0 else alpha * np.expm1(-gamma * t) / np.expm1(-gamma)
    else:
        raise ValueError(f"design.adaptive.spending {spending!r}: use one of {SPENDINGS}")
    return out if out.ndim else float(out)


def correlation(info: Sequence[float]) -> np.ndarray:
    """corr(Z_j, Z_k) = sqrt(I_j / I_k) for I_j <= I_k (nested rounds)."""
    i = np.asarray(info, dtype=float)
    lo = np.minimum.outer(i, i)
    hi = np.maximum.outer(i, i)
    return np.sqrt(lo / hi)


def _inside(c: np.ndarray, corr: np.ndarray) -> float:
    """P(|Z_j| < c_j for every j)."""
    if len(c) == 1:
        return float(2 * stats.norm.cdf(c[0]) - 1)
    mvn = stats.multivariate_normal(
        mean=np.zeros(len(c)),
        cov=corr,
        seed=0,
        allow_singular=True,
        abseps=_CDF_ABSEPS.get(len(c), 1e-5),
        releps=0,
        maxpts=10**7,
    )
    return float(mvn.cdf(c, lower_limit=-c))


def boundaries(
    fractions: Sequence[float],
    alpha: float = 0.05,
    spending: str = "obrien_fleming",
    gamma: float = -4.0,
    info: Sequence[float] | None = None,
) -> np.ndarray:
    """Two-sided critical values c_1..c_K at the increasing spending times ``fractions``
    (the last 1), with Z correlations from ``info`` (1 / se^2 per round; default the
    fractions). c_k depends on rounds 1..k only; a round that spends nothing gets 40."""
    t = np.asarray(fractions, dtype=float)
    if t.ndim != 1 or t.size == 0 or np.any(np.diff(t) < 0) or t[0] <= 0 or t[-1] > 1:
        raise ValueError(f"fractions must not decrease and lie in (0, 1], got {list(t)}")
    info = t if info is None else np.asarray(info, dtype=float)
    if info.shape != t.shape or np.any(np.diff(info) < 0) or np.any(info <= 0):
        raise ValueError(f"info must be positive and non-decreasing, one per round: {info}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    a = spent(t, alpha, spending, gamma)
    corr = correlation(info)
    c = np.empty(t.size)
    for k in range(t.size):
        target = 1.0 - a[k]
        if k == 0:
            c[0] = stats.norm.isf(a[0] / 2) if a[0] > 0 else _BIG
            continue
        prev = _inside(c[:k], corr[:k, :k])
        if prev - target <= 1e-12:  # nothing left to spend at this round
            c[k] = _BIG
            continue

        def f(x: float, k: int = k, target: float = target) -> float:
            return _inside(np.r_[c[:k], x], corr[: k + 1, : k + 1]) - target

        c[k] = optimize.brentq(f, 0.5, 12.0, xtol=1e-5)
    return np.minimum(c, _BIG)


def classic_constant(rounds: int, alpha: float = 0.05, kind: str = "pocock") -> float:
    """The constant C of the classic equally spaced designs (Jennison & Turnbull 2000,
    Table 2.1 / 2.3): Pocock c_k = C, O'Brien-Fleming c_k = C sqrt(K / k)."""
    t = np.arange(1, rounds + 1) / rounds
    corr = correlation(t)
    shape = np.ones(rounds) if kind == "pocock" else np.sqrt(rounds / np.arange(1, rounds + 1))
    if kind not in ("pocock", "obrien_fleming"):
        raise ValueError(f"kind {kind!r}: pocock or obrien_fleming")
    return float(
        optimize.brentq(lambda x: _inside(x * shape, corr) - (1 - alpha), 1.0, 4.0, xtol=1e-5)
    )


def rci(estimate, se, critical) -> tuple[np.ndarray, np.ndarray]:
    """The repeated confidence interval estimate +- critical x se."""
    est = np.asarray(estimate, dtype=float)
    half = np.asarray(critical, dtype=float) * np.asarray(se, dtype=float)
    return est - half, est + half


@dataclass(frozen=True)
class Goal:
    """What settles a cell: ``width`` (RCI narrower than ``width``), ``difference`` (RCI
    excludes ``null``, or with a ``margin`` lies within null +- margin) or ``equivalence``
    (RCI within null +- margin). Every cell stops at the cap."""

    kind: str = "difference"
    width: float | None = None
    margin: float | None = None
    null: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in GOALS:
            raise ValueError(f"design.adaptive.goal {self.kind!r}: use one of {GOALS}")
        if self.kind == "width" and not (self.width and self.width > 0):
            raise ValueError("goal width needs a positive target width")
        if self.kind == "equivalence" and not (self.margin and self.margin > 0):
            raise ValueError("goal equivalence needs a positive margin")

    def settled(self, low, high) -> tuple[np.ndarray, np.ndarray]:
        """(settled, reason) per interval (arrays)."""
        lo, hi = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
        ok = np.isfinite(lo) & np.isfinite(hi)
        none = np.zeros(lo.shape, dtype=bool)
        if self.kind == "width":
            hit = ok & (hi - lo <= self.width)
            return hit, np.where(hit, "width reached", "open")
        within = (
            ok & (lo > self.null - self.margin) & (hi < self.null + self.margin)
            if self.margin
            else none
        )
        if self.kind == "equivalence":
            return within, np.where(within, "within the margin", "open")
        excl = ok & ((lo > self.null) | (hi < self.null))
        reason = np.where(within, "within the margin", "open")
        reason = np.where(excl, f"excludes {self.null:g}", reason)
        return excl | within, reason


def decide(goal: Goal, low, high, last: bool) -> tuple[np.ndarray, np.ndarray]:
    """(decision, reason) per interval: ``stop`` when the goal is settled or at the cap."""
    hit, reason = goal.settled(low, high)
    if last:
        reason = np.where(hit, reason, "cap reached")
        return np.full(hit.shape, "stop"), reason
    return np.where(hit, "stop", "continue"), reason


def decision_table(
    round_: int,
    cells: Sequence[str],
    estimate,
    se,
    critical,
    goal: Goal,
    last: bool,
) -> pl.DataFrame:
    """One round's interim decisions (columns DECISION_COLUMNS); ``critical`` one value or
    one per cell (the cells' boundaries differ when their information ratios do)."""
    est = np.asarray(estimate, dtype=float)
    s = np.asarray(se, dtype=float)
    c = np.broadcast_to(np.asarray(critical, dtype=float), est.shape)
    lo, hi = rci(est, s, c)
    decision, reason = decide(goal, lo, hi, last)
    return pl.DataFrame(
        {
            "round": np.full(est.shape, round_, dtype=np.int64),
            "cell": list(cells),
            "estimate": est,
            "se": s,
            "critical": np.asarray(c, dtype=float),
            "ci_low": lo,
            "ci_high": hi,
            "decision": decision.tolist(),
            "reason": reason.tolist(),
        },
        schema={
            "round": pl.Int64, "cell": pl.Utf8, "estimate": pl.Float64, "se": pl.Float64,
            "critical": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64,
            "decision": pl.Utf8, "reason": pl.Utf8,
        },
    )  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """The stopping rule's schedule: ``rounds`` looks at cumulative sizes growing
    geometrically from ``first_fraction`` of the cap to the cap, alpha spent by
    ``spending`` at each round's ``timing``: ``size`` (the share of the cap reached) or
    ``information`` (1 / se^2 over that predicted at the cap)."""

    rounds: int = 3
    first_fraction: float = 0.25
    spending: str = "obrien_fleming"
    gamma: float = -4.0
    alpha: float = 0.05
    timing: str = "information"

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"design.adaptive.rounds must be at least 1, got {self.rounds}")
        if not 0 < self.first_fraction <= 1:
            raise ValueError(
                f"design.adaptive.first_fraction must lie in (0, 1], got {self.first_fraction}"
            )
        if self.spending not in SPENDINGS:
            raise ValueError(f"design.adaptive.spending {self.spending!r}: use one of {SPENDINGS}")
        if self.timing not in TIMINGS:
            raise ValueError(f"design.adaptive.timing {self.timing!r}: use one of {TIMINGS}")

    def fractions(self) -> np.ndarray:
        """Planned shares of the cap after each round: first_fraction^((K - k) / (K - 1))."""
        if self.rounds == 1:
            return np.array([1.0])
        k = np.arange(1, self.rounds + 1)
        return self.first_fraction ** ((self.rounds - k) / (self.rounds - 1))

    def sizes(self, cap: int) -> list[int]:
        """Cumulative sample sizes (the design's size key) of the rounds for a cap of
        ``cap``: each share rounded, at least 1, repeated sizes dropped (fewer rounds)."""
        out: list[int] = []
        for f in self.fractions():
            n = max(1, int(round(f * cap)))
            if not out or n > out[-1]:
                out.append(n)
        if out[-1] != cap:
            out[-1] = cap
        return out

    def critical(
        self,
        sizes: Sequence[int],
        info: Sequence[float] | None = None,
        predicted: float | None = None,
    ) -> np.ndarray:
        """c_k for the rounds so far: ``sizes`` all rounds' cumulative sizes (the last the
        cap), ``info`` the rounds' information 1 / se^2 (default proportional to the sizes).
        Alpha is spent at sizes / cap or info / ``predicted`` (default: the last round's
        information scaled by cap / its size), the last round spending what is left."""
        n_all = np.asarray(sizes, dtype=float)
        i = n_all if info is None else np.asarray(info, dtype=float)
        m = i.size
        if m > n_all.size:
            raise ValueError(f"{m} rounds of information for {n_all.size} rounds")
        n = n_all[:m]
        if self.timing == "size":
            t = n / n_all[-1]
        else:
            cap_info = float(predicted) if predicted else i[-1] * n_all[-1] / n[-1]
            t = np.minimum(i / cap_info, 0.999)
            t = np.maximum.accumulate(t)
            if m == n_all.size:
                t[-1] = 1.0
        return boundaries(t, self.alpha, self.spending, self.gamma, i)


def nested_estimates(
    mean: np.ndarray, var: np.ndarray, sims: int, rng: np.random.Generator
) -> np.ndarray:
    """(sims, K) estimates over K nested rounds from the canonical joint distribution
    (cov(estimate_j, estimate_k) = V_k for j <= k); ``var`` made non-increasing."""
    v = np.minimum.accumulate(np.asarray(var, dtype=float))
    step = np.maximum(v - np.r_[v[1:], 0.0], 0.0)
    inc = rng.standard_normal((sims, v.size)) * np.sqrt(step)
    return np.asarray(mean, dtype=float) + np.cumsum(inc[:, ::-1], axis=1)[:, ::-1]


@dataclass
class Outcome:
    """A stopping rule run on simulated datasets."""

    stop_round: np.ndarray
    """(sims,) the round (0-based) each dataset stopped at."""
    estimate: np.ndarray
    low: np.ndarray
    high: np.ndarray
    reason: np.ndarray
    """The RCI and reason at the stopping round."""

    def covers(self, truth: float) -> np.ndarray:
        return (self.low <= truth) & (truth <= self.high)

    def rejects(self, null: float = 0.0) -> np.ndarray:
        return (self.low > null) | (self.high < null)


def run_rule(estimates: np.ndarray, se: np.ndarray, critical: np.ndarray, goal: Goal) -> Outcome:
    """Apply the rule to (sims, K) estimates and standard errors ((K,) or (sims, K)): each
    dataset stops at its first settled round, else at the last."""
    est = np.asarray(estimates, dtype=float)
    s = np.broadcast_to(np.asarray(se, dtype=float), est.shape)
    c = np.broadcast_to(np.asarray(critical, dtype=float), est.shape)
    lo, hi = rci(est, s, c)
    hit, reason = goal.settled(lo, hi)
    hit[:, -1] = True
    k = hit.argmax(axis=1)
    idx = np.arange(est.shape[0])
    last = k == est.shape[1] - 1
    r = reason[idx, k]
    r = np.where(last & (r == "open"), "cap reached", r)
    return Outcome(k, est[idx, k], lo[idx, k], hi[idx, k], r)
