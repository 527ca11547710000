"""The power engine of `stereolens plan --power`: power curves from simulated estimates,
minimum detectable effects and the sample size a target effect needs (its tests and the MDE:
docs/planner.md, "The engine")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

# scipy.stats (about 0.5 s of CPU to import) is imported in power_curve, its one user: every
# `stereolens` command imports this module when it builds its parser (plan's options)

DEFAULT_SIMULATIONS = 200
"""Simulated datasets per design point (at 80% power an MDE's Monte Carlo error is about
6% of its value)."""
DEFAULT_LEVEL = 0.05
DEFAULT_POWER = 0.80
DEFAULT_SEED = 0
MAX_SEARCH = 100_000
"""The largest sample-size value a target-effect search tries."""


@dataclass(frozen=True)
class EffectSpec:
    """One headline comparison of a benchmark."""

    name: str
    """Target-effect name, e.g. ``contextbias.bi_shift`` or ``lvlm.tvd.story.gender``."""
    benchmark: str
    comparison: str
    """What is compared, in words (``CA-U - CF, overall, mean of 4 generators``)."""
    unit: str
    """The unit of the effect (``BI``, ``S_imp``, ``TVD x100``)."""
    test: str
    """``interval`` or ``floor`` (see the module docstring)."""
    null_value: float = 0.0
    definition: str = ""
    """How the population effect is defined and planted."""
    df: int | None = None
    """Degrees of freedom of the pipeline's standard error (ContextBias: roles - 1, the role
    bootstrap's clusters); None = many (the error of the SE is negligible)."""
    estimand: str = ""
    """What the effect is a property of: fixed units ("these 214 subjects and their
    prompts") or a new draw of them ("a new draw of 92 roles")."""
    family: int = 1
    """Tests in the report's multiplicity family of this comparison (BiasIG: K(K-1)/2 model
    pairs, Holm); 1 = tested alone."""
    interval_test: str = ""
    """The pipeline's interval test in words where |estimate (+ shift) - null| > z x se
    does not say it; "" = that rule."""


@dataclass
class Simulation:
    """Estimates of every effect of a design at one size: name -> (W, sims)."""

    estimates: dict[str, np.ndarray]
    shift: dict[str, np.ndarray] = field(default_factory=dict)
    """name -> (W,) how far the pipeline's interval is centred from the estimate; the test
    rejects when |estimate + shift - null| > z sd. (W, sims): each dataset's own."""
    scale: dict[str, np.ndarray] = field(default_factory=dict)
    """name -> (W,) the standard error of the pipeline's interval where an emulation of its
    bootstrap gives one, replacing sd in the rule; (W, sims): each dataset's emulated se,
    whose own test then decides it."""
    t_df: dict[str, int] = field(default_factory=dict)
    """name -> the degrees of freedom of the t quantile the pipeline's interval uses in place
    of z (ContextBias's "bc-t" interval: roles - 1); the rule's critical value is then
    t_(1 - level/2, t_df) at the planner's level."""

    def curve_args(self, name: str) -> dict[str, Any]:
        """power_curve's keyword arguments for effect ``name``: shift, scale, t_df (None: unset)."""
        return {
            "shift": self.shift.get(name),
            "scale": self.scale.get(name),
            "t_df": self.t_df.get(name),
        }


class Design(Protocol):
    benchmark: str
    basis: str
    """``prior`` or ``pilot <dir>``: where the world's parameters come from."""
    knob: tuple[str, ...]
    """The config key of the sample size (``contextbias.seeds.per_prompt``)."""
    knob_label: str
    knob_value: int
    grid: np.ndarray
    notes: list[str]

    def specs(self) -> list[EffectSpec]: ...

    def effects(self, w: np.ndarray) -> dict[str, np.ndarray]:
        """Population effect of every spec at each ``w`` (deterministic)."""
        ...

    def simulate(self, n: int, w: np.ndarray, sims: int, rng: np.random.Generator) -> Simulation:
        """Estimates on ``sims`` datasets of size ``n`` at each ``w`` (w[0] = 0 for floor tests)."""
        ...


