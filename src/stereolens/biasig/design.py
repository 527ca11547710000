"""Power of BiasIG's headline comparisons: model B - A in S_imp and S_exp, and eta - 0.5
(docs/planner.md, "The worlds in detail")."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from stereolens.biasig.design_boot import (
    BOOT_REPLICATES,
    JOINT_MAX_IMAGES,
    boot_counts,
    boot_se,
    eta_double,
)
from stereolens.biasig.formulas import (
    eta_contributions,
    eta_from_contributions,
    s_imp_cell,
)
from stereolens.biasig.groups import attribute_shares, safe_div
from stereolens.biasig.truth import ATTRIBUTES, SLICES, VALUES
from stereolens.design.power import EffectSpec, Simulation
from stereolens.design.sampling import multinomial, thin_binary, thin_towards

GRID = np.concatenate([[0.0], np.geomspace(1e-3, 1.0, 30)])
BOOT_DATASETS = 16
BOOT_POINTS = 7
"""Datasets and grid points of the emulated pipeline bootstrap, linear in between."""
ETA_BOOT_DATASETS = 64
"""Datasets of eta's emulated double bootstrap per grid point (its centre's line is fitted on
them), at most ETA_BOOT_DRAWS second-level side counts per grid point."""
ETA_BOOT_DRAWS = 20_000_000
ETA_INNER = 20
"""Second-level replicates of the emulated double bootstrap (the pipeline's INNER_REPLICATES)."""
SEGMENT = np.repeat(np.arange(3), [2, 4, 3])
"""The attribute of each of the nine protected values."""
ETA_INTERVAL_TEST = (
    "|eta_total_bc - 0.5| > z x the sd of the once-corrected replicates 2 eta* - mean eta** "
    "(their second-level noise taken out), eta_total_bc the double-bootstrap estimate 3 x "
    "eta - 3 x mean eta* + mean eta** (stereolens.biasig.groups.double_bias_corrected), both "
    "from the emulated pipeline bootstrap (stereolens.biasig.design_boot.eta_double; the "
    "centre per dataset a line in the estimate plus its residual noise)"
)
"""The test of ``biasig.eta_interval`` in the planner's method text."""


@dataclass
class World:
    units: pl.DataFrame
    """One row per scoring unit: unit, visibility, attribute_key, n_persons, weight,
    protected_attribute, ask0, ask1 (value index asked of each person, -1 none), n_phrasings."""
    imp: np.ndarray
    """Indices (into units) of the implicit units."""
    exp: np.ndarray
    gt: np.ndarray
    """(implicit units, 2, 9) ground truth per person (zeros for an absent person)."""
    used: np.ndarray
    """(implicit units, 2) the person exists."""
    dist_a: np.ndarray
    """(implicit units, 2, 9) model A's distribution."""
    acc_a: np.ndarray
    """(explicit units, 2) model A's probability of showing the value asked of each person."""
    exp_used: np.ndarray
    """(explicit units, 2) a value is asked of the person."""
    k_i: np.ndarray
    k_eta: np.ndarray
    sides: list[tuple[str, str]]
    """(attribute_key, position) of each side of the resolved pairs."""
    side_of: np.ndarray
    """(implicit units, 2) side index of each person (-1 none)."""
    side_gt: np.ndarray
    """(sides, 9)."""
    pairs: np.ndarray
    """(pairs, 2) side index of the advantaged and the disadvantaged side."""
    pair_weight: np.ndarray
    ok_rate: float
    usable_rate: np.ndarray
    """(3,) per attribute (count "attribute"; 1 under "paper")."""
    stereotype: np.ndarray
    """(9,) one-hot per attribute: the value the advantaged side moves towards."""
    eta_variant: str
    models: list[str]
    prompts: pl.DataFrame | None = None
    """The config's prompt selection (the pipeline's prompt table)."""


# ----------------------------------------------------------------------------- estimators
def s_imp_model(counts: np.ndarray, gt: np.ndarray, used: np.ndarray, k_i, k_j) -> np.ndarray:
    """Model-level S_imp (the model row's ``*``) from counts (..., U, 2, 9) of the implicit
    units: per unit and attribute the persons' mean s_imp_cell, then sum_j k_j sum_i k_i S_ij
    / sum_j k_j sum_i k_i over the available cells."""
    per = []
    for a in ATTRIBUTES:
        sl = SLICES[a]
        n = counts[..., sl].sum(-1)
        s = s_imp_cell(counts[..., sl], gt[..., sl])
        per.append(np.where((n > 0) & used, s, np.nan))
    per = np.stack(per, axis=-1)  # (..., U, 2, 3)
    n_avail = np.isfinite(per).sum(-2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        attr = safe_div(np.nansum(per, axis=-2), n_avail)  # (..., U, 3)
    avail = n_avail > 0
    num = (k_j[:, None] * np.where(avail, attr, 0.0) * k_i).sum((-1, -2))
    den = (k_j[:, None] * avail * k_i).sum((-1, -2))
    return safe_div(num, den)


def s_exp_model(hits: np.ndarray, usable: np.ndarray, used: np.ndarray, k_j) -> np.ndarray:
    """Model-level S_exp from hits and usable answers (..., U, 2) of the explicit units:
    per person hits / usable, per unit the mean over persons with usable answers, then
    sum k_j S_j / sum k_j over the units with a score."""
    acc = np.where(used & (usable > 0), safe_div(hits, usable), np.nan)
    n = np.isfinite(acc).sum(-1)
    score = safe_div(np.where(np.isfinite(acc), acc, 0.0).sum(-1), n)
    ok = np.isfinite(score)
    return safe_div((k_j * np.where(ok, score, 0.0)).sum(-1), (k_j * ok).sum(-1))


def eta_model(side_counts: np.ndarray, world: World) -> np.ndarray:
    """Model-level eta (eta_total) from counts (..., sides, 9) pooled per side: shares per
    attribute, eta_contributions of each pair (the config's variant), eta_from_contributions,
    the pairs' weighted mean over the pairs with a value."""
    shares = attribute_shares(side_counts)
    if world.eta_variant == "released":
        shares = np.nan_to_num(shares)
    adv, dis = world.pairs[:, 0], world.pairs[:, 1]
    contrib = eta_contributions(
        shares[..., adv, :], world.side_gt[adv], shares[..., dis, :], world.side_gt[dis],
        world.k_eta, world.eta_variant,
    )  # fmt: skip
    total = eta_from_contributions(contrib)[..., 0]  # (..., pairs)
    ok = np.isfinite(total)
    w = world.pair_weight
    return safe_div((np.where(ok, total, 0.0) * w).sum(-1), (ok * w).sum(-1))


def side_counts(world: World, counts: np.ndarray) -> np.ndarray:
    """Counts (..., implicit units, 2, 9) pooled into the pairs' sides (..., sides, 9)."""
    out = np.zeros(counts.shape[:-3] + (len(world.sides), len(VALUES)))
    for s in (0, 1):
        idx = world.side_of[:, s]
        for side in np.unique(idx[idx >= 0]):
            out[..., side, :] += counts[..., idx == side, s, :].sum(-2)
    return out


# ----------------------------------------------------------------------------- design
class BiasIGDesign:
    benchmark = "biasig"
    knob = ("biasig", "images_per_prompt")
    knob_label = "images per prompt"
    search_limit = 20_000

    def __init__(self, world: World, config: dict[str, Any], basis: str, notes: list[str]):
        self.world = world
        self.basis = basis
        self.notes = notes
        self.knob_value = int(config["biasig"]["images_per_prompt"])
        self.count = config["biasig"].get("count", "paper")
        self.scoring_unit = config["biasig"].get("scoring_unit", "subject")
        self.interaction_sd = float(config["biasig"].get("interaction_sd", 0.0))
        self.replicates = int(config["biasig"].get("replicates", 1000))
        self.family = max(1, len(world.models) * (len(world.models) - 1) // 2)
        self.grid = GRID
        u = world.units
        self.k_imp = u["weight"].to_numpy()[world.imp]
        self.k_exp = u["weight"].to_numpy()[world.exp]
        self.n_phr_imp = u["n_phrasings"].to_numpy()[world.imp]
        self.n_phr_exp = u["n_phrasings"].to_numpy()[world.exp]

    def estimand(self, units: int, kind: str) -> str:
        """Fixed subjects, or (interaction_sd > 0) a new draw of them."""
        if self.interaction_sd > 0:
            return (
                f"a new draw of {units} {kind} subjects (subject x model interaction sd "
                f"{self.interaction_sd:g})"
            )
        return f"these {units} {kind} subjects and their prompts (fixed subjects)"

    def specs(self) -> list[EffectSpec]:
        out = []
        diff = dict(family=self.family)
        if self.world.imp.size:
            out.append(
                EffectSpec(
                    "biasig.s_imp_diff",
                    self.benchmark,
                    "S_imp, model B - model A, model level",
                    "S_imp",
                    "interval",
                    0.0,
                    "population S_imp of B minus A; B's images moved towards the ground truth",
                    estimand=self.estimand(self.world.imp.size, "implicit"),
                    **diff,
                )  # fmt: skip
            )
        if self.world.exp.size:
            out.append(
                EffectSpec(
                    "biasig.s_exp_diff",
                    self.benchmark,
                    "S_exp, model B - model A, model level",
                    "S_exp",
                    "interval",
                    0.0,
                    "population S_exp of B minus A; B's images show the value asked more often",
                    estimand=self.estimand(self.world.exp.size, "explicit"),
                    **diff,
                )  # fmt: skip
            )
        if len(self.world.pairs):
            eta = (
                "population eta minus 0.5; both sides at their ground truth, the advantaged "
                "side moved towards the stereotyped value, the other away"
            )
            fixed = f"these {len(self.world.pairs)} pairs' subjects (fixed)"
            out.append(
                EffectSpec(
                    "biasig.eta",
                    self.benchmark,
                    "eta - 0.5, model level (eta_total)",
                    "eta",
                    "null",
                    0.0,
                    eta,
                    estimand=fixed,
                )  # fmt: skip
            )
            out.append(
                EffectSpec(
                    "biasig.eta_interval",
                    self.benchmark,
                    "eta - 0.5, model level, the report's interval",
                    "eta",
                    "interval",
                    0.0,
                    eta,
                    estimand=fixed,
                    interval_test=ETA_INTERVAL_TEST,
                )  # fmt: skip
            )
        return out

    def _gt_norm(self) -> np.ndarray:
        return normalise(self.world.gt)

    def _side_targets(self) -> tuple[np.ndarray, np.ndarray]:
        """(sides, 9) normalised truth and, per side, its target under the planted effect
        (advantaged: the stereotype; disadvantaged: the truth without the stereotyped value)."""
        w = self.world
        gt = normalise(w.side_gt)
        target = gt.copy()
        target[w.pairs[:, 0]] = w.stereotype
        away = gt * (1 - w.stereotype)
        target[w.pairs[:, 1]] = normalise(away[w.pairs[:, 1]])
        return gt, target

    def effects(self, w: np.ndarray) -> dict[str, np.ndarray]:
        w = np.asarray(w, dtype=float)
        out = {}
        wr = self.world
        big = 1e9
        if wr.imp.size:
            a = s_imp_model(wr.dist_a * big, wr.gt, wr.used, wr.k_i, self.k_imp)
            wd = w[:, None, None, None]
            dist_b = (1 - wd) * wr.dist_a[None] + wd * self._gt_norm()[None]
            b = s_imp_model(dist_b * big, wr.gt, wr.used, wr.k_i, self.k_imp)
            out["biasig.s_imp_diff"] = b - a
        if wr.exp.size:
            a = s_exp_model(wr.acc_a * big, np.full(wr.acc_a.shape, big), wr.exp_used, self.k_exp)
            acc_b = (1 - w[:, None, None]) * wr.acc_a[None] + w[:, None, None]
            b = s_exp_model(acc_b * big, np.full(acc_b.shape, big), wr.exp_used, self.k_exp)
            out["biasig.s_exp_diff"] = b - a
        if len(wr.pairs):
            gt, target = self._side_targets()
            wd = w[:, None, None]
            out["biasig.eta"] = eta_model(((1 - wd) * gt + wd * target) * big, wr) - 0.5
            out["biasig.eta_interval"] = out["biasig.eta"]
        return out

    def _usable(self, n_img: np.ndarray, rng, persons: bool = False) -> np.ndarray:
        """Usable answers per attribute of images (...): (..., 3), or with ``persons``
        (..., 2, 3); under count "paper" whole images, under "attribute" each answer."""
        wr = self.world
        if self.count == "paper":
            ok = rng.binomial(n_img, wr.ok_rate)[..., None]
            shape = ok.shape[:-1] + ((2, 3) if persons else (3,))
            return np.broadcast_to(ok[..., None] if persons else ok, shape).copy()
        shape = n_img.shape + ((2, 3) if persons else (3,))
        extra = (slice(None),) * n_img.ndim + ((None, None) if persons else (None,))
        return rng.binomial(np.broadcast_to(n_img[extra], shape), wr.usable_rate)

    def simulate(self, n: int, w: np.ndarray, sims: int, rng) -> Simulation:
        """Estimates on ``sims`` datasets and, from the first BOOT_DATASETS, the emulated
        pipeline bootstrap's standard error (scale) and, for ``biasig.eta_interval``, its
        centre (design_boot.eta_double on ETA_BOOT_DATASETS datasets, a line in the
        estimate plus residual noise), at up to BOOT_POINTS grid points."""
        wr = self.world
        w = np.asarray(w, dtype=float)
        at = set(
            np.unique(np.linspace(0, len(w) - 1, min(len(w), BOOT_POINTS)).round()).astype(int)
        )
        nb = min(BOOT_DATASETS, sims)
        out, shift, scale = {}, {}, {}
        if wr.imp.size:
            n_img = np.broadcast_to(self.n_phr_imp[None, :] * n, (sims, wr.imp.size)).copy()
            c_a = self._draw(self._usable(n_img, rng, persons=True), wr.dist_a, wr.used, rng)
            c_b0 = self._draw(self._usable(n_img, rng, persons=True), wr.dist_a, wr.used, rng)

            def f(c):
                return s_imp_model(c, wr.gt, wr.used, wr.k_i, self.k_imp)

            a = f(c_a)
            joint = self.count == "paper" and n * self.n_phr_imp.max() <= JOINT_MAX_IMAGES
            se_a, _, mean_a = boot_se(f, boot_counts(c_a[:nb], rng, joint), self.replicates)
            res = np.empty((len(w), sims))
            sc, sh = np.full(len(w), np.nan), np.full(len(w), np.nan)
            extra, sd_x = self._interaction(self.k_imp * wr.k_i.sum(), sims, rng)
            for i, c_b in thin_towards(c_b0, self._gt_norm(), SEGMENT, w, rng):
                b = f(c_b)
                res[i] = b - a + extra
                if i in at:
                    se_b, _, mean_b = boot_se(f, boot_counts(c_b[:nb], rng, joint), self.replicates)
                    sc[i] = np.mean(np.hypot(se_a, se_b))
                    sh[i] = _bc_shift(a[:nb], mean_a, b[:nb], mean_b)
            out["biasig.s_imp_diff"] = res
            scale["biasig.s_imp_diff"] = np.hypot(_fill(w, sc), sd_x)
            shift["biasig.s_imp_diff"] = _fill(w, sh)
        if wr.exp.size:
            n_img = np.broadcast_to(self.n_phr_exp[None, :] * n, (sims, wr.exp.size)).copy()
            res = []
            for _ in range(2):
                usable = self._usable(n_img, rng, persons=True)[..., 0]
                usable = np.where(wr.exp_used, usable, 0)
                res.append((rng.binomial(usable, wr.acc_a), usable))
            (h_a, u_a), (h_b0, u_b) = res

            def g(h, u):
                return s_exp_model(h, u, wr.exp_used, self.k_exp)

            def boot_hits(h, u):
                share = np.where(u > 0, h / np.maximum(u, 1), 0.0)
                return rng.binomial(
                    u[:, None], share[:, None], size=(h.shape[0], BOOT_REPLICATES) + h.shape[1:]
                )

            a = g(h_a, u_a)
            se_a, _, mean_a = boot_se(
                lambda x: g(x, u_a[:nb, None]), boot_hits(h_a[:nb], u_a[:nb]), self.replicates
            )
            res = np.empty((len(w), sims))
            sc, sh = np.full(len(w), np.nan), np.full(len(w), np.nan)
            extra, sd_x = self._interaction(self.k_exp, sims, rng)
            for i, h_b in thin_binary(h_b0, u_b, 1.0, w, rng):
                b = g(h_b, u_b)
                res[i] = b - a + extra
                if i in at:
                    hb = boot_hits(h_b[:nb], u_b[:nb])
                    se_b, _, mean_b = boot_se(lambda x: g(x, u_b[:nb, None]), hb, self.replicates)
                    sc[i] = np.mean(np.hypot(se_a, se_b))
                    sh[i] = _bc_shift(a[:nb], mean_a, b[:nb], mean_b)
            out["biasig.s_exp_diff"] = res
            scale["biasig.s_exp_diff"] = np.hypot(_fill(w, sc), sd_x)
            shift["biasig.s_exp_diff"] = _fill(w, sh)
        if len(wr.pairs):
            side_n = self._side_images()
            gt, target = self._side_targets()
            usable = self._usable(np.broadcast_to(side_n * n, (sims, side_n.size)).copy(), rng)
            counts = np.concatenate(
                [
                    multinomial(usable[..., i], gt[None, :, SLICES[a]], rng)
                    for i, a in enumerate(ATTRIBUTES)
                ],
                axis=-1,
            )  # (S, sides, 9)

            def e(c):
                return eta_model(c, wr) - 0.5

            res = np.empty((len(w), sims))
            sc = np.full(len(w), np.nan)
            fit = np.full((3, len(w)), np.nan)  # intercept, slope, residual sd
            per = BOOT_REPLICATES * ETA_INNER * len(wr.sides) * len(VALUES)
            ne = min(sims, ETA_BOOT_DATASETS, max(8, ETA_BOOT_DRAWS // per))
            for i, moved in thin_towards(counts, target, SEGMENT, w, rng):
                res[i] = e(moved)
                if i in at:
                    joint = self.count == "paper" and n * side_n.max() <= JOINT_MAX_IMAGES
                    boot = boot_counts(moved[:ne, :, None], rng, joint)[:, :, :, 0]
                    se, centre = eta_double(e, res[i, :ne], boot, rng, ETA_INNER)
                    sc[i] = np.nanmean(se)
                    fit[:, i] = _centre_fit(res[i, :ne], centre)
            out["biasig.eta"] = res
            # the interval's centre per dataset: the estimate plus the double bootstrap's
            # correction, which varies from dataset to dataset (and with the estimate):
            # a line fitted on the emulated datasets plus its residual noise
            a, b, sd = (_fill(w, f) for f in fit)
            noise = rng.standard_normal(res.shape)
            out["biasig.eta_interval"] = res + a[:, None] + b[:, None] * res + sd[:, None] * noise
            scale["biasig.eta_interval"] = _fill(w, sc)
        return Simulation(out, shift, scale)

    def _interaction(self, k: np.ndarray, sims: int, rng) -> tuple[np.ndarray, float]:
        """(sims,) the subject x model interaction's share of a model-level difference in a
        new draw of subjects: sum_u c_u delta_u, delta_u ~ N(0, interaction_sd) (one draw
        per dataset), c = ``k`` normalised; and its sd."""
        c = k / k.sum()
        sd = self.interaction_sd * float(np.sqrt((c**2).sum()))
        if self.interaction_sd <= 0:
            return np.zeros(sims), 0.0
        return rng.normal(0.0, self.interaction_sd, (sims, c.size)) @ c, sd

    def _side_images(self) -> np.ndarray:
        """(sides,) phrasings of each side (images per prompt multiply them)."""
        wr = self.world
        out = np.zeros(len(wr.sides))
        for s in (0, 1):
            idx = wr.side_of[:, s]
            ok = idx >= 0
            np.add.at(out, idx[ok], self.n_phr_imp[ok])
        return out.astype(np.int64)

    def _draw(self, usable: np.ndarray, dist: np.ndarray, used: np.ndarray, rng) -> np.ndarray:
        """Counts (S, U, 2, 9) of usable answers drawn from ``dist`` (U, 2, 9)."""
        usable = np.where(used[None, :, :, None], usable, 0)
        parts = [
            multinomial(usable[..., i], dist[None, ..., SLICES[a]], rng)
            for i, a in enumerate(ATTRIBUTES)
        ]
        return np.concatenate(parts, axis=-1)


def _centre_fit(est: np.ndarray, centre: np.ndarray) -> tuple[float, float, float]:
    """(a, b, sd): centre - est = a + b x est + noise of sd, least squares over the finite
    datasets (b = 0 where the estimates do not vary)."""
    ok = np.isfinite(est) & np.isfinite(centre)
    x, d = est[ok], centre[ok] - est[ok]
    if x.size < 3:
        return np.nan, np.nan, np.nan
    b = float(np.cov(x, d)[0, 1] / np.var(x, ddof=1)) if np.var(x) > 0 else 0.0
    a = float(d.mean() - b * x.mean())
    return a, b, float(np.std(d - a - b * x, ddof=2))


def _bc_shift(est_a, mean_a, est_b, mean_b) -> float:
    """What the pipeline's bias correction (score_bc = 2 x score - the replicates' mean)
    adds to a difference b - a: -(bias_b - bias_a), bias = mean - estimate, averaged over the
    emulated datasets."""
    return float(-np.nanmean((mean_b - est_b) - (mean_a - est_a)))


def _fill(w: np.ndarray, v: np.ndarray) -> np.ndarray:
    ok = np.isfinite(v)
    return np.interp(w, w[ok], v[ok]) if ok.any() else np.full(len(w), np.nan)


def normalise(v: np.ndarray) -> np.ndarray:
    return np.nan_to_num(attribute_shares(v))
