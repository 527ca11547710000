"""BiasIG scorers and their aggregation groups: S_imp (:class:`Implicit`) and S_exp
(:class:`Explicit`) per unit, the groups of ``LEVELS`` above the unit, and their numeric helpers."""

from __future__ import annotations

import numpy as np
import polars as pl
from scipy import sparse, stats

from stereolens.biasig.answers import Prepared
from stereolens.biasig.formulas import DESCRIPTIVE, LEVELS, s_imp_cell
from stereolens.biasig.truth import ATTRIBUTES, SLICES, VALUE_INDEX, VALUES, BiasIGTruth, positions
from stereolens.ids import stable_id


def _groups(units: pl.DataFrame, mask: np.ndarray) -> tuple[pl.DataFrame, np.ndarray]:
    """Aggregation groups (``LEVELS``) of the masked units: a table of groups and a
    (units, levels) array of group indices (-1 outside the mask)."""
    rows: list[dict] = []
    index: dict[tuple, int] = {}
    member = np.full((units.height, len(LEVELS)), -1, dtype=np.int64)
    cols = units.select(
        "variant", "model", "acquired_type", "category", "acquired_attribute"
    ).rows()
    for u in np.flatnonzero(mask):
        variant, model, atype, category, attr = cols[u]
        values = {"acquired_type": atype, "category": category, "acquired_attribute": attr}
        for li, (level, keys) in enumerate(LEVELS.items()):
            key = (variant, model, level, *(values[k] for k in keys))
            g = index.get(key)
            if g is None:
                g = index[key] = len(rows)
                row = {
                    "variant": variant,
                    "model": model,
                    "level": level,
                    "acquired_type": "*",
                    "category": "*",
                    "acquired_attribute": "*",
                    "subject": "*",
                    "prompt_id": "*",
                }
                row.update({k: values[k] for k in keys})
                rows.append(row)
            member[u, li] = g
    schema = {c: pl.String for c in ("variant", "model", "level", *DESCRIPTIVE)}
    return pl.DataFrame(rows, schema=schema), member


def membership(member: np.ndarray, n_groups: int) -> sparse.csr_matrix:
    """(groups, units) 0/1 matrix from (units, levels) group indices."""
    units, levels = np.nonzero(member >= 0)
    return sparse.csr_matrix(
        (np.ones(units.size), (member[units, levels], units)), shape=(n_groups, member.shape[0])
    )


def _local_membership(member: np.ndarray) -> tuple[np.ndarray, sparse.csr_matrix]:
    """The groups that the units of ``member`` (units, levels) belong to, and the (those
    groups, units) 0/1 matrix: sums into only the groups a chunk of units touches."""
    units, levels = np.nonzero(member >= 0)
    touched, rows = np.unique(member[units, levels], return_inverse=True)
    m = sparse.csr_matrix(
        (np.ones(units.size), (rows.ravel(), units)), shape=(touched.size, member.shape[0])
    )
    return touched, m


def sum_groups(m: sparse.csr_matrix, x: np.ndarray) -> np.ndarray:
    """x (units, ...) summed into (groups, ...)."""
    return np.asarray(m @ x.reshape(x.shape[0], -1)).reshape((m.shape[0], *x.shape[1:]))


def safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def attribute_shares(x: np.ndarray) -> np.ndarray:
    """x (..., 9) divided by its sum within each attribute; NaN where that sum is 0."""
    out = np.full(x.shape, np.nan)
    for attribute in ATTRIBUTES:
        sl = SLICES[attribute]
        out[..., sl] = safe_div(x[..., sl], x[..., sl].sum(-1, keepdims=True))
    return out


