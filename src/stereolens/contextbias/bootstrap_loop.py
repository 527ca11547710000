"""The role-level cluster bootstrap of :mod:`stereolens.contextbias.bootstrap` one replicate
at a time: the reference implementation for its test and benchmark (same draws, same
result)."""

from __future__ import annotations

import numpy as np
import polars as pl

from stereolens.contextbias.bootstrap import (
    _BootstrapData,
    _level_replicates,
    _replicate_bi,
    _role_draws,
    bootstrap_frame,
)


def _bootstrap_loop(data: _BootstrapData, replicates: int, seed: int) -> pl.DataFrame:
    draws = _role_draws(data.n_roles, replicates, seed)
    estimate, boot = [], []
    for g in data.groups:
        estimate.append(_replicate_bi(g, g.counts.sum(0, keepdims=True), data))
        per = []
        for b in range(replicates):
            pooled = g.counts[draws[b]].sum(0, keepdims=True)
            per.append(_replicate_bi(g, pooled, data))
        boot.append(np.concatenate(per))
    lv = _level_replicates(data, np.stack(estimate), np.stack(boot), replicates, seed)
    return bootstrap_frame(lv)
