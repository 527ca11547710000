"""ContextBias prompt robustness (paper Table 3): leave-one-out chi-squared tests per (role,
label) tuple, as the released code computes them or over chosen prompt cells, and their
per-cohort summary."""

from __future__ import annotations

import numpy as np
import polars as pl
from scipy import stats

from stereolens.contextbias.metrics import (
    ALL,
    _group_keys,
    check_attributes,
    image_universe,
)

ROBUSTNESS_CELLS = {
    "released": ("condition",),
    "condition": ("condition",),
    "variant": ("condition", "variant"),
    "prompt": ("condition", "prompt_id"),
}
"""Cells of the leave-one-out robustness test. "released" is the authors' released
computation (paper Table 3, REFERENCE.md; the workflow's default); the others test every
cell of the role against the share among all other roles (see :func:`robustness_tests`)."""
RELEASED_TESTED = ("CA-R", "CA-U")
"""Cells the released robustness test runs over (df = 2 - 1)."""
ALL_COHORTS = ("released", "all")
"""Which tuples the summary's "All" row (cohort "*") pools: "released" (default) = the
People, Objects and Camera cohorts, as the authors' _table2_other, whose TABLE2_DIMS list
spells Scene 'Sence', so that Scene tuples never reach its All (paper Table 3 has no Scene
column); "all" = every cohort."""
RELEASED_ALL_FAMILIES = (
    r"people|person|gender|age|race|ethnic|body|hair|face|skin",
    r"object|item|tool|accessor|clothing|prop",
    r"camera|angle|view|shot|framing|composition",
)
"""The released dimension_to_family_table2 patterns (matched on the lower-cased cohort, in
this order) of the families in its All: People, Objects, Camera. A cohort matching none of
them (Scene) stays out of the released All."""


# ----------------------------------------------------------------------------- robustness
def robustness_tests(
    attributes: pl.DataFrame,
    images: pl.DataFrame | None = None,
    cells: str = "released",
    alpha: float = 0.05,
) -> pl.DataFrame:
    """Leave-one-out chi-squared prompt robustness, one row per tuple (paper Table 3).

    Tuples: every (extractor,) model x role x dimension x label with at least one image of
    that role carrying the label. For tuple (r, y): the share of y among all other roles,
    q = (images with y in other roles) / (images of other roles), both over all conditions;
    per cell of role r, expected = n_cell q and observed = images of the cell with y;
    chi2 = sum over cells with expected > 0 of (obs - exp)^2 / exp, df = those cells - 1,
    p from the chi-squared survival function; invariant when p > ``alpha``.
    Cells: ``cells`` = "condition" (CF, CA-R, CA-U), "variant" (condition x the
    ``variant`` column) or "prompt" (condition x prompt_id: every prompt variant). Images
    come from the images table (status ok) when given, else from the attributes table.
    Untested (tested False, chi2/df/p null): the label occurs in no other role (q = 0), or
    the role has images in fewer than two cells. cf_prevalence = 100 x (CF images with y) /
    (CF images of the role), null without CF images.

    ``cells`` = "released" (default): the authors' computation
    (:func:`_released_robustness_tests`), which paper Table 3 reports."""
    if cells not in ROBUSTNESS_CELLS:
        raise ValueError(f"cells {cells!r}; allowed: {', '.join(ROBUSTNESS_CELLS)}")
    check_attributes(attributes)
    if cells == "released":
        return _released_robustness_tests(attributes, images, alpha)
    gkeys = _group_keys(attributes)
    cell_cols = list(ROBUSTNESS_CELLS[cells])
    extra = [c for c in cell_cols if c != "condition"]
    lacking = [c for c in extra if c not in attributes.columns]
    if lacking:
        raise ValueError(
            f"robustness cells {cells!r} need column {lacking[0]!r} in the attributes table; "
            "use cells 'condition'"
        )
    tkeys = gkeys + ["role", "cohort", "dimension", "label"]
    uni = image_universe(attributes, images, extra=extra)
    n_cell = uni.group_by(gkeys + ["role"] + cell_cols).agg(pl.len().alias("n_cell"))
    n_role = n_cell.group_by(gkeys + ["role"]).agg(pl.col("n_cell").sum().alias("n_role"))
    n_all = n_role.group_by(gkeys).agg(pl.col("n_role").sum().alias("n_all"))
    obs = attributes.group_by(tkeys + cell_cols).agg(pl.len().alias("obs"))
    x_role = obs.group_by(tkeys).agg(pl.col("obs").sum().alias("x_role"))
    x_all = x_role.group_by(gkeys + ["dimension", "label"]).agg(
        pl.col("x_role").sum().alias("x_all")
    )
    tuples = (
        x_role.join(n_role, on=gkeys + ["role"], how="left")
        .join(n_all, on=gkeys, how="left")
        .join(x_all, on=gkeys + ["dimension", "label"], how="left")
        .with_columns(
            ((pl.col("x_all") - pl.col("x_role")) / (pl.col("n_all") - pl.col("n_role")))
            .fill_nan(None)
            .alias("q")
        )
    )
    long = (
        tuples.select(tkeys + ["q"])
        .join(n_cell, on=gkeys + ["role"], how="inner")
        .join(obs, on=tkeys + cell_cols, how="left")
        .with_columns(
            pl.col("obs").fill_null(0).cast(pl.Float64),
            (pl.col("n_cell") * pl.col("q")).alias("exp"),
        )
    )
    is_cf = pl.col("condition") == "CF"
    per = long.group_by(tkeys).agg(
        pl.when(pl.col("exp") > 0)
        .then((pl.col("obs") - pl.col("exp")) ** 2 / pl.col("exp"))
        .otherwise(0.0)
        .sum()
        .alias("chi2"),
        ((pl.col("exp") > 0).sum() - 1).cast(pl.Int64).alias("df"),
        pl.col("obs").filter(is_cf).sum().alias("_x_cf"),
        pl.col("n_cell").filter(is_cf).sum().alias("_n_cf"),
    )
    per = per.join(tuples.select(tkeys + ["x_role", "n_role", "q"]), on=tkeys, how="left")
    tested = (per["df"] >= 1).to_numpy() & (per["q"].fill_null(0) > 0).to_numpy()
    return _tested_rows(per, tkeys, tested, alpha, cells, untested_p=None)


