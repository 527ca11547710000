"""ContextBias per-label homogeneity across conditions (three-condition chi-squared with
Benjamini-Hochberg adjustment) and the Context Consistency Score (paper Eq. 2-5, Tables 2
and 11); Benjamini-Hochberg uses :func:`scipy.stats.false_discovery_control`."""

from __future__ import annotations

import numpy as np
import polars as pl
from scipy import stats

from stereolens.contextbias.metrics import (
    CONDITIONS,
    _group_keys,
    check_attributes,
    check_conditions,
    image_universe,
)

CONSISTENCY = ("released", "paper", "ccs")
"""When a label counts as context-invariant ("consistent"): "released" = at least min_count
occurrences in total, p > alpha (a skipped test has p = 1) and range <= max_range_pp, as the
authors' released tb3_pipeline.py computes it (MIN_TOTAL_LABEL_COUNT; presence in all three
conditions not required; default, the paper's Table 2 "Inv." comes from it); "paper" = p >
alpha and range <= max_range_pp, without the count requirement (paper Sec. 3.5 as written);
"ccs" = also only where CCS is defined (seen in all three conditions, at least min_count
times)."""
CONSISTENCY_RULES = {
    "released": "at least {n} occurrences, p > {a} and range <= {r} pp",
    "paper": "p > {a} and range <= {r} pp",
    "ccs": "p > {a}, range <= {r} pp and CCS defined (all three conditions, >= {n} times)",
}


def consistency_rule(
    consistency: str = "released", min_count: int = 5, alpha: float = 0.05, max_range_pp=5.0
) -> str:
    """The words for a ``consistency`` rule, for captions and logs ("at least 5 occurrences,
    p > 0.05 and range <= 5 pp")."""
    if consistency not in CONSISTENCY:
        raise ValueError(f"consistency {consistency!r}; allowed: {', '.join(CONSISTENCY)}")
    return CONSISTENCY_RULES[consistency].format(n=min_count, a=f"{alpha:g}", r=f"{max_range_pp:g}")


BH_FAMILIES = ("tested", "all")
"""Rows that form one Benjamini-Hochberg family within a model: "tested" = the rows whose
test ran (default); "all" = every row, skipped tests entering with p = 1."""
RANGE_TOLERANCE_PP = 1e-9
"""Ranges are differences of shares times 100; a range of exactly 5 pp may come out as
5.000000000000001 and must still pass range <= 5 pp."""