@dataclass
class Row:
    """One line of the power table."""

    name: str
    benchmark: str
    comparison: str
    unit: str
    test: str
    knob: str
    size: int
    mde: float | None
    """None: the target power is not reached on the grid (the effect must exceed max_effect)."""
    max_effect: float
    size_rate: float
    """Rejection rate at w = 0 (the test's false-positive rate in the null world)."""
    floor: float | None
    """Mean estimate at w = 0 (the noise floor of a floor test)."""
    sims: int
    basis: str
    method: str
    definition: str
    curve: list[tuple[float, float]] = field(default_factory=list)
    """(population effect, rejection rate) at each grid point."""
    status: str = "ok"
    """ok; not reached (the target power is not reached on the grid); invalid (the test
    rejects at least as often as the target power with no effect: no MDE means anything)."""
    estimand: str = ""
    family: int = 1
    mde_holm: float | None = None
    """The MDE at level / family (Holm's first step); None when family is 1 or not reached."""


def power_curve(
    spec: EffectSpec,
    estimates: np.ndarray,
    level: float,
    null_row: np.ndarray | None = None,
    shift: np.ndarray | None = None,
    scale: np.ndarray | None = None,
    t_df: int | None = None,
) -> np.ndarray:
    """(W,) rejection rates: the mean over the ``sims`` datasets of the probability that the
    pipeline's test rejects (an undefined estimate does not). ``null_row``: the estimates at
    w = 0 (default estimates[0]). Interval tests reject when |estimate (+ shift) - null| >
    c x sd (sd the spread over datasets, or ``scale``; c from z, or t(t_df)); with
    ``spec.df`` a dataset rejects with probability P(chi2(df) < df (estimate / (c sd))^2)."""
    from scipy import stats

    est = np.asarray(estimates, dtype=float)
    if spec.test == "interval":
        q = 1.0 - level / 2.0
        crit = stats.t.ppf(q, t_df) if t_df else stats.norm.ppf(q)
        with np.errstate(invalid="ignore", divide="ignore"):
            sd = np.nanstd(est, axis=1, ddof=1)
            if scale is not None:
                sd = np.asarray(scale, dtype=float)
            centre = est if shift is None else est + _per_dataset(shift)
            t = np.abs(centre - spec.null_value) / (crit * _per_dataset(sd))
        if spec.df is None or sd.ndim == 2:
            return np.where(np.isfinite(t), t > 1.0, False).astype(float).mean(axis=1)
        return np.where(np.isfinite(t), stats.chi2.cdf(spec.df * t**2, spec.df), 0.0).mean(axis=1)
    if spec.test == "null":
        base = (est[0] if null_row is None else np.asarray(null_row, dtype=float)) - spec.null_value
        base = np.abs(base[np.isfinite(base)])
        if base.size == 0:
            return np.zeros(est.shape[0])
        crit = np.quantile(base, 1.0 - level)
        return (np.isfinite(est) & (np.abs(est - spec.null_value) > crit)).mean(axis=1)
    if spec.test == "floor":
        base = est[0] if null_row is None else np.asarray(null_row, dtype=float)
        base = base[np.isfinite(base)]
        if base.size == 0:
            return np.zeros(est.shape[0])
        crit = np.quantile(base, 1.0 - level)
        return (est > crit).mean(axis=1)
    raise ValueError(f"test {spec.test!r}; use interval, null or floor")


def _per_dataset(x) -> np.ndarray:
    """A (W,) value as (W, 1), a (W, sims) one as it is."""
    x = np.asarray(x, dtype=float)
    return x[:, None] if x.ndim == 1 else x


def interpolate_mde(effects: np.ndarray, curve: np.ndarray, power: float) -> float | None:
    """The effect at which ``curve`` first reaches ``power`` (linear between grid points);
    None when it never does. ``effects`` must increase along the grid."""
    above = np.flatnonzero(curve >= power)
    if above.size == 0:
        return None
    i = int(above[0])
    if i == 0:
        return float(effects[0])
    e0, e1 = effects[i - 1], effects[i]
    p0, p1 = curve[i - 1], curve[i]
    t = 0.0 if p1 == p0 else (power - p0) / (p1 - p0)
    return float(e0 + t * (e1 - e0))