def _tested_rows(per, tkeys, tested, alpha: float, cells: str, untested_p: float | None):
    """The test rows from the per-tuple chi2, df and CF counts: p of the ``tested`` tuples
    (``untested_p`` for the others; None: null, NaN p values made null too), chi2 and df
    null where not tested, invariant = p > alpha, cf_prevalence = 100 x_CF / n_CF."""
    chi2 = per["chi2"].to_numpy()
    df = per["df"].to_numpy()
    pval = np.full(per.height, np.nan if untested_p is None else untested_p)
    pval[tested] = stats.chi2.sf(chi2[tested], df[tested])
    p = pl.Series("p", pval)
    out = per.with_columns(
        pl.Series("tested", tested),
        p.fill_nan(None) if untested_p is None else p,
        pl.when(pl.col("_n_cf") > 0)
        .then(100.0 * pl.col("_x_cf") / pl.col("_n_cf"))
        .alias("cf_prevalence"),
    ).with_columns(
        pl.when(pl.col("tested")).then(pl.col("chi2")).alias("chi2"),
        pl.when(pl.col("tested")).then(pl.col("df")).alias("df"),
        (pl.col("p") > alpha).alias("invariant"),
        pl.lit(cells).alias("cells"),
    )
    return out.select(
        tkeys
        + ["x_role", "n_role", "q", "chi2", "df", "p", "tested", "invariant", "cf_prevalence"]
        + ["cells"]
    ).sort(tkeys)


def _released_robustness_tests(
    attributes: pl.DataFrame, images: pl.DataFrame | None, alpha: float
) -> pl.DataFrame:
    """Prompt robustness as the authors' released code computes it (paper Table 3;
    REFERENCE.md; bias_quantification_pipeline.py, compute_overall_prop_all_with_loo and
    build_table2_source).

    Tuples: every (extractor,) model x role x label of the model x dimension label grid,
    zero-filled (a label the role never shows is tested too), for every role with images.
    For a cell (role r, condition c) with n_rc images, x_rc of them carrying label y: the
    baseline share leaves out only that cell, q_rc = (X - x_rc) / (N - n_rc), X and N the
    model's images with y and all its images (every role, every condition); expected =
    n_rc q_rc. chi2 = sum over the CA-R and CA-U cells with expected > 0 of
    (x_rc - exp)^2 / exp, df = those cells - 1 (1 when both can be tested). A tuple that
    cannot be tested (df < 1) counts as invariant with p = 1 (tested False). q is null (it
    differs per cell); cf_prevalence = 100 x_CF / n_CF, 0 for a label the role never shows.
    """
    gkeys = _group_keys(attributes)
    tkeys = gkeys + ["role", "cohort", "dimension", "label"]
    uni = image_universe(attributes, images)
    n_cell = uni.group_by(gkeys + ["role", "condition"]).agg(pl.len().alias("n_cell"))
    n_all = n_cell.group_by(gkeys).agg(pl.col("n_cell").sum().alias("n_all"))
    obs = attributes.group_by(tkeys + ["condition"]).agg(pl.len().alias("obs"))
    x_all = obs.group_by(gkeys + ["cohort", "dimension", "label"]).agg(
        pl.col("obs").sum().alias("x_all")
    )
    roles = n_cell.select(gkeys + ["role"]).unique()
    grid = x_all.select(gkeys + ["cohort", "dimension", "label"]).join(roles, on=gkeys)
    long = (
        grid.join(n_cell, on=gkeys + ["role"], how="inner")
        .join(obs, on=tkeys + ["condition"], how="left")
        .join(x_all, on=gkeys + ["cohort", "dimension", "label"], how="left")
        .join(n_all, on=gkeys, how="left")
        .with_columns(pl.col("obs").fill_null(0).cast(pl.Float64))
        .with_columns(
            (
                pl.col("n_cell")
                * (pl.col("x_all") - pl.col("obs"))
                / (pl.col("n_all") - pl.col("n_cell"))
            )
            .fill_nan(None)
            .alias("exp")
        )
    )
    in_test = pl.col("condition").is_in(list(RELEASED_TESTED)) & (pl.col("exp") > 0)
    is_cf = pl.col("condition") == "CF"
    per = long.group_by(tkeys).agg(
        pl.when(in_test)
        .then((pl.col("obs") - pl.col("exp")) ** 2 / pl.col("exp"))
        .otherwise(0.0)
        .sum()
        .alias("chi2"),
        (in_test.sum() - 1).cast(pl.Int64).alias("df"),
        pl.col("obs").sum().cast(pl.Int64).alias("x_role"),
        pl.col("n_cell").sum().cast(pl.Int64).alias("n_role"),
        pl.col("obs").filter(is_cf).sum().alias("_x_cf"),
        pl.col("n_cell").filter(is_cf).sum().alias("_n_cf"),
    )
    tested = (per["df"] >= 1).to_numpy()
    per = per.with_columns(pl.lit(None, pl.Float64).alias("q"))
    return _tested_rows(per, tkeys, tested, alpha, "released", untested_p=1.0)


