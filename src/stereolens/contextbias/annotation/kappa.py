"""Agreement statistics: Cohen's and Fleiss' kappa (statsmodels) and a vectorised
percentile bootstrap of Fleiss' kappa."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stereolens.contextbias.bootstrap import role_multiplicity


def _statsmodels():
    try:
        from statsmodels.stats import inter_rater
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the agreement report needs statsmodels: pip install 'statsmodels>=0.14,<1'"
        ) from exc
    return inter_rater


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> tuple[float, float | None]:
    """(observed agreement, Cohen's kappa) of two raters' labels on the same items.

    Kappa from statsmodels' cohens_kappa on the square contingency table; None where it is
    undefined (chance agreement 1, i.e. both raters used one and the same label)."""
    a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError("cohen_kappa needs two equally long, non-empty label sequences")
    cats, codes = np.unique(np.concatenate([a, b]).astype(str), return_inverse=True)
    ia, ib = codes[: a.size], codes[a.size :]
    table = np.zeros((cats.size, cats.size))
    np.add.at(table, (ia, ib), 1)
    agreement = float(np.trace(table) / a.size)
    expected = float(table.sum(1) @ table.sum(0)) / a.size**2
    if expected >= 1.0 - 1e-12:
        return agreement, None
    return agreement, float(_statsmodels().cohens_kappa(table, return_results=False))


def fleiss_table(labels: np.ndarray) -> np.ndarray:
    """Items x categories counts from an items x raters array of labels."""
    labels = np.asarray(labels, dtype=object).astype(str)
    _, codes = np.unique(labels, return_inverse=True)
    codes = codes.reshape(labels.shape)
    k = int(codes.max()) + 1
    counts = np.zeros((labels.shape[0], k))
    np.add.at(counts, (np.repeat(np.arange(labels.shape[0]), labels.shape[1]), codes.ravel()), 1)
    return counts


def fleiss_kappa(counts: np.ndarray) -> float | None:
    """Fleiss' kappa of an items x categories count table (equal raters per item), from
    statsmodels; None where undefined (one category only)."""
    counts = np.asarray(counts, dtype=float)
    p = counts.sum(0) / counts.sum()
    if float(p @ p) >= 1.0 - 1e-12:
        return None
    return float(_statsmodels().fleiss_kappa(counts, method="fleiss"))


def fleiss_kappa_weighted(counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Fleiss' kappa for many reweightings of the items at once.

    ``weights`` (replicates x items) says how often each item enters a replicate (a
    bootstrap draw); a row of ones gives the plain Fleiss' kappa. NaN where undefined.
    Same formula as statsmodels: P_i = (sum_j n_ij^2 - m) / (m (m - 1)), P = mean P_i,
    p_j = sum_i n_ij / (N m), P_e = sum_j p_j^2, kappa = (P - P_e) / (1 - P_e)."""
    counts = np.asarray(counts, dtype=float)
    weights = np.atleast_2d(np.asarray(weights, dtype=float))
    m = counts[0].sum()
    if m < 2 or not np.allclose(counts.sum(1), m):
        raise ValueError("Fleiss' kappa needs the same number (>= 2) of ratings per item")
    total = weights.sum(1)
    p_item = ((counts**2).sum(1) - m) / (m * (m - 1))
    p_bar = weights @ p_item / total
    p_cat = (weights @ counts) / (total * m)[:, None]
    p_e = (p_cat**2).sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = (p_bar - p_e) / (1.0 - p_e)
    return np.where(p_e >= 1.0 - 1e-12, np.nan, kappa)


def bootstrap_fleiss(
    counts: np.ndarray, replicates: int, rng: np.random.Generator, level: float = 0.95
) -> tuple[float | None, float | None, int]:
    """Percentile bootstrap CI of Fleiss' kappa over items: (low, high, valid replicates).
    All replicates at once: each is a row of item multiplicities."""
    n = counts.shape[0]
    if replicates < 1 or n == 0:
        return None, None, 0
    weights = role_multiplicity(rng.integers(0, n, size=(replicates, n)), n)
    kappas = fleiss_kappa_weighted(counts, weights)
    valid = kappas[np.isfinite(kappas)]
    if valid.size == 0:
        return None, None, 0
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(valid, [tail, 100 - tail])
    return float(low), float(high), int(valid.size)