def _method(
    spec: EffectSpec, sims: int, level: float, design: Design, sim: Simulation | None = None
) -> str:
    if spec.test == "interval":
        centre = "estimate"
        if sim is not None and spec.name in sim.shift:
            centre = "estimate + the bootstrap's shift"
        se = "sd over the simulated datasets"
        own = sim is not None and np.ndim(sim.scale.get(spec.name)) == 2
        if sim is not None and spec.name in sim.scale:
            se = "the emulated pipeline bootstrap's standard error"
        if own:
            se += " of each dataset"
        df = sim.t_df.get(spec.name) if sim is not None else None
        # the critical value: the pipeline's bc-t interval takes t(R - 1)'s quantile, not z's
        crit = f"t({df})" if df else "z"
        rule = spec.interval_test or f"|{centre} - {spec.null_value:g}| > {crit} x {se}"
        test = (
            f"two-sided {level:g}: {rule}"
            + (f", with its error from {spec.df + 1} clusters" if spec.df and not own else "")
            + " (the pipeline's bootstrap interval excludes the null)"
        )
        if spec.family > 1 and not spec.interval_test:
            test = (
                f"Wald test of the difference B - A with the bootstrap standard error, "
                f"two-sided {level:g}: |{centre}| > {crit} x {se} (stereolens.metrics.compare: "
                f"difference = b - a of the compared estimates, the bias-corrected ones where "
                f"the benchmark corrects them, se = sd of rep_b - rep_a); MDE (Holm) at level "
                f"{level:g}/{spec.family}, Holm's first step over the {spec.family} model pairs "
                "of the metric"
            )
    elif spec.test == "null":
        test = (
            f"two-sided {level:g}, calibrated on the world's null: |estimate - "
            f"{spec.null_value:g}| above the {1 - level:g} quantile of its values with no effect "
            "(stereolens.biasig.design_check.eta_rejects)"
        )
    else:
        test = (
            f"one-sided {level:g}: estimate above the {1 - level:g} quantile of the estimates "
            "with no effect (the pipeline's permutation p_perm <= level)"
        )
    return (
        f"{sims} seeded simulated datasets ({design.basis}) through the project's estimator; {test}"
    )


def mde_rows(
    design: Design,
    *,
    level: float = DEFAULT_LEVEL,
    power: float = DEFAULT_POWER,
    sims: int = DEFAULT_SIMULATIONS,
    seed: int = DEFAULT_SEED,
) -> list[Row]:
    """The MDE of every spec of ``design`` at its configured size."""
    check_options(level, power, sims)
    rng = np.random.default_rng([seed, _stream(design.benchmark)])
    sim = design.simulate(design.knob_value, design.grid, sims, rng)
    effects = design.effects(design.grid)
    rows = []
    for spec in design.specs():
        est = sim.estimates[spec.name]
        eff = effects[spec.name]
        curve = power_curve(spec, est, level, **sim.curve_args(spec.name))
        with np.errstate(invalid="ignore"):
            floor = float(np.nanmean(est[0])) if spec.test == "floor" else None
        mde = interpolate_mde(eff, curve, power)
        status = "invalid" if curve[0] >= power else "ok" if mde is not None else "not reached"
        mde_holm = None
        if spec.family > 1 and status == "ok":
            strict = power_curve(spec, est, level / spec.family, **sim.curve_args(spec.name))
            mde_holm = interpolate_mde(eff, strict, power)
        rows.append(
            Row(
                name=spec.name,
                benchmark=spec.benchmark,
                comparison=spec.comparison,
                unit=spec.unit,
                test=spec.test,
                knob=design.knob_label,
                size=design.knob_value,
                mde=mde if status == "ok" else None,
                max_effect=float(eff[-1]),
                size_rate=float(curve[0]),
                floor=floor,
                sims=sims,
                basis=design.basis,
                method=_method(spec, sims, level, design, sim),
                definition=spec.definition,
                curve=[(float(e), float(p)) for e, p in zip(eff, curve, strict=True)],
                status=status,
                estimand=spec.estimand,
                family=spec.family,
                mde_holm=mde_holm,
            )
        )
    return rows


def check_options(level: float, power: float, sims: int) -> None:
    if not 0.0 < level < 0.5:
        raise ValueError(f"design.level must lie between 0 and 0.5, got {level}")
    if not 0.0 < power < 1.0:
        raise ValueError(f"design.target_power must lie between 0 and 1, got {power}")
    if sims < 20:
        raise ValueError(f"design.simulations must be at least 20, got {sims}")


def _stream(name: str) -> int:
    from stereolens.ids import stable_id

    return int(stable_id("design-power", name, length=15), 16)


