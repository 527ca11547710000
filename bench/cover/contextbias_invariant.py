"""Coverage of the report's bias-profile row "context-invariant pairs %" (issue 20): the
share of tested (role, label) pairs of one generator whose ccs.parquet flag ``consistent``
is true (the released rule: >= 5 occurrences, chi-squared p > 0.05 with a skipped test at
p = 1, range <= 5 pp), with its 95% interval.

World: the planner's (stereolens.contextbias.design_worlds; tests/design_worlds.small_world
with 30 configured roles and 4 seeds at "test", config/config.yaml's prior world at "paper":
92 roles, 30 dimensions, 10 seeds per prompt), one generator. A dataset draws the configured
roles from the world's population of roles with replacement, then images and labels
(contextbias.design.draw_role_counts), writes the long attributes table a real run writes
(contextbias_worlds.attributes_table) and runs the real contextbias.ccs.ccs_table and
contextbias.invariant.invariant_share on it. The worlds simulate two conditions (CF and
CA-U; the chi-squared test has df 1).

Estimand: roles are a sample of a population of roles (the report's reading: a property of
the generator for occupations like these; the BI shift beside it uses the role bootstrap),
so the truth is E[K] / E[N] (flagged pairs over pairs, summed over roles) for a new draw of
roles and images: simulated through the same code on TRUTH_ROLES[scale] roles (a ratio of
sums, its Monte Carlo error printed in the row's note).

Rows: the Wilson interval on k of n pairs the report printed before (pairs as independent
trials) and the interval it prints now (Wilson on k / deff, n / deff, deff over roles). The
"demo" scale has no row: config/demo.yaml has 2 roles, under interval_min_roles (10), and the
report withholds the interval there.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from cover import Row

SCALES = {
    "test": {"roles": 30, "seeds": 4},
    "paper": {"roles": None, "seeds": 10},
}
VARIANTS = {
    "test": [""],
    "paper": ["", "10 roles", "role-varying sensitivity"],
}
"""Worlds of a scale: "" = the planner's world as it is; "10 roles" = its first 10 configured
roles (the report's minimum, interval_min_roles); "role-varying sensitivity" = a stress
world: each population role's two conditions redrawn as Dirichlet(kappa_r x centre), centre
= the mean of its two conditions in the prior world, kappa_r = KAPPA x exp(N(0, 1)) (some
occupations far more context-sensitive than others: the role-level dependence of the flags
the plain Wilson interval ignores)."""
KAPPA = 6.0
TRUTH_ROLES = {"test": 30 * 100, "paper": 92 * 100}
"""Roles drawn for the truth (in chunks of TRUTH_CHUNK configured-role sets)."""
TRUTH_CHUNK = 20


@lru_cache(maxsize=8)
def _world(scale: str, variant: str = ""):
    """One generator ("g1") of small_world (30 roles) or of config/config.yaml's prior world,
    changed per ``variant`` (VARIANTS)."""
    from stereolens.contextbias import design_worlds as CW

    if scale == "test":
        root = Path(__file__).resolve().parents[2]
        sys.path.insert(0, str(root / "tests"))
        from design_worlds import small_world

        return small_world(SCALES["test"]["roles"], gens=("g1",), seed=0)
    from stereolens.config import load_config
    from stereolens.design.priors import load_priors

    config, _ = load_config(Path(__file__).resolve().parents[2] / "config" / "config.yaml")
    config["contextbias"]["generators"] = ["g1"]
    world = CW.prior_world(config, load_priors(), seed=0)
    if variant == "10 roles":
        return replace(world, prompts=world.prompts[:10], role_names=world.role_names[:10])
    if variant == "role-varying sensitivity":
        rng = np.random.default_rng([31, 7])
        centre = world.roles.mean(axis=2, keepdims=True)  # (1, R, 1, L)
        kappa = KAPPA * np.exp(rng.normal(0.0, 1.0, centre.shape[1]))[None, :, None, None]
        alpha = np.broadcast_to(kappa * centre, world.roles.shape)
        return replace(world, roles=CW.dirichlet(rng, alpha, world.starts, world.segment))
    return world


def _flags(world, by_role, d):
    """(k_r, n_r) per role of dataset ``d`` through ccs_table, and the invariant_share row."""
    import polars as pl

    from stereolens.contextbias.ccs import ccs_table
    from stereolens.contextbias.design_worlds import attributes_table
    from stereolens.contextbias.invariant import invariant_share

    ccs = ccs_table(attributes_table(world, by_role, d))
    per = ccs.group_by("role").agg(pl.col("consistent").sum().alias("k"), pl.len().alias("n"))
    return per, invariant_share(ccs).row(0, named=True)


@lru_cache(maxsize=8)
def _truth(scale: str, variant: str = "") -> tuple[float, float]:
    """E[K] / E[N] over TRUTH_ROLES[scale] drawn roles (percent) and its Monte Carlo error
    (ratio-estimator standard error over roles)."""
    from stereolens.contextbias.design import draw_role_counts

    world = _world(scale, variant)
    m = TRUTH_CHUNK
    big = replace(
        world,
        prompts=np.tile(world.prompts, (m, 1)),
        role_names=[f"{r}_{i}" for i in range(m) for r in world.role_names],
    )
    per_set = world.prompts.shape[0] * m
    sets = -(-TRUTH_ROLES[scale] // per_set)
    rng = np.random.default_rng([20, 7, len(scale), len(variant)])
    k, n = [], []
    for _ in range(sets):
        _, by_role = draw_role_counts(big, SCALES[scale]["seeds"], 1, rng, keep_roles=True)
        per, _ = _flags(big, by_role, 0)
        k.append(per["k"].to_numpy())
        n.append(per["n"].to_numpy())
    k, n = np.concatenate(k).astype(float), np.concatenate(n).astype(float)
    p = k.sum() / n.sum()
    se = np.sqrt(((k - p * n) ** 2).sum() / (len(k) * (len(k) - 1))) / n.mean()
    return 100.0 * p, 100.0 * se


@lru_cache(maxsize=8)
def _simulate(
    scale: str, variant: str, n: int
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per dataset: the estimate (%) with the plain Wilson interval on k of n pairs and with
    invariant_share's interval (the same datasets for both rows)."""
    from stereolens.contextbias.design import draw_role_counts
    from stereolens.metrics.group_audit import wilson

    world = _world(scale, variant)
    rng = np.random.default_rng([20, n, len(scale), 11])
    _, by_role = draw_role_counts(world, SCALES[scale]["seeds"], n, rng, keep_roles=True)
    plain, deff = [], []
    for d in range(n):
        _, row = _flags(world, by_role, d)
        lo, hi = wilson(np.array([row["k"]]), np.array([row["n"]]))
        plain.append((row["estimate"], 100.0 * lo[0], 100.0 * hi[0]))
        deff.append((row["estimate"], row["ci_low"], row["ci_high"]))
    as_arrays = lambda v: tuple(np.array(v, dtype=float).T)  # noqa: E731
    return {"plain": as_arrays(plain), "deff": as_arrays(deff)}


def _row(scale: str, variant: str, key: str, interval: str) -> Row:
    def draw(rng, n):
        return _simulate(scale, variant, n)[key]

    truth, mc = _truth(scale, variant)
    roles = _world(scale, variant).prompts.shape[0]
    what = f", {variant}" if variant and variant != "10 roles" else ""
    name = (
        f"contextbias {scale}: context-invariant pairs % g1, {roles} roles{what}, truth "
        f"{truth:.2f} +- {mc:.2f} (simulated, {TRUTH_ROLES[scale]:,} roles)"
    )
    return Row(name, "contextbias", interval, truth, draw)


def rows(scale: str) -> list[Row]:
    """Per world of the scale (VARIANTS): the report's interval; at "paper" also the plain
    Wilson interval the report printed before (on the same datasets)."""
    if scale not in SCALES:
        return []
    out = []
    for v in VARIANTS[scale]:
        out.append(_row(scale, v, "deff", "Wilson on k/deff, n/deff, deff over roles (report)"))
        if scale != "test":
            out.append(_row(scale, v, "plain", "Wilson on k of n pairs (before)"))
    return out
