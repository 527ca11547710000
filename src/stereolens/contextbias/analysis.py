"""ContextBias label-level analyses and the cluster bootstrap (paper Sec. 3.5, 5.2, 5.3,
App. E.1; constants from REFERENCE.md):

- :func:`ccs_table` / :func:`ccs_mean`: per-label three-condition chi-squared homogeneity
  with Benjamini-Hochberg adjustment, and the Context Consistency Score (Eq. 2-5, Tables 2
  and 11);
- :func:`robustness_tests` / :func:`robustness_summary`: leave-one-out chi-squared prompt
  robustness (Table 3);
- :func:`cluster_bootstrap`: role-level cluster bootstrap of pooled-BI differences between
  conditions (Tables 8 and 9), all replicates at once.

Every function takes the long attributes table (see :mod:`stereolens.contextbias.metrics`)
and, where a denominator is needed, the images table; an ``extractor`` column splits every
result by extractor. Benjamini-Hochberg uses :func:`scipy.stats.false_discovery_control`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import sparse, stats
from scipy.special import xlogy

from stereolens.contextbias.metrics import (
    ALL,
    CONDITIONS,
    _dimension_k,
    _group_keys,
    bi_from_parts,
    check_attributes,
    check_bi_options,
    check_conditions,
    image_universe,
)
from stereolens.contextbias.schema import AttributeSchema
from stereolens.ids import stable_id

COMPARISONS = (
    ("CA-R - CF", "CA-R", "CF"),
    ("CA-U - CF", "CA-U", "CF"),
    ("CA-U - CA-R", "CA-U", "CA-R"),
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
RELEASED_ALL_EXCLUDES = ("scene",)
"""Cohorts left out of the released "All" column (Scene is absent from paper Table 3)."""
CONSISTENCY = ("paper", "ccs")
"""When a label counts as context-invariant ("consistent"): "paper" = p > alpha and range <=
max_range_pp (paper Sec. 3.5, whether or not CCS is defined; default); "ccs" = also only
where CCS is defined (seen in all three conditions, at least min_count times)."""
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
    consistency: str = "paper",
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
    ``min_count`` times in total; consistent = p > alpha and range_pp <= max_range_pp
    (paper Sec. 3.5: "Inv."; ``consistency`` "ccs" also requires ccs defined). The
    unadjusted p decides consistency, as in the paper's tables."""
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
    if consistency == "ccs":
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
    chi2 = per["chi2"].to_numpy()
    df = per["df"].to_numpy()
    pval = np.full(per.height, np.nan)
    pval[tested] = stats.chi2.sf(chi2[tested], df[tested])
    out = per.with_columns(
        pl.Series("tested", tested),
        pl.Series("p", pval).fill_nan(None),
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
    chi2 = per["chi2"].to_numpy()
    df = per["df"].to_numpy()
    pval = np.ones(per.height)
    pval[tested] = stats.chi2.sf(chi2[tested], df[tested])
    out = per.with_columns(
        pl.Series("tested", tested),
        pl.Series("p", pval),
        pl.lit(None, pl.Float64).alias("q"),
        pl.when(pl.col("_n_cf") > 0)
        .then(100.0 * pl.col("_x_cf") / pl.col("_n_cf"))
        .alias("cf_prevalence"),
    ).with_columns(
        pl.when(pl.col("tested")).then(pl.col("chi2")).alias("chi2"),
        pl.when(pl.col("tested")).then(pl.col("df")).alias("df"),
        (pl.col("p") > alpha).alias("invariant"),
        pl.lit("released").alias("cells"),
    )
    return out.select(
        tkeys
        + ["x_role", "n_role", "q", "chi2", "df", "p", "tested", "invariant", "cf_prevalence"]
        + ["cells"]
    ).sort(tkeys)


def robustness_summary(tests: pl.DataFrame) -> pl.DataFrame:
    """Table 3 from :func:`robustness_tests`: per (extractor,) model x cohort (and cohort "*"
    = all tuples of the model) pct_invariant (% of tested tuples with p > alpha), mean_p,
    cf_prevalence (mean over tested tuples, %), n_tuples (tested), n_untested; plus model "*"
    rows: the plain mean over models of pct_invariant, mean_p and cf_prevalence (the paper's
    "Average" row) with n_tuples and n_untested summed.

    Released cells (``cells`` "released"): as the authors' _table2_other, every tuple
    counts, an untested one as invariant with p = 1 (n_tuples = all tuples, n_untested =
    those among them); cf_prevalence is the mean over all tuples (zero-filled grid); cohort
    "*" (the paper's "All") pools the tuples of every cohort but Scene."""
    ekeys = ["extractor"] if "extractor" in tests.columns else []
    gkeys = ekeys + ["model"]
    released = tests.height > 0 and tests["cells"][0] == "released"
    tested = pl.col("tested")
    if released:
        stats_ = [
            (100.0 * pl.col("invariant").cast(pl.Float64).mean()).alias("pct_invariant"),
            pl.col("p").mean().alias("mean_p"),
            pl.col("cf_prevalence").mean().alias("cf_prevalence"),
            pl.len().cast(pl.Int64).alias("n_tuples"),
            (~tested).sum().cast(pl.Int64).alias("n_untested"),
        ]
    else:
        stats_ = [
            (100.0 * pl.col("invariant").filter(tested).cast(pl.Float64).mean()).alias(
                "pct_invariant"
            ),
            pl.col("p").filter(tested).mean().alias("mean_p"),
            pl.col("cf_prevalence").filter(tested).mean().alias("cf_prevalence"),
            tested.sum().cast(pl.Int64).alias("n_tuples"),
            (~tested).sum().cast(pl.Int64).alias("n_untested"),
        ]
    by_cohort = tests.group_by(gkeys + ["cohort"]).agg(stats_)
    pooled = (
        tests.filter(~pl.col("cohort").is_in(list(RELEASED_ALL_EXCLUDES))) if released else tests
    )
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
        .with_columns(pl.lit(cells, pl.String).alias("cells"))
        .sort(gkeys + ["cohort"])
    )


