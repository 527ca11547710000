"""The reader correction for metrics that are not smooth in the label shares (BiasIG's eta):
the iterated (double) bootstrap over both samples, within strata at both levels, and its
bias-corrected estimate and interval (docs/statistics.md, "BiasIG's eta")."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stereolens.metrics.cluster_bootstrap import resample_rows, resample_stratum
from stereolens.metrics.joint_bootstrap import bootstrap_joint
from stereolens.metrics.reader_correction import (
    MIN_HUMAN_RELIABLE,
    Cell,
    ShareFunctional,
    _check_options,
    _normal_interval,
    _strata,
    apply_off_simplex,
    cell_shares,
    tuned_lambda,
)

INNER_REPLICATES = 20
"""Second-level replicates per replicate of :func:`corrected_metric_double` (as
stereolens.biasig.pairs.INNER_REPLICATES)."""
CENTRES = ("double", "once")
"""The centre of :func:`double_bias_corrected`'s interval: ``double`` 3 x point - 3 x mean
theta* + mean theta** (BiasIG's eta), ``once`` 2 x point - mean theta* (an LVLM term score
over more than two groups)."""
INTERVAL_NAMES = {"double": "double_bc", "once": "bc_double_se"}
"""corrected_metric_double's ``interval`` key per centre."""
DOUBLE_CHUNK = 20_000
"""Rows of second-level replicates a functional is given at once (memory, not results)."""


def _row_codes(indicators: np.ndarray) -> np.ndarray:
    """One integer per row of a 0/1 indicator matrix (its bits): equal rows, equal codes."""
    return (indicators > 0).astype(np.int64) @ (2 ** np.arange(indicators.shape[1], dtype=np.int64))


