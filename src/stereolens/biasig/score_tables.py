"""BiasIG output tables: the implicit, explicit and eta tables built from the scorers' unit
and group scores and their intervals, with counts and status per row."""

from __future__ import annotations

import numpy as np
import polars as pl

from stereolens.biasig.formulas import ETA_COLUMNS, EXPLICIT_COLUMNS, IMPLICIT_COLUMNS
from stereolens.biasig.groups import (
    Explicit,
    Implicit,
    double_bias_corrected,
    membership,
)
from stereolens.biasig.pairs import Eta
from stereolens.biasig.truth import ATTRIBUTE_OF_VALUE, ATTRIBUTES, SLICES, VALUES

LEVEL_ORDER = {
    "prompt": 0,
    "subject": 0,
    "acquired_attribute": 1,
    "category": 2,
    "acquired_type": 3,
    "model": 4,
}


def _status(score: np.ndarray, n_missing: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(score), "missing", np.where(n_missing > 0, "partial", "ok"))


def _nullable(x: np.ndarray) -> pl.Series:
    return pl.Series(values=np.asarray(x, dtype=float)).fill_nan(None)


def _columns(
    score, lo, hi, weight, n_prompts, n_missing, n_images, n_usable, status, bc, ceiling=None
):
    extra = [_nullable(bc).alias("score_bc")]
    if ceiling is not None:
        extra.append(_nullable(ceiling).alias("ceiling"))
    return extra + [
        _nullable(score).alias("score"),
        _nullable(lo).alias("ci_low"),
        _nullable(hi).alias("ci_high"),
        pl.Series("weight", np.asarray(weight, float)),
        pl.Series("n_prompts", np.asarray(n_prompts).astype(np.int64)),
        pl.Series("n_missing", np.asarray(n_missing).astype(np.int64)),
        pl.Series("n_images", np.asarray(n_images).astype(np.int64)),
        pl.Series("n_usable", np.asarray(n_usable).astype(np.int64)),
        pl.Series("status", np.asarray(status), dtype=pl.String),
    ]


def _finish(frames: list[pl.DataFrame], columns: list[str]) -> pl.DataFrame:
    keys = [c for c in ("protected_attribute", "protected_value") if c in columns]
    order = pl.col("level").replace_strict(LEVEL_ORDER, return_dtype=pl.Int8)
    columns = [c for c in columns if c != "interval_note"]  # set by compute_metrics
    return pl.concat([f.select(columns) for f in frames], how="vertical_relaxed").sort(
        "variant",
        "model",
        order,
        "acquired_type",
        "category",
        "acquired_attribute",
        "subject",
        "prompt_id",
        *keys,
    )


def implicit_table(
    imp: Implicit,
    base,
    scores,
    complete,
    prompt_ci,
    group_score,
    group_ci,
    usable,
    n_img,
    level: str,
    ceiling: tuple[np.ndarray, np.ndarray],
    bc: tuple[np.ndarray, np.ndarray],
) -> pl.DataFrame:
    """The S_imp table; ``prompt_ci`` (2, units, 4) and ``group_ci`` ((groups, 4) x 2 or
    None) the intervals, ``bc`` the bias-corrected scores of the units and the groups."""
    idx = np.flatnonzero(imp.mask)
    m = membership(imp.member, imp.groups.height)
    in_mask = imp.mask.astype(float)
    frames = []
    for c, col in enumerate(Implicit.COLS):
        score = scores[idx, c]
        has = ~np.isnan(score)
        status = np.where(~has, "missing", np.where(complete[idx, c], "ok", "partial"))
        frames.append(
            base[idx].with_columns(
                pl.lit(level).alias("level"),
                pl.lit(col).alias("protected_attribute"),
                *_columns(
                    score,
                    prompt_ci[0, idx, c],
                    prompt_ci[1, idx, c],
                    imp.k_j[idx] * has,
                    has,
                    ~has,
                    n_img[idx],
                    usable[idx, c],
                    status,
                    bc[0][idx, c],
                    ceiling[0][idx, c],
                ),
            )
        )
        has_u = np.zeros(imp.mask.size)
        has_u[idx] = has
        n_prompts = m @ has_u
        n_missing = m @ in_mask - n_prompts
        lo, hi = (
            (group_ci[0][:, c], group_ci[1][:, c])
            if group_ci is not None
            else (np.full(imp.groups.height, np.nan),) * 2
        )
        frames.append(
            imp.groups.with_columns(
                pl.lit(col).alias("protected_attribute"),
                *_columns(
                    group_score[:, c],
                    lo,
                    hi,
                    m @ (imp.k_j * has_u),
                    n_prompts,
                    n_missing,
                    m @ (n_img * in_mask),
                    m @ (usable[:, c] * in_mask),
                    _status(group_score[:, c], n_missing),
                    bc[1][:, c],
                    ceiling[1][:, c],
                ),
            )
        )
    return _finish(frames, IMPLICIT_COLUMNS)