# ----------------------------------------------------------------------------- bootstrap
BOOTSTRAP_DRAWS = ("paired", "unpaired")
"""How roles are drawn in each bootstrap replicate: "paired" = one draw shared by every
model and condition (differences stay paired; default); "unpaired" = an independent draw
per model x condition, as the authors' released code does."""


@dataclass
class _Group:
    """Counts of one (extractor,) model, ready for resampling roles."""

    key: tuple
    counts: np.ndarray  # roles x columns; a column = (dimension, condition, label)
    col_cond: np.ndarray  # condition index (CONDITIONS order) of each column
    seg_start: np.ndarray  # first column of each (dimension, condition) segment
    seg_dim: np.ndarray  # global dimension index of each segment
    seg_cond: np.ndarray  # condition index (CONDITIONS order) of each segment
    seg_k: np.ndarray  # fixed K per segment (closed vocabulary), NaN = computed
    label_of_col: sparse.csr_matrix  # columns x (dimension, label) 0/1
    dim_start: np.ndarray  # first (dimension, label) column of each dimension of this group
    seg_dimpos: np.ndarray  # which of this group's dimensions each segment belongs to


@dataclass
class _BootstrapData:
    gkeys: list[str]
    groups: list[_Group]
    dims: list[tuple[str, str]]  # (cohort, dimension), global order
    n_roles: int
    k_definition: str
    overall: str = "cohort"
    single_label_bi: float = 0.0