def invert_effect(design: Design, name: str, target: float) -> float | None:
    """The planted strength w whose population effect is ``target``; None beyond every effect."""
    from scipy.optimize import brentq

    lo, hi = float(design.grid[0]), float(design.grid[-1])

    def f(w: float) -> float:
        return float(design.effects(np.array([w]))[name][0]) - target

    if f(hi) < 0:
        return None
    if f(lo) >= 0:
        return lo
    return float(brentq(f, lo, hi, xtol=1e-7))


@dataclass
class Requirement:
    """The size a target effect needs."""

    name: str
    target: float
    knob: tuple[str, ...]
    knob_label: str
    configured: int
    needed: int | None
    """None: not reachable by this sample size alone (up to ``tried``)."""
    power_at_needed: float | None
    tried: int
    power_at_tried: float
    note: str = ""


def required_size(
    design: Design,
    name: str,
    target: float,
    *,
    level: float = DEFAULT_LEVEL,
    power: float = DEFAULT_POWER,
    sims: int = DEFAULT_SIMULATIONS,
    seed: int = DEFAULT_SEED,
    limit: int | None = None,
) -> Requirement:
    """The smallest value of the design's sample-size key at which the named effect of size
    ``target`` is detected with ``power``: doubling, then bisection, on ``sims`` datasets
    with common random numbers across sizes."""
    check_options(level, power, sims)
    spec = next((s for s in design.specs() if s.name == name), None)
    if spec is None:
        raise ValueError(f"{name!r} is not an effect of {design.benchmark}")
    limit = limit or getattr(design, "search_limit", MAX_SEARCH)
    w = invert_effect(design, name, target)
    base = dict(
        name=name, target=target, knob=design.knob, knob_label=design.knob_label,
        configured=design.knob_value,
    )  # fmt: skip
    if w is None:
        top = float(design.effects(design.grid)[name][-1])
        return Requirement(
            **base, needed=None, power_at_needed=None, tried=design.knob_value,
            power_at_tried=float("nan"),
            note=f"{target:g} {spec.unit} is beyond the largest effect the world can plant "
            f"({top:.4g})",
        )  # fmt: skip
    grid = np.array([0.0, w]) if w > 0 else np.array([0.0])
    cache: dict[int, float] = {}

    def rate(n: int) -> float:
        if n not in cache:
            rng = np.random.default_rng([seed, _stream(design.benchmark), 1])
            sim = design.simulate(n, grid, sims, rng)
            curve = power_curve(spec, sim.estimates[name], level, **sim.curve_args(name))
            cache[n] = float(curve[-1])
        return cache[n]

    n0 = max(1, design.knob_value)
    if rate(n0) >= power:
        hi = n0
        lo = n0 // 2
        while lo >= 1 and rate(lo) >= power:
            hi, lo = lo, lo // 2
        lo = max(lo, 0)
    else:
        lo, hi = n0, n0 * 2
        while rate(hi) < power:
            if hi >= limit:
                return Requirement(
                    **base, needed=None, power_at_needed=None, tried=hi,
                    power_at_tried=rate(hi),
                    note=f"power {rate(hi):.2f} at {hi} {design.knob_label}: this size alone "
                    "does not reach the target",
                )  # fmt: skip
            lo, hi = hi, min(hi * 2, limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mid >= 1 and rate(mid) >= power:
            hi = mid
        else:
            lo = mid
    return Requirement(
        **base, needed=hi, power_at_needed=rate(hi), tried=hi, power_at_tried=rate(hi)
    )


def set_key(config: dict[str, Any], key: Sequence[str], value: Any) -> dict[str, Any]:
    """A deep copy of ``config`` with ``config[key[0]][key[1]]... = value``."""
    import copy

    out = copy.deepcopy(config)
    node = out
    for k in key[:-1]:
        node = node[k]
    node[key[-1]] = value
    return out


def parse_target(text: str) -> tuple[str, float]:
    """NAME=VALUE -> (name, value); raise ValueError naming the problem."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(
            f"--target-effect {text!r}: write NAME=VALUE, e.g. contextbias.bi_shift=0.02"
        )
    try:
        v = float(value)
    except ValueError:
        raise ValueError(f"--target-effect {text!r}: {value!r} is not a number") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"--target-effect {text!r}: the effect must be a positive number")
    return name.strip(), v