def double_bootstrap_shares(
    cell: Cell,
    replicates: int,
    inner: int,
    rng: np.random.Generator,
    lam: str = "ppi",
    fixed_strata: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(naive (R, K), corrected (R, K), naive (R, inner, K), corrected (R, inner, K)): the
    share replicates of a two-level bootstrap, each level as bootstrap_shares' (the second
    drawn from each first-level resample), lam held at its point value per stratum."""
    k = len(cell.labels)
    shape = (replicates, inner)
    naive, corr = np.zeros((replicates, k)), np.zeros((replicates, k))
    naive_in, corr_in = np.zeros((*shape, k)), np.zeros((*shape, k))
    sizes = np.bincount(cell.stratum, minlength=len(cell.strata)).astype(float)
    big_n = int(sizes.sum())
    weights = np.broadcast_to(sizes / big_n, (replicates, sizes.size))
    weights_in = np.broadcast_to(sizes / big_n, (*shape, sizes.size))
    if not fixed_strata:
        drawn = rng.multinomial(big_n, sizes / big_n, size=replicates)
        weights = drawn / big_n
        weights_in = resample_rows(drawn, rng, inner) / big_n
    labelled_rows = np.zeros(cell.stratum.size, dtype=bool)
    labelled_rows[cell.labelled] = True
    for h, (_, rows, lab) in enumerate(_strata(cell)):
        y, yhat = cell.human[lab], cell.reader[cell.labelled[lab]]
        w = cell.weight[lab]
        lam_h = tuned_lambda(y, yhat, cell.reader[rows], w) if lam == "tuned" else 1.0
        if cell.cluster is not None:  # whole clusters at both levels: cluster_bootstrap
            at = np.searchsorted(rows, cell.labelled[lab])
            args = (cell.cluster[rows], cell.reader[rows], at, y, w, lam_h, replicates, rng)
            m_all, rect, m_all_in, rect_in = resample_stratum(*args, inner=inner)
            for mean_all, r, nv, cv, wt in (
                (m_all, rect, naive, corr, weights[:, h, None]),
                (m_all_in, rect_in, naive_in, corr_in, weights_in[..., h, None]),
            ):
                nv += wt * mean_all
                cv += wt * (lam_h * mean_all + r)
            continue
        total, total_in = np.zeros((replicates, k)), np.zeros((*shape, k))
        unl = cell.reader[rows[~labelled_rows[rows]]]
        if unl.shape[0]:
            _, first, counts = np.unique(_row_codes(unl), return_index=True, return_counts=True)
            patterns = unl[first]
            outer = rng.multinomial(unl.shape[0], counts / counts.sum(), size=replicates)
            total += outer @ patterns
            total_in += resample_rows(outer, rng, inner) @ patterns
        _, w_code = np.unique(w, return_inverse=True)
        code = (_row_codes(y) * 2**k + _row_codes(yhat)) * (w_code.max() + 1) + w_code.ravel()
        _, first, mult = np.unique(code, return_index=True, return_counts=True)
        y_s, yhat_s, w_s = y[first], yhat[first], w[first]
        pick = rng.multinomial(lab.size, mult / mult.sum(), size=replicates)
        pick_in = resample_rows(pick, rng, inner)
        for p, tot, nv, cv, wt in (
            (pick, total, naive, corr, weights[:, h, None]),
            (pick_in, total_in, naive_in, corr_in, weights_in[..., h, None]),
        ):
            mean_all = (tot + p @ yhat_s) / rows.size
            rect = ((p * w_s) @ (y_s - lam_h * yhat_s)) / (p @ w_s)[..., None]
            nv += wt * mean_all
            cv += wt * (lam_h * mean_all + rect)
    return naive, corr, naive_in, corr_in


def double_bias_corrected(
    point: float,
    outer: np.ndarray,
    inner: np.ndarray,
    ci: float,
    bounds: tuple[float, float] | None = None,
    centre: str = "double",
) -> tuple[float, float, float]:
    """(estimate, low, high) of the iterated (double) bootstrap bias correction, as
    stereolens.biasig.groups.double_bias_corrected: ``outer`` (R,) theta*_r, ``inner``
    (R, J) theta**_rj. Estimate per ``centre`` (CENTRES); se the sd of 2 theta*_r - mean_j
    theta**_rj less the inner means' noise where that stays positive; estimate +- z se,
    clipped to ``bounds``. (point, NaN, NaN) with fewer than 2 finite replicates."""
    if centre not in CENTRES:
        raise ValueError(f"centre {centre!r}; allowed: {', '.join(CENTRES)}")
    finite = np.isfinite(inner)
    n_in = finite.sum(1)
    inner_mean = np.where(
        n_in > 0, np.where(finite, inner, 0.0).sum(1) / np.maximum(n_in, 1), np.nan
    )
    dev = np.where(finite, inner - inner_mean[:, None], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        inner_var = np.where(n_in > 1, (dev * dev).sum(1) / (n_in - 1), np.nan)
    once = 2.0 * outer - inner_mean
    once = once[np.isfinite(once)]
    if not np.isfinite(point) or once.size < 2:
        return point, np.nan, np.nan
    mean_outer = np.nanmean(outer[np.isfinite(outer)])
    if centre == "once":
        est = 2.0 * point - mean_outer
    else:
        est = 3.0 * point - 3.0 * mean_outer + np.nanmean(inner_mean)
    var = once.var(ddof=1)
    noise = np.nanmean(inner_var) / inner.shape[1] if np.isfinite(inner_var).any() else 0.0
    se = np.sqrt(var - noise if var - noise > 0 else var)
    return _normal_interval(est, se, ci, bounds)


def corrected_metric_double(
    cells: Sequence[Cell],
    functional: ShareFunctional,
    *,
    replicates: int = 1000,
    inner: int = INNER_REPLICATES,
    seed: int = 0,
    lam: str = "ppi",
    off_simplex: str = "clip",
    ci: float = 0.95,
    interval: str = "bc_normal",
    bounds: tuple[float, float] | None = None,
    fixed_strata: bool = False,
    centre: str = "double",
    joint: Sequence[Sequence[int]] | None = None,
) -> dict[str, float | int | str]:
    """corrected_metric, with the same keys, for a metric that is not smooth in the shares
    (BiasIG's eta): naive and corrected each by :func:`double_bias_corrected` of
    :func:`double_bootstrap_shares`; ``interval`` is unused (INTERVAL_NAMES by ``centre``);
    ``joint`` as corrected_metrics'."""
    _check_options(lam, off_simplex, interval)
    rng = np.random.default_rng(seed)
    points = [cell_shares(c, lam, off_simplex, ci, fixed_strata) for c in cells]
    if joint is None:
        boots = [
            double_bootstrap_shares(c, replicates, inner, rng, lam, fixed_strata) for c in cells
        ]
    else:
        lams = [p["lam"] for p in points]
        boots = bootstrap_joint(cells, joint, replicates, rng, lams, fixed_strata, inner)
    naive_pt = float(functional([p["naive"][None] for p in points])[0])
    corr_pt = float(functional([p["corrected"][None] for p in points])[0])

    def evaluate(which: int, clip: bool) -> np.ndarray:
        """The functional of every replicate of level ``which`` (0/1 naive, 2/3 inner)."""
        shares = [b[which] for b in boots]
        if clip:
            shares = [
                apply_off_simplex(s, off_simplex, c.single_label)
                for s, c in zip(shares, cells, strict=True)
            ]
        if which < 2:
            return functional(shares)
        step = max(1, DOUBLE_CHUNK // inner)
        out = np.empty((replicates, inner))
        for r0 in range(0, replicates, step):
            part = [s[r0 : r0 + step].reshape(-1, s.shape[-1]) for s in shares]
            out[r0 : r0 + step] = functional(part).reshape(-1, inner)
        return out

    _, n_lo, n_hi = double_bias_corrected(
        naive_pt, evaluate(0, False), evaluate(2, False), ci, bounds, centre
    )
    est, lo, hi = double_bias_corrected(
        corr_pt, evaluate(1, True), evaluate(3, True), ci, bounds, centre
    )
    return {
        "naive": naive_pt,
        "naive_low": n_lo,
        "naive_high": n_hi,
        "corrected": corr_pt,
        "estimate_bc": est,
        "ci_low": lo,
        "ci_high": hi,
        "interval": INTERVAL_NAMES[centre],
        "n_human": int(sum(c.labelled.size for c in cells)),
        "n_items": int(sum(c.stratum.size for c in cells)),
        "off_simplex": bool(any(p["off_simplex"].any() for p in points)),
        "interval_reliable": bool(all(c.labelled.size >= MIN_HUMAN_RELIABLE for c in cells)),
    }