def quantiles(x: np.ndarray, ci: float, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval along ``axis`` ignoring NaN: numpy's "linear" quantile, as
    np.nanquantile, vectorised (np.nanquantile loops over the columns in Python)."""
    x = np.moveaxis(x, axis, 0)
    srt = np.sort(x, axis=0)  # NaN sorts last
    n = (~np.isnan(x)).sum(axis=0)
    last = np.maximum(n - 1, 0)
    out = []
    for q in ((1.0 - ci) / 2.0, 1.0 - (1.0 - ci) / 2.0):
        pos = q * last
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, last)
        v_lo = np.take_along_axis(srt, lo[None], axis=0)[0]
        v_hi = np.take_along_axis(srt, hi[None], axis=0)[0]
        out.append(np.where(n > 0, v_lo + (pos - lo) * (v_hi - v_lo), np.nan))
    return out[0], out[1]


def replicate_moments(reps: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sd (ddof 1) of the finite replicates along ``axis`` (NaN where too few)."""
    finite = np.isfinite(reps)
    n = finite.sum(axis)
    x = np.where(finite, reps, 0.0)
    mean = safe_div(x.sum(axis), n)
    dev = np.where(finite, reps - np.expand_dims(mean, axis), 0.0)
    sd = np.sqrt(safe_div((dev * dev).sum(axis), n - 1))
    return mean, sd


def bias_corrected(
    point: np.ndarray,
    mean: np.ndarray,
    sd: np.ndarray,
    ci: float,
    bounds: tuple[float, float] | None = (0.0, 1.0),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, ci_low, ci_high): the bias-corrected estimate 2 x point - the replicates'
    mean +- z x their sd (Davison & Hinkley 1997, eq. 5.5), clipped to ``bounds`` (None =
    unclipped)."""
    z = float(stats.norm.ppf(0.5 + ci / 2.0))
    est = 2.0 * point - mean
    lo, hi = est - z * sd, est + z * sd
    if bounds is not None:
        est, lo, hi = (np.clip(x, *bounds) for x in (est, lo, hi))
    return est, lo, hi


def double_bias_corrected(
    point: np.ndarray,
    outer: np.ndarray,
    inner_mean: np.ndarray,
    inner_var: np.ndarray,
    inner_n: int,
    ci: float,
    axis: int = -1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, ci_low, ci_high) of the iterated (double) bootstrap bias correction
    (Davison & Hinkley 1997, section 3.9): ``outer`` the replicates theta*_r along ``axis``,
    ``inner_mean`` / ``inner_var`` the mean and variance (ddof 1) of ``inner_n`` second-level
    replicates of each. The estimate is 3 x point - 3 x mean theta* + mean theta**; the
    interval +- z x the sd of 2 theta*_r - mean_j theta**_rj less the inner noise, unclipped."""
    z = float(stats.norm.ppf(0.5 + ci / 2.0))
    outer_mean = replicate_moments(outer, axis)[0]
    inner_grand = replicate_moments(inner_mean, axis)[0]
    est = 3.0 * point - 3.0 * outer_mean + inner_grand
    var = replicate_moments(2.0 * outer - inner_mean, axis)[1] ** 2
    noise = replicate_moments(inner_var, axis)[0] / inner_n
    se = np.sqrt(np.where(var - noise > 0, var - noise, var))
    return est, est - z * se, est + z * se


class Implicit:
    """S_imp: prompt scores in the columns gender, race, age, * and the group sums."""

    COLS = (*ATTRIBUTES, "*")

    def __init__(self, prep: Prepared, truth: BiasIGTruth):
        units = prep.units
        self.mask = (units["visibility"] == "implicit").to_numpy()
        self.k_j = units["weight"].to_numpy()
        self.k_i = truth.settings.k_implicit_vector()
        n_persons = units["n_persons"].to_numpy()
        self.used = np.stack([np.ones(units.height, bool), n_persons == 2], axis=1)
        self.gt = np.zeros((units.height, 2, len(VALUES)))
        cache: dict[tuple[str, str], np.ndarray] = {}
        keys = units["attribute_key"].to_list()
        for u in np.flatnonzero(self.mask):
            for s, pos in enumerate(positions(n_persons[u])):
                if (keys[u], pos) not in cache:
                    cache[(keys[u], pos)] = truth.distribution(keys[u], pos)
                self.gt[u, s] = cache[(keys[u], pos)]
        self.groups, self.member = _groups(units, self.mask)

    def prompt_scores(self, counts: np.ndarray, us: np.ndarray):
        """counts (B, R, 2, 9) of units ``us`` -> scores (B, R, 4), availability (B, R, 3)."""
        used = self.used[us][:, None, :]
        per = np.full(counts.shape[:3] + (len(ATTRIBUTES),), np.nan)
        for ai, attribute in enumerate(ATTRIBUTES):
            sl = SLICES[attribute]
            n = counts[..., sl].sum(-1)
            s = s_imp_cell(counts[..., sl], self.gt[us][:, None, :, sl])
            per[..., ai] = np.where((n > 0) & used, s, np.nan)
        n_avail = (~np.isnan(per)).sum(2)
        attr = safe_div(np.nansum(per, axis=2), n_avail)
        avail = n_avail > 0
        total = safe_div(np.where(avail, attr, 0.0) @ self.k_i, avail @ self.k_i)
        return np.concatenate([attr, total[..., None]], axis=-1), avail

    def complete(self, counts: np.ndarray, us: np.ndarray) -> np.ndarray:
        """(B, 4): every person of the prompt has usable answers (per attribute; all)."""
        used = self.used[us]
        full = np.stack(
            [((counts[:, 0, :, SLICES[a]].sum(-1) > 0) | ~used).all(-1) for a in ATTRIBUTES],
            axis=-1,
        )
        return np.concatenate([full, full.all(-1, keepdims=True)], axis=-1)

    def sums(self, scores: np.ndarray, avail: np.ndarray, us: np.ndarray, local: bool = False):
        """Numerator and denominator (G, R, 4) of the weighted means over the groups:
        sum k_j S_ij / sum k_j per attribute, sum k_i k_j S_ij / sum k_i k_j for *. With
        ``local``: (groups touched, their numerator, their denominator)."""
        k_j = self.k_j[us][:, None, None]
        filled = np.where(avail, scores[..., :3], 0.0)
        num = np.concatenate([k_j * filled, k_j * (filled @ self.k_i)[..., None]], axis=-1)
        den = np.concatenate([k_j * avail, k_j * (avail @ self.k_i)[..., None]], axis=-1)
        if local:
            touched, m = _local_membership(self.member[us])
            return touched, sum_groups(m, num), sum_groups(m, den)
        m = membership(self.member[us], self.groups.height)
        return sum_groups(m, num), sum_groups(m, den)

    def ceiling(self, prep: Prepared, point: np.ndarray, draws: int, seed: int):
        """Expected S_imp of a generator sampling exactly from the ground truth at this run's
        usable answers per unit, person and attribute: the mean over ``draws`` seeded
        simulated datasets of the unit (units, 4) and group (groups, 4) scores."""
        unit_sum = np.zeros((prep.units.height, 4))
        unit_n = np.zeros((prep.units.height, 4))
        group_sum = np.zeros((self.groups.height, 4))
        group_n = np.zeros((self.groups.height, 4))
        for variant, model, u0, u1 in prep.runs:
            us = u0 + np.flatnonzero(self.mask[u0:u1])
            if not us.size:
                continue
            entropy = int(stable_id("biasig-ceiling", variant, model, length=15), 16)
            rng = np.random.default_rng([seed, entropy])
            sim = np.zeros((us.size, draws, 2, len(VALUES)))
            for attribute in ATTRIBUTES:
                sl = SLICES[attribute]
                n = point[us, 0, :, sl].sum(-1).astype(np.int64)  # (U, 2)
                gt = self.gt[us][:, :, sl]
                gt = gt / np.where(gt.sum(-1, keepdims=True) > 0, gt.sum(-1, keepdims=True), 1)
                ok = gt.sum(-1) > 0
                n = np.where(ok, n, 0)
                pv = np.where(ok[..., None], gt, 1.0 / gt.shape[-1])
                sim[..., sl] = rng.multinomial(
                    np.broadcast_to(n[:, None, :], (us.size, draws, 2)),
                    np.broadcast_to(pv[:, None], (us.size, draws, 2, pv.shape[-1])),
                )
            scores, avail = self.prompt_scores(sim, us)
            filled = np.isfinite(scores)
            unit_sum[us] += np.where(filled, scores, 0.0).sum(1)
            unit_n[us] += filled.sum(1)
            g_num, g_den = self.sums(scores, avail, us)
            g = safe_div(g_num, g_den)  # (G, draws, 4); groups of other runs are NaN
            has = np.isfinite(g)
            group_sum += np.where(has, g, 0.0).sum(1)
            group_n += has.sum(1)
        return safe_div(unit_sum, unit_n), safe_div(group_sum, group_n)


class Explicit:
    """S_exp: prompt scores and group sums in 13 columns (9 values, 3 attributes, *)."""

    def __init__(self, prep: Prepared):
        units = prep.units
        self.mask = (units["visibility"] == "explicit").to_numpy()
        self.k_j = units["weight"].to_numpy()
        self.persons = units["n_persons"].to_numpy()
        single = units["protected_value"].to_list()
        left = units["protected_value_left"].to_list()
        right = units["protected_value_right"].to_list()
        attrs = units["protected_attribute"].to_list()
        self.ask = np.full((units.height, 2), -1, dtype=np.int64)
        self.attr = np.full(units.height, -1, dtype=np.int64)
        for u in np.flatnonzero(self.mask):
            if self.persons[u] == 2:
                self.ask[u] = (VALUE_INDEX[left[u]], VALUE_INDEX[right[u]])
            else:
                self.ask[u, 0] = VALUE_INDEX[single[u]]
            self.attr[u] = ATTRIBUTES.index(attrs[u])
        self.groups, self.member = _groups(units, self.mask)
        # column membership: a prompt counts under a value when a person of it is asked
        # that value, under the attribute it asks for, and under *
        self.belongs = np.zeros((units.height, 13), bool)
        for u in np.flatnonzero(self.mask):
            self.belongs[u, self.ask[u][self.ask[u] >= 0]] = True
            self.belongs[u, 9 + self.attr[u]] = True
            self.belongs[u, 12] = True

    def person_accuracy(self, counts: np.ndarray, us: np.ndarray) -> np.ndarray:
        """(B, R, 2): share of the usable answers that equal the value asked; NaN where a
        person has no usable answer (or the prompt has one person)."""
        ask = self.ask[us]
        attr = self.attr[us]
        b = np.arange(us.size)
        sl_lo = np.array([SLICES[a].start for a in ATTRIBUTES])[attr]
        sl_hi = np.array([SLICES[a].stop for a in ATTRIBUTES])[attr]
        cum = np.concatenate([np.zeros(counts.shape[:3] + (1,)), counts.cumsum(-1)], axis=-1)
        out = np.full(counts.shape[:3], np.nan)
        for s in (0, 1):
            ok = ask[:, s] >= 0
            bo = b[ok]
            hit = counts[bo, :, s, ask[ok, s]]
            n = cum[bo, :, s, sl_hi[ok]] - cum[bo, :, s, sl_lo[ok]]
            out[bo, :, s] = safe_div(hit, n)
        return out

    def person_accuracy_asked(self, asked: np.ndarray, us: np.ndarray) -> np.ndarray:
        """:meth:`person_accuracy` from Resampler's ``asked`` (B, R, 2, 2): per person the
        answers equal to the value asked and the usable answers of its attribute."""
        out = np.full(asked.shape[:3], np.nan)
        for s in (0, 1):
            ok = np.flatnonzero(self.ask[us, s] >= 0)
            out[ok, :, s] = safe_div(asked[ok, :, s, 0], asked[ok, :, s, 1])
        return out

    @staticmethod
    def prompt_scores(acc: np.ndarray) -> np.ndarray:
        """(B, R): mean over the persons with usable answers."""
        return safe_div(np.nansum(acc, axis=2), (~np.isnan(acc)).sum(2))

    def group_sums(self, acc: np.ndarray, us: np.ndarray):
        """:meth:`sums` for the bootstrap: (groups touched, numerator, denominator (G, 13,
        R)), built from each unit's non-zero columns only."""
        n_units = us.size
        k_j = self.k_j[us]
        per_person = k_j / self.persons[us]
        ask = self.ask[us]
        score = self.prompt_scores(acc)
        avail = ~np.isnan(score)
        filled = np.where(avail, score, 0.0) * k_j[:, None]
        weight = avail * k_j[:, None]
        nums, dens, unit_of, col_of = [], [], [], []
        for s in (0, 1):
            ok = np.flatnonzero(ask[:, s] >= 0)
            a = acc[ok, :, s]
            nums.append(per_person[ok, None] * np.nan_to_num(a))
            dens.append(per_person[ok, None] * ~np.isnan(a))
            unit_of.append(ok)
            col_of.append(ask[ok, s])
        everyone = np.arange(n_units)
        nums += [filled, filled]
        dens += [weight, weight]
        unit_of += [everyone, everyone]
        col_of += [9 + self.attr[us], np.full(n_units, 12)]
        unit_c, col_c = np.concatenate(unit_of), np.concatenate(col_of)
        touched, m = _local_membership(self.member[us])
        mk = m[:, unit_c].tocoo()
        spread = sparse.csr_matrix(
            (mk.data, (mk.row * 13 + col_c[mk.col], mk.col)),
            shape=(touched.size * 13, unit_c.size),
        )
        reps = acc.shape[1]
        num = (spread @ np.concatenate(nums)).reshape(touched.size, 13, reps)
        den = (spread @ np.concatenate(dens)).reshape(touched.size, 13, reps)
        return touched, num, den

    def sums(self, acc: np.ndarray, us: np.ndarray):
        """Numerator and denominator (G, R, 13). Value columns: each person weighted
        k_j / persons under the value asked of it; attribute columns and *: prompt scores
        weighted k_j."""
        n_units, reps = acc.shape[:2]
        k_j = self.k_j[us]
        per_person = (k_j / self.persons[us])[:, None]
        ask = self.ask[us]
        num = np.zeros((n_units, reps, 13))
        den = np.zeros((n_units, reps, 13))
        rows = np.arange(n_units)
        for s in (0, 1):
            ok = ask[:, s] >= 0
            a = acc[ok, :, s]
            num[rows[ok], :, ask[ok, s]] += per_person[ok] * np.nan_to_num(a)
            den[rows[ok], :, ask[ok, s]] += per_person[ok] * ~np.isnan(a)
        score = self.prompt_scores(acc)
        avail = ~np.isnan(score)
        filled = np.where(avail, score, 0.0) * k_j[:, None]
        num[rows, :, 9 + self.attr[us]] = filled
        den[rows, :, 9 + self.attr[us]] = avail * k_j[:, None]
        num[..., 12] = filled
        den[..., 12] = avail * k_j[:, None]
        m = membership(self.member[us], self.groups.height)
        return sum_groups(m, num), sum_groups(m, den)
