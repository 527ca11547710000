"""ContextBias role-level cluster bootstrap of pooled-BI differences between conditions
(paper Tables 8-9, App. E.1), all replicates at once, with paired or unpaired role draws."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from scipy import sparse
from scipy.special import xlogy

from stereolens.contextbias.intervals import BOOTSTRAP_INTERVALS, MIN_ROLES, withheld_note
from stereolens.contextbias.intervals import interval as ci_bounds
from stereolens.contextbias.metrics import (
    ALL,
    CONDITIONS,
    _dimension_k,
    _group_keys,
    bi_from_parts,
    check_attributes,
    check_bi_options,
    check_conditions,
    nanmean,
)
from stereolens.contextbias.schema import AttributeSchema
from stereolens.ids import stable_id

COMPARISONS = (
    ("CA-R - CF", "CA-R", "CF"),
    ("CA-U - CF", "CA-U", "CF"),
    ("CA-U - CA-R", "CA-U", "CA-R"),
)


# ----------------------------------------------------------------------------- bootstrap
BOOTSTRAP_DRAWS = ("paired", "unpaired")
"""How roles are drawn in each bootstrap replicate: "paired" = one draw shared by every
model and condition (differences stay paired; default); "unpaired" = an independent draw
per model x condition, as the authors' released code does."""
SUPPORTS = ("own", "common")
"""K of the replicated BI: "own" = per ``k_definition`` for each model (bi.parquet's, the
paper's numbers); "common" = one label support for every model and extractor: the closed
vocabulary's size (schema) where the dimension has one, else the labels seen by any model
and extractor in any condition (of the resample): what the model comparisons use, so that a
difference between models is not a difference of the labels each happened to show
(bench/COVERAGE.md, ContextBias)."""


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
    glabel_of_col: sparse.csr_matrix  # columns x the table's (dimension, label) pairs 0/1


@dataclass
class _BootstrapData:
    gkeys: list[str]
    groups: list[_Group]
    dims: list[tuple[str, str]]  # (cohort, dimension), global order
    n_roles: int
    k_definition: str
    overall: str = "cohort"
    single_label_bi: float = 0.0
    support: str = "own"
    gdim_start: np.ndarray | None = None  # first (dimension, label) pair of each dimension


def _bootstrap_data(
    attributes: pl.DataFrame,
    k_definition: str,
    schema: AttributeSchema | None,
    overall: str = "cohort",
    single_label_bi: float = 0.0,
    support: str = "own",
) -> _BootstrapData:
    check_attributes(attributes)
    check_conditions(attributes)
    check_bi_options(k_definition, overall, single_label_bi)
    if support not in SUPPORTS:
        raise ValueError(f"support {support!r}; allowed: {', '.join(SUPPORTS)}")
    if support == "common":
        k_definition = "vocabulary"
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
    glabels = (
        attributes.select("dimension", "label")
        .unique()
        .join(index.select("dimension", "d"), on="dimension")
        .sort("d", "label")
        .with_row_index("glab")
    )
    gdim_start = np.searchsorted(glabels["d"].to_numpy(), np.arange(len(dims))).astype(np.intp)
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
        cols = cols.join(glabels.select("d", "label", "glab"), on=["d", "label"], how="left")
        cols = cols.sort("col")
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
                glabel_of_col=sparse.csr_matrix(
                    (np.ones(n_cols), (cols["col"].to_numpy(), cols["glab"].to_numpy())),
                    shape=(n_cols, glabels.height),
                ),
            )
        )
    return _BootstrapData(
        gkeys, groups, dims, len(roles), k_definition, overall, float(single_label_bi),
        support, gdim_start,
    )  # fmt: skip


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


def _replicate_bi(
    g: _Group, pooled: np.ndarray, data: _BootstrapData, k_common: np.ndarray | None = None
) -> np.ndarray:
    """BI (rows x dimensions x conditions, NaN where empty) from pooled label counts
    (rows x columns) of resampled roles. K per k_definition, recomputed from the resample:
    'model' = labels with a positive pooled count in any condition, 'cell' = in the cell,
    'vocabulary' = the closed vocabulary size (open dimensions as 'model', or
    ``k_common`` (rows x all dimensions) under support "common")."""
    total = np.add.reduceat(pooled, g.seg_start, axis=1)
    xlogx = np.add.reduceat(xlogy(pooled, pooled), g.seg_start, axis=1)
    m = np.add.reduceat((pooled > 0).astype(float), g.seg_start, axis=1)
    if data.k_definition == "cell":
        k = m
    else:
        present = np.asarray(pooled @ g.label_of_col) > 0
        k_dim = np.add.reduceat(present.astype(float), g.dim_start, axis=1)
        k = k_dim[:, g.seg_dimpos] if k_common is None else k_common[:, g.seg_dim]
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
        out[:, :, len(cohort_levels)] = nanmean(out[:, :, cohort_levels], axis=2)
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
    n_roles: int = 0
    support: str = "own"
    jackknife: np.ndarray | None = None
    """(G, R, L, C) leave-one-role-out values, K fixed at the full data's (support "common"
    only: the comparisons' standard error)."""


def _level_replicates(
    data: _BootstrapData,
    estimate: np.ndarray,
    boot: np.ndarray,
    replicates: int,
    seed: int,
    draws: str = "paired",
    jack: np.ndarray | None = None,
) -> LevelReplicates:
    names, member, cohort_levels = _levels(data)
    est = _level_means(estimate, member, cohort_levels, data.overall)
    rep = _level_means(boot, member, cohort_levels, data.overall)
    if jack is not None:
        jack = _level_means(jack, member, cohort_levels, data.overall)
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
        data.n_roles,
        data.support,
        jack,
    )