# ----------------------------------------------------------------------------- homogeneity
def homogeneity(
    x: np.ndarray, n: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-label chi-squared homogeneity across conditions, row-wise (REFERENCE.md).

    ``x`` (T x C): images with the label per condition; ``n`` (T x C): images per condition.
    Pooled share p = sum x / sum n over the conditions with data (n > 0);
    chi2 = sum_c (x_c - n_c p)^2 / (n_c p (1 - p)); df = conditions with data - 1.
    Skipped (chi2 0, df as computed, p-value 1) when df < 1 or p is 0 or 1. This is
    Pearson's test on the 2 x C table (present, absent) x condition without continuity
    correction. Returns (chi2, df, p_value, tested)."""
    x = np.asarray(x, dtype=float)
    n = np.asarray(n, dtype=float)
    has = n > 0
    df = has.sum(axis=1) - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        p = x.sum(axis=1) / n.sum(axis=1)
        expected = n * p[:, None]
        terms = (x - expected) ** 2 / (expected * (1.0 - p[:, None]))
    tested = (df >= 1) & (p > 0) & (p < 1)
    chi2 = np.where(tested, np.where(has, terms, 0.0).sum(axis=1), 0.0)
    pval = np.ones_like(chi2)
    pval[tested] = stats.chi2.sf(chi2[tested], df[tested])
    return chi2, df, pval, tested


def _bh_within(pval: np.ndarray, tested: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p within each group, over the rows where ``tested``; 1
    elsewhere."""
    out = np.ones_like(pval)
    for g in np.unique(groups):
        sel = np.flatnonzero((groups == g) & tested)
        if sel.size:
            out[sel] = stats.false_discovery_control(pval[sel], method="bh")
    return out


def ccs_table(
    attributes: pl.DataFrame,
    images: pl.DataFrame | None = None,
    min_count: int = 5,
    alpha: float = 0.05,
    max_range_pp: float = 5.0,
    *,
    consistency: str = "released",
    bh_family: str = "tested",
) -> pl.DataFrame:
    """One row per (extractor,) model x role x dimension x label seen for that role.

    Columns: [extractor], model, role, cohort, dimension, label; x_CF, x_CA-R, x_CA-U (images
    with the label), n_CF, n_CA-R, n_CA-U (images of the role: images table, status ok,
    when given, else distinct image_ids of the attributes table); prevalence_pct =
    100 sum x / sum n (Eq. 2); range_pp = 100 (max_c x_c/n_c - min_c x_c/n_c) over conditions
    with images (Eq. 3); chi2, df, p (:func:`homogeneity`); tested (False where the test was
    skipped); p_bh = Benjamini-Hochberg within the same (extractor,) model over the family
    ``bh_family`` ("tested": the tested rows, skipped rows get 1; "all": every row, skipped
    ones entering with p = 1); ccs = prevalence_pct / (1 + range_pp) (Eq. 4), defined
    (non-null) only when the label occurs in all three conditions and at least
    ``min_count`` times in total; consistent (paper Table 2's "Inv.") per ``consistency``:
    "released" (default) = at least ``min_count`` occurrences in total, p > alpha (a skipped
    test has p = 1) and range_pp <= max_range_pp, as the released tb3_pipeline.py; "paper" =
    without the count requirement; "ccs" = also ccs defined. The unadjusted p decides
    consistency, as in the paper's tables."""
    if consistency not in CONSISTENCY:
        raise ValueError(f"consistency {consistency!r}; allowed: {', '.join(CONSISTENCY)}")
    if bh_family not in BH_FAMILIES:
        raise ValueError(f"bh_family {bh_family!r}; allowed: {', '.join(BH_FAMILIES)}")
    check_attributes(attributes)
    check_conditions(attributes)
    gkeys = _group_keys(attributes)
    tkeys = gkeys + ["role", "cohort", "dimension", "label"]
    xcols = [f"x_{c}" for c in CONDITIONS]
    ncols = [f"n_{c}" for c in CONDITIONS]
    x = attributes.group_by(tkeys).agg(
        (pl.col("condition") == c).sum().cast(pl.Int64).alias(f"x_{c}") for c in CONDITIONS
    )
    n = (
        image_universe(attributes, images)
        .group_by(gkeys + ["role"])
        .agg((pl.col("condition") == c).sum().cast(pl.Int64).alias(f"n_{c}") for c in CONDITIONS)
    )
    t = x.join(n, on=gkeys + ["role"], how="left").with_columns(pl.col(ncols).fill_null(0))
    t = t.sort(tkeys)
    X = t.select(xcols).to_numpy().astype(float)
    N = t.select(ncols).to_numpy().astype(float)
    over = X > N
    if over.any():
        row = t.row(int(np.flatnonzero(over.any(axis=1))[0]), named=True)
        raise ValueError(
            f"more images carry a label than there are images ({row}); the images table "
            "does not match the attributes table (check status and the model/role columns)"
        )
    chi2, df, pval, tested = homogeneity(X, N)
    groups = t.select(pl.struct(gkeys).rank("dense")).to_series().to_numpy()
    family = tested if bh_family == "tested" else np.ones_like(tested)
    p_bh = _bh_within(pval, family, groups)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(N > 0, X / N, np.nan)
        prevalence = 100.0 * X.sum(1) / N.sum(1)
    has = N > 0
    hi = np.where(has, share, -np.inf).max(1)
    lo = np.where(has, share, np.inf).min(1)
    range_pp = np.where(has.any(1), 100.0 * (hi - lo), np.nan)
    defined = (X > 0).all(1) & (X.sum(1) >= min_count)
    ccs = np.where(defined, prevalence / (1.0 + range_pp), np.nan)
    consistent = (pval > alpha) & (range_pp <= max_range_pp + RANGE_TOLERANCE_PP)
    if consistency == "released":
        consistent &= X.sum(1) >= min_count
    elif consistency == "ccs":
        consistent &= defined
    out = t.with_columns(
        pl.Series("prevalence_pct", prevalence),
        pl.Series("range_pp", range_pp),
        pl.Series("chi2", chi2),
        pl.Series("df", df.astype(np.int64)),
        pl.Series("p", pval),
        pl.Series("tested", tested),
        pl.Series("p_bh", p_bh),
        pl.Series("ccs", ccs).fill_nan(None),
        pl.Series("consistent", consistent),
    )
    return out.select(
        tkeys
        + ["prevalence_pct", "range_pp", "chi2", "df", "p", "tested", "p_bh", "ccs"]
        + ["consistent"]
        + xcols
        + ncols
    )


def ccs_mean(ccs: pl.DataFrame) -> pl.DataFrame:
    """Cross-generator CCS (Eq. 5): per (extractor,) role x dimension x label, ccs_mean = the
    plain mean of the per-generator CCS where defined (n_ccs of them), range_pp_mean = the
    mean of the per-generator ranges over the models that have the label (the paper's
    Delta-bar), n_invariant = models where it is consistent, n_models = models in the table
    (the denominator of the paper's "Inv." column, e.g. 3/4)."""
    ekeys = ["extractor"] if "extractor" in ccs.columns else []
    keys = ekeys + ["role", "cohort", "dimension", "label"]
    out = ccs.group_by(keys).agg(
        pl.col("ccs").mean().alias("ccs_mean"),
        pl.col("range_pp").mean().alias("range_pp_mean"),
        pl.col("ccs").count().cast(pl.Int64).alias("n_ccs"),
        pl.col("consistent").sum().cast(pl.Int64).alias("n_invariant"),
    )
    n_models = pl.col("model").n_unique()
    if ekeys:
        per = ccs.group_by(ekeys).agg(n_models.alias("n_models"))
        out = out.join(per, on=ekeys, how="left")
    else:
        out = out.with_columns(pl.lit(ccs.select(n_models).item()).alias("n_models"))
    return out.with_columns(pl.col("n_models").cast(pl.Int64)).sort(keys)
