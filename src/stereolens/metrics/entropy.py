"""Shannon entropy and Bias Intensity (ContextBias paper, Eq. 1)."""

from __future__ import annotations

import numpy as np
from scipy.stats import entropy

SINGLE_LABEL_BI = (0.0, 1.0)
"""Allowed values of BI for a cell with one possible label (K == 1), where 1 - H / log K is
0/0: 0.0 (the authors' released code, and so the paper's published numbers; the default)
or 1.0 (the limit of a fully concentrated cell)."""


def bias_intensity(counts, k: int | None = None, single_label_bi: float = 0.0) -> float:
    """BI = 1 - H(p) / log K of one cell's label ``counts`` (K default: the positive counts);
    NaN for an empty cell, ``single_label_bi`` when K == 1."""
    c = np.asarray(counts, dtype=float)
    c = c[c > 0]
    if c.size == 0:
        return float("nan")
    k = int(c.size if k is None else k)
    if k < c.size:
        raise ValueError(f"K={k} is smaller than the {c.size} labels observed in the cell")
    if k == 1:
        return float(single_label_bi)
    return float(1.0 - entropy(c) / np.log(k))