def explicit_table(
    exp: Explicit,
    base,
    units,
    acc,
    prompt_ci,
    group_score,
    group_ci,
    point,
    n_img,
    level: str,
    bc: tuple[np.ndarray, np.ndarray],
) -> pl.DataFrame:
    """The S_exp table; intervals and ``bc`` (units,) and (groups, 13) as in implicit_table."""
    idx = np.flatnonzero(exp.mask)
    attr_names = units["protected_attribute"].to_list()
    single = units["protected_value"].to_list()
    left = units["protected_value_left"].to_list()
    right = units["protected_value_right"].to_list()
    usable = np.zeros(units.height)
    for u in idx:
        usable[u] = point[u, :, SLICES[attr_names[u]]].sum()
    value = [
        single[u] if single[u] is not None else (left[u] if left[u] == right[u] else "*")
        for u in idx
    ]
    score = exp.prompt_scores(acc[:, None, :])[:, 0]
    n_avail = (~np.isnan(acc)).sum(1)
    has = ~np.isnan(score[idx])
    status = np.where(~has, "missing", np.where(n_avail[idx] == exp.persons[idx], "ok", "partial"))
    frames = [
        base[idx].with_columns(
            pl.lit(level).alias("level"),
            pl.Series("protected_attribute", [attr_names[u] for u in idx], dtype=pl.String),
            pl.Series("protected_value", value, dtype=pl.String),
            *_columns(
                score[idx],
                prompt_ci[0, idx],
                prompt_ci[1, idx],
                exp.k_j[idx] * has,
                has,
                ~has,
                n_img[idx],
                usable[idx],
                status,
                bc[0][idx],
            ),
        )
    ]

    m = membership(exp.member, exp.groups.height)
    has_u = ~np.isnan(score) & exp.mask
    labels = [(ATTRIBUTE_OF_VALUE[v], v) for v in VALUES]
    labels += [(a, "*") for a in ATTRIBUTES] + [("*", "*")]
    for c, (attr_label, value_label) in enumerate(labels):
        member = exp.belongs[:, c].astype(float)
        n_total = m @ member
        if not (n_total > 0).any():
            continue
        n_prompts = m @ (member * has_u)
        n_missing = n_total - n_prompts
        lo, hi = (
            (group_ci[0][:, c], group_ci[1][:, c])
            if group_ci is not None
            else (np.full(exp.groups.height, np.nan),) * 2
        )
        frames.append(
            exp.groups.with_columns(
                pl.lit(attr_label).alias("protected_attribute"),
                pl.lit(value_label).alias("protected_value"),
                *_columns(
                    group_score[:, c],
                    lo,
                    hi,
                    m @ (exp.k_j * member * has_u),
                    n_prompts,
                    n_missing,
                    m @ (n_img * member),
                    m @ (usable * member),
                    _status(group_score[:, c], n_missing),
                    bc[1][:, c],
                ),
            ).filter(pl.Series(n_total > 0))
        )
    return _finish(frames, EXPLICIT_COLUMNS)


