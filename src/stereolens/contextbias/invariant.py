"""The share of context-invariant (role, label) pairs per generator (the bias profile's
"context-invariant pairs %") and its role-clustered Wilson interval (docs/statistics.md,
"Context-invariant pairs")."""

from __future__ import annotations

import numpy as np
import polars as pl

from stereolens.contextbias.intervals import MIN_ROLES, withheld_note
from stereolens.contextbias.metrics import _group_keys


def interval_min_roles(config: dict) -> int:
    """contextbias.metrics.interval_min_roles of a validated ``config`` (the schema's
    default is :data:`MIN_ROLES`), refused below 2."""
    value = config["contextbias"]["metrics"]["interval_min_roles"]
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise ValueError(
            f"contextbias.metrics.interval_min_roles must be an integer >= 2, not {value!r}"
        )
    return value


def invariant_share(
    ccs: pl.DataFrame, level: float = 0.95, min_roles: int = MIN_ROLES
) -> pl.DataFrame:
    """Per (extractor,) model of ccs.parquet (columns [extractor], model, role, consistent;
    rows with a null ``consistent`` left out): k (pairs flagged consistent), n (pairs), roles,
    estimate = 100 k / n, design_effect (>= 1; null when withheld), ci_low, ci_high (percent,
    Wilson on k / deff, n / deff; null below ``min_roles`` roles) and interval_note (why the
    interval is withheld, else null)."""
    from stereolens.metrics.group_audit import design_effects, wilson

    missing = {"model", "role", "consistent"} - set(ccs.columns)
    if missing:
        raise ValueError(
            f"the ccs table lacks column(s) {sorted(missing)}; rerun the ContextBias metrics "
            "(contextbias.ccs.ccs_table writes them)"
        )
    keys = _group_keys(ccs)
    per_role = (
        ccs.filter(pl.col("consistent").is_not_null())
        .group_by(keys + ["role"])
        .agg(pl.col("consistent").sum().cast(pl.Float64).alias("k"), pl.len().alias("n"))
        .sort(keys + ["role"])
    )
    rows = []
    for key, part in per_role.group_by(keys, maintain_order=True):
        k_r = part["k"].to_numpy().astype(float)
        n_r = part["n"].to_numpy().astype(float)
        k, n, roles = float(k_r.sum()), float(n_r.sum()), part.height
        row = dict(zip(keys, key, strict=True))
        row.update(k=int(k), n=int(n), roles=roles, estimate=100.0 * k / n)
        if roles < min_roles:
            row.update(
                design_effect=None, ci_low=None, ci_high=None,
                interval_note=withheld_note(roles, min_roles),
            )  # fmt: skip
        else:
            deff = float(design_effects(k_r[:, None], n_r[:, None], clustered=True)[0])
            lo, hi = wilson(np.array([k / deff]), np.array([n / deff]), level)
            row.update(
                design_effect=deff,
                ci_low=100.0 * float(lo[0]),
                ci_high=100.0 * float(hi[0]),
                interval_note=None,
            )
        rows.append(row)
    schema = {k: pl.String for k in keys} | {
        "k": pl.Int64, "n": pl.Int64, "roles": pl.Int64, "estimate": pl.Float64,
        "design_effect": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64,
        "interval_note": pl.String,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema)