def _bootstrap_data(
    attributes: pl.DataFrame,
    k_definition: str,
    schema: AttributeSchema | None,
    overall: str = "cohort",
    single_label_bi: float = 0.0,
) -> _BootstrapData:
    check_attributes(attributes)
    check_conditions(attributes)
    check_bi_options(k_definition, overall, single_label_bi)
    gkeys = _group_keys(attributes)
    roles = sorted(attributes["role"].unique().to_list())
    dims = sorted(attributes.select("cohort", "dimension").unique().iter_rows())
    if len({d for _, d in dims}) != len(dims):
        raise ValueError("a dimension appears under two cohorts in the attributes table")
    fixed: dict[str, int] = {}
    if k_definition == "vocabulary":
        _dimension_k(attributes, "vocabulary", schema)  # raises on labels outside the schema
        vocab = (schema or AttributeSchema.load()).vocabulary()
        fixed = {d: len(v) for d, v in vocab.items() if v}
    index = pl.DataFrame(
        {
            "dimension": [d for _, d in dims],
            "d": np.arange(len(dims), dtype=np.int64),
            "k_fixed": [float(fixed.get(d, np.nan)) for _, d in dims],
        }
    )
    conds = pl.DataFrame({"condition": list(CONDITIONS), "c": np.arange(3, dtype=np.int64)})
    role_ix = pl.DataFrame({"role": roles, "r": np.arange(len(roles), dtype=np.int64)})
    counts = (
        attributes.group_by(gkeys + ["dimension", "condition", "label", "role"])
        .agg(pl.len().alias("n"))
        .join(index, on="dimension")
        .join(conds, on="condition")
        .join(role_ix, on="role")
    )
    groups = []
    for key, sub in (
        counts.sort(gkeys).partition_by(gkeys, as_dict=True, maintain_order=True).items()
    ):
        sub = sub.sort("d", "c", "label", "r").with_columns(
            pl.struct("d", "c", "label").rle_id().alias("col"),
            pl.struct("d", "c").rle_id().alias("seg"),
        )
        n_cols = int(sub["col"][-1]) + 1
        mat = np.zeros((len(roles), n_cols))
        mat[sub["r"].to_numpy(), sub["col"].to_numpy()] = sub["n"].to_numpy()
        segs = sub.group_by("seg", maintain_order=True).agg(
            pl.col("col").first(),
            pl.col("d").first(),
            pl.col("c").first(),
            pl.col("k_fixed").first(),
        )
        cols = sub.select("col", "d", "c", "label").unique("col").sort("col")
        labels = (
            cols.select("d", "label")
            .unique()
            .sort("d", "label")
            .with_row_index("lab")
            .with_columns(pl.col("d").rle_id().alias("dpos"))
        )
        cols = cols.join(labels, on=["d", "label"], how="left").sort("col")
        label_of_col = sparse.csr_matrix(
            (np.ones(n_cols), (cols["col"].to_numpy(), cols["lab"].to_numpy())),
            shape=(n_cols, labels.height),
        )
        dstarts = labels.group_by("dpos", maintain_order=True).agg(
            pl.col("lab").first(), pl.col("d").first()
        )
        dpos_of_d = dict(zip(dstarts["d"].to_list(), dstarts["dpos"].to_list(), strict=True))
        seg_dim = segs["d"].to_numpy()
        groups.append(
            _Group(
                key=tuple(key),
                counts=mat,
                col_cond=cols["c"].to_numpy(),
                seg_start=segs["col"].to_numpy().astype(np.intp),
                seg_dim=seg_dim,
                seg_cond=segs["c"].to_numpy(),
                seg_k=segs["k_fixed"].to_numpy(),
                label_of_col=label_of_col,
                dim_start=dstarts["lab"].to_numpy().astype(np.intp),
                seg_dimpos=np.array([dpos_of_d[d] for d in seg_dim], dtype=np.intp),
            )
        )
    return _BootstrapData(
        gkeys, groups, dims, len(roles), k_definition, overall, float(single_label_bi)
    )


def role_multiplicity(draws: np.ndarray, n_roles: int) -> np.ndarray:
    """(B x R) how often each role is drawn in each replicate, from (B x R) draws."""
    b = draws.shape[0]
    flat = (np.arange(b)[:, None] * n_roles + draws).ravel()
    return np.bincount(flat, minlength=b * n_roles).reshape(b, n_roles).astype(float)


def _role_draws(n_roles: int, replicates: int, seed: int | list[int]) -> np.ndarray:
    if replicates < 1:
        raise ValueError(f"replicates must be at least 1, got {replicates}")
    return np.random.default_rng(seed).integers(0, n_roles, size=(replicates, n_roles))


def _unpaired_seed(seed: int, key: tuple, condition: str) -> list[int]:
    """The random stream of one (extractor,) model x condition under unpaired draws: adding
    a model or a condition leaves the others' draws as they were."""
    return [seed, int(stable_id("contextbias-bootstrap", *key, condition, length=15), 16)]


def _replicate_bi(g: _Group, pooled: np.ndarray, data: _BootstrapData) -> np.ndarray:
    """BI (rows x dimensions x conditions, NaN where empty) from pooled label counts
    (rows x columns) of resampled roles. K per k_definition, recomputed from the resample:
    'model' = labels with a positive pooled count in any condition, 'cell' = in the cell,
    'vocabulary' = the closed vocabulary size (open dimensions as 'model')."""
    total = np.add.reduceat(pooled, g.seg_start, axis=1)
    xlogx = np.add.reduceat(xlogy(pooled, pooled), g.seg_start, axis=1)
    m = np.add.reduceat((pooled > 0).astype(float), g.seg_start, axis=1)
    if data.k_definition == "cell":
        k = m
    else:
        present = np.asarray(pooled @ g.label_of_col) > 0
        k_dim = np.add.reduceat(present.astype(float), g.dim_start, axis=1)
        k = k_dim[:, g.seg_dimpos]
        k = np.where(np.isnan(g.seg_k), k, g.seg_k)
    out = np.full((pooled.shape[0], len(data.dims), len(CONDITIONS)), np.nan)
    out[:, g.seg_dim, g.seg_cond] = bi_from_parts(
        total, xlogx, m, k, single_label_bi=data.single_label_bi
    )
    return out


