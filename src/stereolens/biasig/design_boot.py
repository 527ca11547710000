"""The BiasIG planner's emulated pipeline bootstrap: images resampled within units, and the
standard error its interval implies at the run's number of replicates."""

from __future__ import annotations

import functools
import warnings

import numpy as np

from stereolens.biasig.truth import ATTRIBUTES, SLICES, VALUES
from stereolens.design.sampling import multinomial

BOOT_REPLICATES = 100
"""Replicates of the emulated bootstrap (its width rescaled to the run's, percentile_width)."""
JOINT_MAX_IMAGES = 60
"""Up to this many images per unit boot_counts resamples whole images (above: multinomial)."""


def boot_counts(counts: np.ndarray, rng, joint: bool = False) -> np.ndarray:
    """Counts (D, ..., 9) -> (D, B, ..., 9) resampled with replacement: ``joint`` (counts
    (D, U, persons, 9), count "paper") whole images laid out in random order, else each
    attribute a multinomial at its observed shares."""
    if joint:
        return _joint_counts(counts, rng)
    c = counts[:, None]
    parts = []
    for a in ATTRIBUTES:
        sl = c[..., SLICES[a]]
        n = sl.sum(-1)
        shape = (counts.shape[0], BOOT_REPLICATES) + counts.shape[1:-1]
        parts.append(
            multinomial(np.broadcast_to(n, shape), np.broadcast_to(sl, shape + sl.shape[-1:]), rng)
        )
    return np.concatenate(parts, axis=-1)


def _joint_counts(counts: np.ndarray, rng) -> np.ndarray:
    d_n, u_n, p_n, _ = counts.shape
    b_n = BOOT_REPLICATES
    out = np.zeros((d_n, b_n, u_n, p_n, len(VALUES)))
    images = counts[..., SLICES["gender"]].sum(-1).max(-1).astype(np.int64)  # (D, U)
    for u in range(u_n):
        n = images[:, u]
        top = int(n.max())
        if top == 0:
            continue
        codes = np.full((d_n, top, p_n, 3), -1, dtype=np.int64)
        for d in range(d_n):
            for s in range(p_n):
                for j, a in enumerate(ATTRIBUTES):
                    sl = SLICES[a]
                    vals = np.repeat(
                        np.arange(sl.start, sl.stop), counts[d, u, s, sl].astype(np.int64)
                    )
                    codes[d, : vals.size, s, j] = rng.permutation(vals)
        idx = (rng.random((d_n, b_n, top)) * n[:, None, None]).astype(np.int64)
        valid = np.arange(top)[None, None, :] < n[:, None, None]
        drawn = codes[np.arange(d_n)[:, None, None], idx]  # (D, B, top, persons, 3)
        ok = valid[..., None, None] & (drawn >= 0)
        dd, bb, _, ss, _ = np.nonzero(ok)
        vv = drawn[ok]
        np.add.at(out, (dd, bb, u, ss, vv), 1.0)
    return out


def boot_se(metric, boot: np.ndarray, replicates: int = BOOT_REPLICATES):
    """(se, centre, mean) per dataset of a percentile 95% interval over the replicates (axis
    1): se = half-width / 1.96, centre = the interval's midpoint, mean = the replicates'
    mean; the width rescaled by :func:`percentile_width` from BOOT_REPLICATES to the
    pipeline's ``replicates``."""
    v = metric(boot)  # (D, B)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanquantile(v, [0.025, 0.975], axis=1)
        mean = np.nanmean(v, axis=1)
    factor = percentile_width(replicates) / percentile_width(v.shape[1])
    return factor * (hi - lo) / (2 * 1.959963984540054), (hi + lo) / 2, mean


@functools.lru_cache(maxsize=16)
def percentile_width(replicates: int) -> float:
    """E[(q_0.975 - q_0.025) / (2 x 1.96)] of ``replicates`` standard normal draws (numpy's
    linear quantiles): 0.958 at 100, 0.977 at 200, 0.995 at 1,000 (seeded, 4,000 draws)."""
    rng = np.random.default_rng(20)
    x = rng.standard_normal((4000, max(2, int(replicates))))
    lo, hi = np.quantile(x, [0.025, 0.975], axis=1)
    return float(np.mean(hi - lo) / (2 * 1.959963984540054))


def eta_double(metric, point: np.ndarray, boot: np.ndarray, rng, inner: int = 20):
    """(se, centre) per dataset of the pipeline's eta interval (groups.double_bias_corrected):
    ``boot`` the emulated replicates' side counts (D, B, sides, 9), each resampled ``inner``
    times as Eta.inner does; ``point`` (D,) the estimates."""
    from stereolens.biasig.groups import double_bias_corrected
    from stereolens.biasig.pairs import _resample_shares

    outer = metric(boot)  # (D, B)
    m, v = np.empty(outer.shape), np.empty(outer.shape)
    step = max(1, 2_000_000 // max(1, boot[0].size * inner))  # datasets drawn at once
    for d0 in range(0, boot.shape[0], step):
        part = boot[d0 : d0 + step]
        drawn = np.moveaxis(_resample_shares(part, inner, rng), -2, 2).astype(float)
        second = metric(drawn)  # (d, B, inner)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            m[d0 : d0 + step] = np.nanmean(second, -1)
            v[d0 : d0 + step] = np.nanvar(second, -1, ddof=1)
    centre, lo, hi = double_bias_corrected(point, outer, m, v, inner, 0.95, axis=1)
    return (hi - lo) / (2 * 1.959963984540054), centre
