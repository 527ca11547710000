"""Shannon entropy and Bias Intensity (ContextBias paper, Eq. 1)."""

from __future__ import annotations

import numpy as np
from scipy.stats import entropy


def bias_intensity(counts, k: int | None = None) -> float:
    """BI = 1 - H(p) / log K (natural log; the base cancels).

    ``counts`` are label counts of one cell; p = counts / sum(counts). K defaults to the
    number of positive counts. Returns NaN when the cell is empty; 1.0 when K == 1 (one
    possible label: fully concentrated, and H = 0).
    """
    c = np.asarray(counts, dtype=float)
    c = c[c > 0]
    if c.size == 0:
        return float("nan")
    k = int(c.size if k is None else k)
    if k < c.size:
        raise ValueError(f"K={k} is smaller than the {c.size} labels observed in the cell")
    if k == 1:
        return 1.0
    return float(1.0 - entropy(c) / np.log(k))