def bootstrap_frame(
    lv: LevelReplicates, interval: str = "bc-t", min_roles: int = MIN_ROLES
) -> pl.DataFrame:
    """The bootstrap.parquet table (see :func:`cluster_bootstrap`) from level replicates;
    with fewer than ``min_roles`` roles ci_low / ci_high are null and interval_note says
    why (null where the interval is printed)."""
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
            lo, hi = ci_bounds(d_est, d_rep, interval, lv.n_roles)
            mean = np.nanmean(d_rep, axis=1)
            ci[label] = (d_est, mean, lo, hi)
    for label, (d_est, mean, lo, hi) in ci.items():
        for gi, key in enumerate(keys):
            for li, (cohort, dimension) in enumerate(names):
                if np.isnan(d_est[gi, li]):
                    continue
                values = (d_est[gi, li], mean[gi, li], lo[gi, li], hi[gi, li])
                rows.append((*key, cohort, dimension, label, *map(float, values)))
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
    note = withheld_note(lv.n_roles, min_roles)
    if note is not None:
        frame = frame.with_columns(pl.lit(None, pl.Float64).alias(c) for c in ("ci_low", "ci_high"))
    frame = frame.with_columns(pl.lit(note, pl.String).alias("interval_note"))
    return frame.sort(lv.gkeys + ["cohort", "dimension", "comparison"])


def cluster_bootstrap(
    attributes: pl.DataFrame,
    *args: Any,
    interval: str = "bc-t",
    min_roles: int = MIN_ROLES,
    **options: Any,
) -> pl.DataFrame:
    """Role-level cluster bootstrap of pooled-BI differences between conditions (paper App.
    E.1, Tables 8-9): bootstrap.parquet (columns: docs/outputs.md).

    Each replicate draws as many roles as there are, with replacement: under ``draws``
    "paired" one draw per replicate shared by all models, dimensions and conditions; under
    "unpaired" one per (extractor,) model x condition (the released code). Pooled BI is
    recomputed on the resample with K per ``k_definition`` ('model', 'cell', 'vocabulary'),
    so that the original data give pooled_bi's K; cohort, overall (``overall``) and model "*"
    values are means within each replicate. Rows whose estimate is undefined are left out.
    ``args`` and ``options``: :func:`level_replicates`'s."""
    return bootstrap_frame(level_replicates(attributes, *args, **options), interval, min_roles)


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
    support: str = "own",
) -> LevelReplicates:
    """The role-level cluster bootstrap of :func:`cluster_bootstrap` (same draws, same
    options) as arrays: pooled BI per (extractor,) model x level x condition on the original
    data and per replicate (:class:`LevelReplicates`); :func:`bootstrap_frame` turns it into
    bootstrap.parquet, contextbias.comparisons into model comparisons. ``support`` (SUPPORTS):
    "own" = K per ``k_definition``; "common" = one label support for the whole table (the
    model comparisons'; ``k_definition`` is then ignored)."""
    if draws not in BOOTSTRAP_DRAWS:
        raise ValueError(f"draws {draws!r}; allowed: {', '.join(BOOTSTRAP_DRAWS)}")
    data = _bootstrap_data(attributes, k_definition, schema, overall, single_label_bi, support)
    estimate, boot = _bootstrap_arrays(data, replicates, seed, draws)
    jack = _jackknife_arrays(data) if support == "common" else None
    return _level_replicates(data, estimate, boot, replicates, seed, draws, jack)


def _jackknife_arrays(data: _BootstrapData) -> np.ndarray:
    """Per-group BI (G, R, D, C) with one role left out in each row, K the full data's."""
    leave_out = 1.0 - np.eye(data.n_roles)
    k = _common_k(data, [np.ones((1, data.n_roles)) @ g.counts for g in data.groups])
    groups = zip(data.groups, k, strict=True)
    return np.stack([_replicate_bi(g, leave_out @ g.counts, data, kg) for g, kg in groups])


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
    return bootstrap_frame(_level_replicates(data, estimate, boot, replicates, seed, draws))


def _bootstrap_arrays(
    data: _BootstrapData, replicates: int, seed: int, draws: str = "paired"
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group BI (G, 1, D, C) on the original data and (G, B, D, C) per replicate."""
    ones = np.ones((1, data.n_roles))
    paired = (
        role_multiplicity(_role_draws(data.n_roles, replicates, seed), data.n_roles)
        if draws == "paired"
        else None
    )
    est_counts = [ones @ g.counts for g in data.groups]
    boot_counts = [
        _pooled_counts(
            g, paired if paired is not None else _multiplicities(data, g, replicates, seed, draws)
        )
        for g in data.groups
    ]
    k_est = k_boot = [None] * len(data.groups)
    if data.support == "common":
        k_est, k_boot = _common_k(data, est_counts), _common_k(data, boot_counts)
    estimate = np.stack(
        [
            _replicate_bi(g, c, data, k)
            for g, c, k in zip(data.groups, est_counts, k_est, strict=True)
        ]
    )
    boot = np.stack(
        [
            _replicate_bi(g, c, data, k)
            for g, c, k in zip(data.groups, boot_counts, k_boot, strict=True)
        ]
    )
    return estimate, boot


def _common_k(data: _BootstrapData, pooled: list[np.ndarray]) -> list[np.ndarray]:
    """Per group, (rows x all dimensions) the labels seen in any condition by any group of
    the table, every model and extractor (support "common": the generator comparisons and
    the extractor comparisons both compare values of one K)."""
    seen = None
    for g, c in zip(data.groups, pooled, strict=True):
        s = np.asarray(c @ g.glabel_of_col) > 0
        seen = s if seen is None else seen | s
    k = np.add.reduceat(seen.astype(float), data.gdim_start, axis=1)
    return [k] * len(data.groups)