def _levels(data: _BootstrapData) -> tuple[list[tuple[str, str]], np.ndarray, list[int]]:
    """(cohort, dimension) of each reported level, its (levels x dims) membership (each
    cohort: dimension "*"; all dimensions ("*", "*"); each dimension) and the indices of the
    cohort levels."""
    cohorts = sorted({c for c, _ in data.dims})
    names = [(c, ALL) for c in cohorts] + [(ALL, ALL)] + list(data.dims)
    member = np.zeros((len(names), len(data.dims)))
    for i, (c, _) in enumerate(data.dims):
        member[cohorts.index(c), i] = 1.0
        member[len(cohorts), i] = 1.0
        member[len(cohorts) + 1 + i, i] = 1.0
    return names, member, list(range(len(cohorts)))


def _level_means(
    values: np.ndarray, member: np.ndarray, cohort_levels: list[int], overall: str
) -> np.ndarray:
    """(G, B, dims, conds) -> (G, B, levels, conds): mean over each level's dimensions,
    ignoring empty (NaN) ones; under ``overall`` "cohort" the ("*", "*") level is the mean
    of the cohort levels instead (each cohort weighing the same)."""
    ok = ~np.isnan(values)
    num = np.einsum("gbdc,ld->gblc", np.where(ok, values, 0.0), member)
    den = np.einsum("gbdc,ld->gblc", ok.astype(float), member)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = num / den
    if overall == "cohort":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out[:, :, len(cohort_levels)] = np.nanmean(out[:, :, cohort_levels], axis=2)
    return out


def _bootstrap_frame(
    data: _BootstrapData,
    estimate: np.ndarray,
    boot: np.ndarray,
    replicates: int,
    seed: int,
    draws: str = "paired",
) -> pl.DataFrame:
    """The bootstrap.parquet table from per-group BI arrays: estimate (G, 1, D, C) on the
    original data, boot (G, B, D, C) per replicate."""
    names, member, cohort_levels = _levels(data)
    est = _level_means(estimate, member, cohort_levels, data.overall)
    rep = _level_means(boot, member, cohort_levels, data.overall)
    keys = [g.key for g in data.groups]
    # model "*": the mean over models of the same extractor, within each replicate
    ekeys = sorted({k[:-1] for k in keys})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for e in ekeys:
            idx = [i for i, k in enumerate(keys) if k[:-1] == e]
            est = np.concatenate([est, np.nanmean(est[idx], axis=0, keepdims=True)])
            rep = np.concatenate([rep, np.nanmean(rep[idx], axis=0, keepdims=True)])
            keys.append((*e, ALL))
        ci = {}
        rows = []
        ia = {c: i for i, c in enumerate(CONDITIONS)}
        for label, a, b in COMPARISONS:
            d_est = est[:, 0, :, ia[a]] - est[:, 0, :, ia[b]]  # (G, L)
            d_rep = rep[:, :, :, ia[a]] - rep[:, :, :, ia[b]]  # (G, B, L)
            lo, hi = np.nanpercentile(d_rep, [2.5, 97.5], axis=1)
            mean = np.nanmean(d_rep, axis=1)
            ci[label] = (d_est, mean, lo, hi)
    for label, (d_est, mean, lo, hi) in ci.items():
        for gi, key in enumerate(keys):
            for li, (cohort, dimension) in enumerate(names):
                if np.isnan(d_est[gi, li]):
                    continue
                rows.append(
                    (
                        *key,
                        cohort,
                        dimension,
                        label,
                        float(d_est[gi, li]),
                        float(mean[gi, li]),
                        float(lo[gi, li]),
                        float(hi[gi, li]),
                    )
                )
    cols = data.gkeys + ["cohort", "dimension", "comparison", "estimate", "boot_mean"]
    cols += ["ci_low", "ci_high"]
    schema = {c: pl.String for c in data.gkeys + ["cohort", "dimension", "comparison"]}
    schema.update({c: pl.Float64 for c in ("estimate", "boot_mean", "ci_low", "ci_high")})
    frame = pl.DataFrame(rows, schema=schema, orient="row").with_columns(
        pl.col("boot_mean", "ci_low", "ci_high").fill_nan(None),
        pl.lit(replicates, pl.Int64).alias("replicates"),
        pl.lit(seed, pl.Int64).alias("seed"),
        pl.lit(data.k_definition).alias("k_definition"),
        pl.lit(data.overall).alias("overall_definition"),
        pl.lit(draws).alias("draws"),
    )
    return frame.sort(data.gkeys + ["cohort", "dimension", "comparison"])