def eta_table(eta: Eta, truth, pooled, boot, variant, ci, inner=None, inner_n=0) -> pl.DataFrame:
    """The eta table from the point estimate's pooled counts, ``boot`` = (pair etas (runs,
    pairs, R, 4), model etas (runs, R, 4)) or None, and ``inner`` = :meth:`Eta.inner`'s
    moments of ``inner_n`` second-level replicates (:func:`double_bias_corrected`)."""
    pair_eta, model_eta, status, note, valid = eta.etas(pooled, truth, variant)
    n_runs, n_pairs = len(eta.runs), eta.pairs.height
    if boot is not None:
        boot_pair, boot_model = boot
        (pair_m, pair_v), (model_m, model_v) = inner
        pair_bc, pair_lo, pair_hi = double_bias_corrected(
            pair_eta[:, :, 0], boot_pair, pair_m, pair_v, inner_n, ci, axis=2
        )
        model_bc, model_lo, model_hi = double_bias_corrected(
            model_eta[:, 0], boot_model, model_m, model_v, inner_n, ci, axis=1
        )
    else:
        pair_lo = pair_hi = pair_bc = np.full((n_runs, n_pairs, 4), np.nan)
        model_lo = model_hi = model_bc = np.full((n_runs, 4), np.nan)
    pairs = eta.pairs.to_dicts()
    weights = eta.pairs["pair_weight"].to_numpy()
    rows = []
    for ri, (variant_name, model) in enumerate(eta.runs):
        for pi, pair in enumerate(pairs):
            rows.append(
                {
                    "variant": variant_name,
                    "model": model,
                    **pair,
                    **_eta_values(
                        pair_eta[ri, pi, 0], pair_lo[ri, pi], pair_hi[ri, pi], pair_bc[ri, pi]
                    ),
                    "n_pairs": 1,
                    "status": status[ri, pi],
                    "note": note[ri, pi] or None,
                    "eta_variant": variant,
                }
            )
        counted = valid[ri, :, 0, 0]
        not_ok = [pairs[pi]["pair"] for pi in range(n_pairs) if status[ri, pi] != "ok"]
        summary = (
            f"weighted mean of eta_total over {int(counted.sum())} of {n_pairs} pairs "
            f"(weight {weights[counted].sum():g} of {weights.sum():g})"
        )
        if not_ok:
            summary += f"; not ok: {', '.join(not_ok)}"
        rows.append(
            {
                "variant": variant_name,
                "model": model,
                "pair": "*",
                "advantaged": "*",
                "disadvantaged": "*",
                "acquired_type": "*",
                "advantaged_key": None,
                "advantaged_position": None,
                "disadvantaged_key": None,
                "disadvantaged_position": None,
                "pair_weight": float(weights[counted].sum()),
                **_eta_values(model_eta[ri, 0], model_lo[ri], model_hi[ri], model_bc[ri]),
                "n_pairs": int(counted.sum()),
                "status": "ok" if counted.any() else "missing",
                "note": summary,
                "eta_variant": variant,
            }
        )
    schema = {c: pl.String for c in ETA_COLUMNS}
    schema.update(
        {
            c: pl.Float64
            for c in ETA_COLUMNS
            if c.startswith(("eta_t", "eta_g", "eta_r", "eta_a", "ci_"))
        }
    )
    schema.update({"pair_weight": pl.Float64, "n_pairs": pl.Int64})
    return pl.DataFrame(rows, schema=schema).select(c for c in ETA_COLUMNS if c != "interval_note")


def _eta_values(point: np.ndarray, lo: np.ndarray, hi: np.ndarray, bc: np.ndarray) -> dict:
    def f(x):
        return None if np.isnan(x) else float(x)

    names = ("total", "gender", "race", "age")
    out = {f"eta_{n}": f(point[i]) for i, n in enumerate(names)}
    out["ci_low"], out["ci_high"] = f(lo[0]), f(hi[0])
    for i, n in enumerate(names[1:], start=1):
        out[f"ci_low_{n}"], out[f"ci_high_{n}"] = f(lo[i]), f(hi[i])
    out.update({f"eta_{n}_bc": f(bc[i]) for i, n in enumerate(names)})
    return out
