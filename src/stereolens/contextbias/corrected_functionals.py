"""The share functionals of ContextBias's corrected table (contextbias.corrected): CCS, its
mean over generators, pooled BI, Miller-Madow BI, the mean over roles and the benchmark's
summary rows, each vectorised over bootstrap replicates."""

from __future__ import annotations

import numpy as np

from stereolens.contextbias.metrics import bi_from_parts, nanmean
from stereolens.metrics import reader_correction as rc


def ccs_functional(j, sizes: np.ndarray):
    """CCS (paper Eq. 4, contextbias.ccs.ccs_table) of label ``j`` (an index: (B,); a
    sequence of indices: (B, len(j)), one column each) from the three conditions' share
    vectors, per replicate: Prev% = 100 sum_c n_c s_c / sum_c n_c (the images with the label
    over the role's images, Eq. 2), range = 100 (max_c s_c - min_c s_c) in pp (Eq. 3), CCS =
    Prev% / (1 + range). ``sizes``: n_c, the images of each condition (fixed: the design's
    prompts x seeds). Without the support rule (corrected_table applies it to the point
    values): a smooth function of the shares in every replicate."""
    weights = sizes / sizes.sum()

    def ccs(shares: list[np.ndarray]) -> np.ndarray:
        s = np.stack([np.atleast_2d(np.asarray(x, dtype=float))[:, j] for x in shares], -1)
        prevalence = 100.0 * (s * weights).sum(-1)
        spread = 100.0 * (s.max(-1) - s.min(-1))
        return prevalence / (1.0 + spread)

    return ccs


def ccs_mean_functional(j, sizes_of: list[np.ndarray], masks: np.ndarray):
    """Cross-generator CCS (paper Eq. 5, contextbias.ccs.ccs_mean) of labels ``j`` (L,):
    the shares come as three condition cells per generator, in the order of ``sizes_of``
    (each generator's n_c); column l, per replicate, the plain mean of the generators'
    ccs_functional where ``masks[l, m]`` (the generators whose CCS of the label is defined
    on the reading: ccs_mean averages those), NaN where none is."""
    per = [ccs_functional(j, sizes) for sizes in sizes_of]
    w = np.asarray(masks, dtype=float).T[None]  # (1, M, L)

    def mean(shares: list[np.ndarray]) -> np.ndarray:
        vals = np.stack([f(shares[3 * m : 3 * m + 3]) for m, f in enumerate(per)], 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (np.where(w > 0, vals, 0.0) * w).sum(1) / w.sum(1)

    return mean


def pooled_functional(sizes: np.ndarray, k: int, single_label_bi: float):
    """Pooled BI (contextbias.metrics.pooled_bi) of the role cells' share vectors: the label
    counts pooled over roles, sum_r n_r s_r (n_r the role's images: images with the label),
    then BI = 1 - H / log K of their normalised shares (reader_correction.bi_functional)."""
    bi = rc.bi_functional(k=k, single_label_bi=single_label_bi)

    def pooled(shares: list[np.ndarray]) -> np.ndarray:
        rows = zip(shares, sizes, strict=True)
        counts = sum(np.atleast_2d(np.asarray(x, dtype=float)) * n for x, n in rows)
        return bi([counts])

    return pooled


def summary_functional(
    pooled: list, spans: list, cohorts: list, overall: str, with_dims: bool = False
):
    """The benchmark's summary rows of pooled BI (contextbias.metrics._with_summary_rows)
    from the cells of one model x condition: column c per cohort, the mean of its
    dimensions' pooled BI (``pooled[d]`` of the cells ``spans[d]``, a slice), then the
    overall value: the mean of the cohort means (``overall`` "cohort") or of all the
    dimensions ("dimension"); NaN (an empty cell) left out of every mean, as the benchmark
    leaves out its null cells. ``with_dims``: the dimensions' pooled BI first."""

    def summary(shares: list[np.ndarray]) -> np.ndarray:
        vals = np.stack([f(shares[s]) for f, s in zip(pooled, spans, strict=True)], -1)
        means = np.stack([nanmean(vals[:, d], axis=1) for d in cohorts], -1)
        total = nanmean(means if overall == "cohort" else vals, axis=1)
        return np.concatenate([vals] * with_dims + [means, total[:, None]], -1)

    return summary


def miller_madow_functional(size: int, k: int, single_label_bi: float = 0.0):
    """Miller-Madow BI (contextbias.metrics.role_bi's "role_miller_madow": bi_from_parts
    with ``miller_madow``) of one cell's shares, per row: the label counts c = n s (n =
    ``size``, the cell's images), H_MM = H(c / N) + (m - 1) / (2N) with N = sum c and m the
    labels with c > 0; on the reader's shares the benchmark's number. Not clipped (it can
    fall below 0); NaN where a share is negative."""

    def mm(shares: list[np.ndarray]) -> np.ndarray:
        s = np.atleast_2d(np.asarray(shares[0], dtype=float))
        c = size * np.clip(s, 0.0, None)
        xlogx = (c * np.log(np.where(c > 0, c, 1.0))).sum(-1)
        kk = np.full(c.shape[0], float(k))
        out = bi_from_parts(
            c.sum(-1), xlogx, (c > 0).sum(-1), kk, miller_madow=True,
            single_label_bi=single_label_bi,
        )  # fmt: skip
        return np.where((s < 0).any(-1), np.nan, out)

    return mm


def role_mean_functional(per_role: list):
    """The mean over a dimension's role cells (one share array each, in order) of their
    functionals ``per_role``, NaN (an empty cell) left out: bi.parquet's role-averaged
    value of the dimension (contextbias.metrics.role_bi)."""

    def mean(shares: list[np.ndarray]) -> np.ndarray:
        vals = np.stack([f([s]) for f, s in zip(per_role, shares, strict=True)], -1)
        return nanmean(vals, axis=-1)  # no role: NaN

    return mean