def cluster_bootstrap(
    attributes: pl.DataFrame,
    replicates: int = 1000,
    seed: int = 0,
    k_definition: str = "model",
    schema: AttributeSchema | None = None,
    *,
    draws: str = "paired",
    overall: str = "cohort",
    single_label_bi: float = 0.0,
) -> pl.DataFrame:
    """Role-level cluster bootstrap of pooled-BI differences between conditions (paper App.
    E.1, Tables 8-9).

    Each replicate draws as many roles as there are, with replacement, from the roles of
    the attributes table: under ``draws`` "paired" one draw per replicate is shared by all
    models, dimensions and conditions, so that differences stay paired; under "unpaired"
    each (extractor,) model x condition draws on its own (the released code). Label counts
    are pooled over the drawn roles weighted by multiplicity, and pooled BI is recomputed
    per dimension with K per ``k_definition`` recomputed on the resample ('model': labels
    with a positive pooled count in any condition; 'cell': in the cell; 'vocabulary': the
    closed vocabulary's size, open dimensions as 'model'), so that the original data give
    pooled_bi's K. A cohort's value is the mean of its dimensions; "*" is the mean of the
    cohort values (``overall`` "cohort", default) or of all dimensions ("dimension"); model
    "*" is the mean over models within each replicate. All replicates are computed at once:
    a (B x roles) multiplicity matrix times a (roles x labels) count matrix per model.

    Columns: [extractor], model (or "*"), cohort (or "*"), dimension ("*" = the cohort, or a
    dimension name), comparison ("CA-R - CF", "CA-U - CF", "CA-U - CA-R"), estimate (on the
    original data; equals the difference of :func:`pooled_bi` values), boot_mean (mean over
    replicates: the paper's reported "mean differences"), ci_low, ci_high (2.5 and 97.5
    percentiles), replicates, seed, k_definition, overall_definition, draws. Rows whose
    estimate is undefined (a condition without data) are left out."""
    if draws not in BOOTSTRAP_DRAWS:
        raise ValueError(f"draws {draws!r}; allowed: {', '.join(BOOTSTRAP_DRAWS)}")
    data = _bootstrap_data(attributes, k_definition, schema, overall, single_label_bi)
    return _bootstrap_vectorised(data, replicates, seed, draws)


def _pooled_counts(g: _Group, mult: np.ndarray | dict[int, np.ndarray]) -> np.ndarray:
    """Label counts pooled over resampled roles: one (B x R) multiplicity for every column,
    or one per condition index (unpaired draws)."""
    if isinstance(mult, np.ndarray):
        return mult @ g.counts
    out = np.zeros((next(iter(mult.values())).shape[0], g.counts.shape[1]))
    for c, m in mult.items():
        cols = g.col_cond == c
        out[:, cols] = m @ g.counts[:, cols]
    return out


def _multiplicities(data: _BootstrapData, g: _Group, replicates: int, seed: int, draws: str):
    if draws == "paired":
        return role_multiplicity(_role_draws(data.n_roles, replicates, seed), data.n_roles)
    return {
        c: role_multiplicity(
            _role_draws(data.n_roles, replicates, _unpaired_seed(seed, g.key, cond)), data.n_roles
        )
        for c, cond in enumerate(CONDITIONS)
    }


def _bootstrap_vectorised(
    data: _BootstrapData, replicates: int, seed: int, draws: str = "paired"
) -> pl.DataFrame:
    ones = np.ones((1, data.n_roles))
    estimate = np.stack([_replicate_bi(g, ones @ g.counts, data) for g in data.groups])
    paired = (
        role_multiplicity(_role_draws(data.n_roles, replicates, seed), data.n_roles)
        if draws == "paired"
        else None
    )
    boot = np.stack(
        [
            _replicate_bi(
                g,
                _pooled_counts(
                    g,
                    paired
                    if paired is not None
                    else _multiplicities(data, g, replicates, seed, draws),
                ),
                data,
            )
            for g in data.groups
        ]
    )
    return _bootstrap_frame(data, estimate, boot, replicates, seed, draws)


def _cluster_bootstrap_loop(
    attributes: pl.DataFrame,
    replicates: int = 1000,
    seed: int = 0,
    k_definition: str = "model",
    schema: AttributeSchema | None = None,
    *,
    overall: str = "cohort",
) -> pl.DataFrame:
    """:func:`cluster_bootstrap` (paired draws) one replicate at a time (the reference
    implementation for the benchmark and for a test: same draws, same result)."""
    data = _bootstrap_data(attributes, k_definition, schema, overall)
    return _bootstrap_loop(data, replicates, seed)


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
    return _bootstrap_frame(data, np.stack(estimate), np.stack(boot), replicates, seed)