def in_released_all(cohort: pl.Expr) -> pl.Expr:
    """True for a cohort the released "All" pools (People, Objects, Camera by the released
    family patterns, case-insensitive; Scene and anything else False)."""
    return cohort.str.to_lowercase().str.contains("|".join(RELEASED_ALL_FAMILIES))


def robustness_summary(tests: pl.DataFrame, all_cohorts: str = "released") -> pl.DataFrame:
    """Table 3 from :func:`robustness_tests`: per (extractor,) model x cohort (and cohort "*"
    = all tuples of the model) pct_invariant (% of tested tuples with p > alpha), mean_p,
    cf_prevalence (mean over tested tuples, %), n_tuples (tested), n_untested; plus model "*"
    rows: the plain mean over models of pct_invariant, mean_p and cf_prevalence (the paper's
    "Average" row) with n_tuples and n_untested summed.

    Released cells (``cells`` "released"): as the authors' _table2_other, every tuple
    counts, an untested one as invariant with p = 1 (n_tuples = all tuples, n_untested =
    those among them); cf_prevalence is the mean over all tuples (zero-filled grid).
    Cohort "*" (the paper's "All") pools, under ``all_cohorts`` "released" (default), the
    tuples of People, Objects and Camera (:func:`in_released_all`; the released All, whose
    Scene entry is misspelled), under "all" those of every cohort. Column all_cohorts
    names the choice."""
    if all_cohorts not in ALL_COHORTS:
        raise ValueError(f"all_cohorts {all_cohorts!r}; allowed: {', '.join(ALL_COHORTS)}")
    ekeys = ["extractor"] if "extractor" in tests.columns else []
    gkeys = ekeys + ["model"]
    released = tests.height > 0 and tests["cells"][0] == "released"
    tested = pl.col("tested")
    counted = tested | released  # released: every tuple, an untested one with p = 1
    stats_ = [
        (100.0 * pl.col("invariant").filter(counted).cast(pl.Float64).mean()).alias(
            "pct_invariant"
        ),
        pl.col("p").filter(counted).mean().alias("mean_p"),
        pl.col("cf_prevalence").filter(counted).mean().alias("cf_prevalence"),
        counted.sum().cast(pl.Int64).alias("n_tuples"),
        (~tested).sum().cast(pl.Int64).alias("n_untested"),
    ]
    by_cohort = tests.group_by(gkeys + ["cohort"]).agg(stats_)
    pooled = tests.filter(in_released_all(pl.col("cohort"))) if all_cohorts == "released" else tests
    overall = pooled.group_by(gkeys).agg(stats_).with_columns(pl.lit(ALL).alias("cohort"))
    per_model = pl.concat([by_cohort, overall.select(by_cohort.columns)])
    average = (
        per_model.group_by(ekeys + ["cohort"])
        .agg(
            pl.col("pct_invariant", "mean_p", "cf_prevalence").mean(),
            pl.col("n_tuples", "n_untested").sum().cast(pl.Int64),
        )
        .with_columns(pl.lit(ALL).alias("model"))
    )
    cells = tests["cells"][0] if tests.height else None
    return (
        pl.concat([per_model, average.select(per_model.columns)])
        .with_columns(
            pl.lit(cells, pl.String).alias("cells"), pl.lit(all_cohorts).alias("all_cohorts")
        )
        .sort(gkeys + ["cohort"])
    )
