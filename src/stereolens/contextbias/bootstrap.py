"""ContextBias role-level cluster bootstrap of pooled-BI differences between conditions
(paper Tables 8-9, App. E.1), all replicates at once, with paired or unpaired role draws."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import sparse
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
)
from stereolens.contextbias.schema import AttributeSchema
from stereolens.ids import stable_id

COMPARISONS = (
    ("CA-R - CF", "CA-R", "CF"),
    ("CA-U - CF", "CA-U", "CF"),
    ("CA-U - CA-R", "CA-U", "CA-R"),
)


# ----------------------------------------------------------------------------- bootstrap
BOOTSTRAP_INTERVALS = ("basic", "percentile")
"""The 95% interval of bootstrap.parquet: "basic" (default) = 2 x estimate - the 97.5 and 2.5
percentiles of the replicates, which removes the plug-in BI's small-sample bias that the
percentile interval adds a second time (bench/COVERAGE.md, ContextBias); "percentile" = the
2.5 and 97.5 percentiles, as the released code (its headline CI)."""
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


@dataclass
class LevelReplicates:
    """BI of every reported level on the original data and per bootstrap replicate, per
    (extractor,) model: ``estimate`` (G, L, C) and ``replicates`` (G, B, L, C), G = ``keys``
    (one per (extractor,) model of the table; model "*" rows are not included), L =
    ``levels`` ((cohort, "*") per cohort, ("*", "*") overall, then each (cohort,
    dimension)), C = CONDITIONS. Under paired draws replicate b of every model and condition
    comes from the same role draw."""

    gkeys: list[str]
    keys: list[tuple]
    levels: list[tuple[str, str]]
    estimate: np.ndarray
    replicates: np.ndarray
    n_replicates: int
    seed: int
    draws: str
    k_definition: str
    overall: str


def _level_replicates(
    data: _BootstrapData,
    estimate: np.ndarray,
    boot: np.ndarray,
    replicates: int,
    seed: int,
    draws: str = "paired",
) -> LevelReplicates:
    names, member, cohort_levels = _levels(data)
    est = _level_means(estimate, member, cohort_levels, data.overall)
    rep = _level_means(boot, member, cohort_levels, data.overall)
    return LevelReplicates(
        data.gkeys,
        [g.key for g in data.groups],
        names,
        est[:, 0],
        rep,
        replicates,
        seed,
        draws,
        data.k_definition,
        data.overall,
    )


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
    return bootstrap_frame(_level_replicates(data, estimate, boot, replicates, seed, draws))


def bootstrap_frame(lv: LevelReplicates, interval: str = "basic") -> pl.DataFrame:
    """The bootstrap.parquet table (see :func:`cluster_bootstrap`) from level replicates."""
    if interval not in BOOTSTRAP_INTERVALS:
        raise ValueError(f"interval {interval!r}; allowed: {', '.join(BOOTSTRAP_INTERVALS)}")
    names = lv.levels
    est = lv.estimate[:, None]
    rep = lv.replicates
    keys = list(lv.keys)
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
            if interval == "basic":
                lo, hi = 2 * d_est - hi, 2 * d_est - lo
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
    cols = lv.gkeys + ["cohort", "dimension", "comparison", "estimate", "boot_mean"]
    cols += ["ci_low", "ci_high"]
    schema = {c: pl.String for c in lv.gkeys + ["cohort", "dimension", "comparison"]}
    schema.update({c: pl.Float64 for c in ("estimate", "boot_mean", "ci_low", "ci_high")})
    frame = pl.DataFrame(rows, schema=schema, orient="row").with_columns(
        pl.col("boot_mean", "ci_low", "ci_high").fill_nan(None),
        pl.lit(lv.n_replicates, pl.Int64).alias("replicates"),
        pl.lit(lv.seed, pl.Int64).alias("seed"),
        pl.lit(lv.k_definition).alias("k_definition"),
        pl.lit(lv.overall).alias("overall_definition"),
        pl.lit(lv.draws).alias("draws"),
        (2 * pl.col("estimate") - pl.col("boot_mean")).fill_nan(None).alias("estimate_bc"),
        pl.lit(interval).alias("interval"),
    )
    return frame.sort(lv.gkeys + ["cohort", "dimension", "comparison"])


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
    interval: str = "basic",
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
    original data, the plug-in: the paper's number; equals the difference of
    :func:`pooled_bi` values), estimate_bc (bias-corrected: 2 x estimate - boot_mean),
    boot_mean (mean over replicates: the paper's reported "mean differences"), ci_low,
    ci_high (``interval`` "basic", default: 2 x estimate - the 97.5 and 2.5 percentiles;
    "percentile": the 2.5 and 97.5 percentiles, as the released code), interval, replicates,
    seed, k_definition, overall_definition, draws. Rows whose estimate is undefined (a
    condition without data) are left out."""
    return bootstrap_frame(
        level_replicates(
            attributes,
            replicates,
            seed,
            k_definition,
            schema,
            draws=draws,
            overall=overall,
            single_label_bi=single_label_bi,
        ),
        interval,
    )


def level_replicates(
    attributes: pl.DataFrame,
    replicates: int = 1000,
    seed: int = 0,
    k_definition: str = "model",
    schema: AttributeSchema | None = None,
    *,
    draws: str = "paired",
    overall: str = "cohort",
    single_label_bi: float = 0.0,
) -> LevelReplicates:
    """The role-level cluster bootstrap of :func:`cluster_bootstrap` (same draws, same
    options) as arrays: pooled BI per (extractor,) model x level x condition on the original
    data and per replicate (:class:`LevelReplicates`); :func:`bootstrap_frame` turns it into
    bootstrap.parquet, contextbias.comparisons into model comparisons."""
    if draws not in BOOTSTRAP_DRAWS:
        raise ValueError(f"draws {draws!r}; allowed: {', '.join(BOOTSTRAP_DRAWS)}")
    data = _bootstrap_data(attributes, k_definition, schema, overall, single_label_bi)
    estimate, boot = _bootstrap_arrays(data, replicates, seed, draws)
    return _level_replicates(data, estimate, boot, replicates, seed, draws)


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
    estimate, boot = _bootstrap_arrays(data, replicates, seed, draws)
    return _bootstrap_frame(data, estimate, boot, replicates, seed, draws)


def _bootstrap_arrays(
    data: _BootstrapData, replicates: int, seed: int, draws: str = "paired"
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group BI (G, 1, D, C) on the original data and (G, B, D, C) per replicate."""
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
    return estimate, boot


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
