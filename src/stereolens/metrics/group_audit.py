"""Error rates of a reader (an attribute extractor, the LVLM's story assistant) per demographic
group: Wilson and F1 intervals, the largest gap's simultaneous interval, the test of difference,
the induced-bias flag and their minimum sizes (docs/statistics.md, "The reader audits")."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

# scipy.stats (0.5 s of CPU to import) is imported where used: the workflow's parse, in
# every snakemake start and SLURM job, imports this module

RATE_COLUMNS = [
    "extractor", "model", "grouping", "group_dimension", "group", "n_items", "n_correct",
    "n_false_positive", "accuracy", "accuracy_low", "accuracy_high", "recall", "precision",
    "precision_low", "precision_high", "f1", "f1_low", "f1_high", "n_clusters",
    "design_effect", "interval_note",
]  # fmt: skip
GAP_COLUMNS = [
    "extractor", "model", "grouping", "group_dimension", "n_groups", "n_items", "worst_group",
    "best_group", "error_gap", "gap_low", "gap_high", "test", "p_value", "bias", "bias_source",
    "flag", "flag_text", "n_clusters", "cluster", "design_effect", "gap_method",
    "critical_value", "induced_bias", "induced_formula", "interval_note",
]  # fmt: skip
CLUSTER = "cluster"
MIN_CLUSTERS = 5
"""Clusters per group below which a group's accuracy, precision and F1 intervals are withheld
when its items are clustered (measured on the story-reading world, bench/COVERAGE.md)."""
MIN_F1_ITEMS = 20
"""Independent items per group below which the F1 interval is withheld (measured, stated
grouping, accuracy 0.85: 84.0% at 10 items, 94.0% at 20, 97.0% at 40; bench/COVERAGE.md)."""
MIN_TEST_CLUSTERS = 40
"""Clusters below which the Rao-Scott test's p-value is withheld (the ContextBias audit;
measured in bench/COVERAGE.md)."""
_WHY = "(the smallest size at which the interval covers >= 93%, bench/COVERAGE.md)"


def _plural(n: int, unit: str) -> str:
    if n == 1:
        return f"{n} {unit}"
    if unit.endswith("y") and unit[-2:-1] not in "aeiou":
        return f"{n} {unit[:-1]}ies"
    return f"{n} {unit}s"


def _rate_note(
    clustered: bool,
    n_clusters: int,
    n_items: int,
    min_clusters: int,
    min_f1_items: int,
    cluster_name: str,
) -> tuple[str | None, bool]:
    """(interval_note, every interval withheld) of one group's rates row."""
    if clustered and n_clusters < min_clusters:
        return (
            f"withheld: {_plural(n_clusters, cluster_name)} per group < {min_clusters} {_WHY}",
            True,
        )
    if not clustered and n_items < min_f1_items:
        what = f"{_plural(n_items, 'independent item')} per group < {min_f1_items}"
        return f"withheld (F1 only): {what} {_WHY}", False
    return None, False


def wilson(k: np.ndarray, n: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of k / n (NaN where n = 0; k and n may be effective counts)."""
    from statsmodels.stats.proportion import proportion_confint

    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    lo = np.full(k.shape, np.nan)
    hi = np.full(k.shape, np.nan)
    ok = n > 0
    if ok.any():
        lo[ok], hi[ok] = proportion_confint(k[ok], n[ok], alpha=1 - level, method="wilson")
    return lo, hi


def f1_interval(
    correct: np.ndarray,
    false_pos: np.ndarray,
    replicates: int,
    seed: int,
    level: float = 0.95,
    clusters: np.ndarray | None = None,
) -> tuple[float, float, float]:
    """F1 = 2 P R / (P + R) of items (correct: TP per item, false_pos: FP per item) with a
    Wald interval on the logit scale from the bootstrap over ``clusters`` (default items):
    se = sd(replicates) x sqrt(C / (C - 1)), interval = expit(logit(F1) +- t(C - 1) se /
    (F1 (1 - F1))) (at F1 = 0 or 1: F1 +- t se, clipped)."""
    from scipy import stats

    correct = np.asarray(correct, dtype=float)
    false_pos = np.asarray(false_pos, dtype=float)

    def f1(tp, fp, n):
        with np.errstate(invalid="ignore", divide="ignore"):
            p = tp / (tp + fp)
            r = tp / n
            out = np.where(p + r > 0, 2 * p * r / (p + r), 0.0)
        return np.where((n > 0) & np.isfinite(p), out, np.nan)

    n = correct.size
    point = float(f1(correct.sum(), false_pos.sum(), n))
    if n == 0 or replicates <= 0:
        return point, float("nan"), float("nan")
    if clusters is None:
        tp, fp, size = correct, false_pos, np.ones(n)
    else:
        _, c = np.unique(np.asarray(clusters), return_inverse=True)
        tp, fp, size = (np.bincount(c, weights=w) for w in (correct, false_pos, np.ones(n)))
    n_c = tp.size
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_c, size=(replicates, n_c))
    boot = f1(tp[idx].sum(1), fp[idx].sum(1), size[idx].sum(1))
    boot = boot[np.isfinite(boot)]
    if boot.size < 2 or n_c < 2 or not np.isfinite(point):
        return point, float("nan"), float("nan")
    t = stats.t.ppf(1 - (1 - level) / 2, n_c - 1)
    se = boot.std(ddof=1) * np.sqrt(n_c / (n_c - 1))
    if not 0 < point < 1:  # F1 = 0 or 1: no logit; the plain Wald interval, clipped
        return point, float(max(point - t * se, 0.0)), float(min(point + t * se, 1.0))
    centre, half = np.log(point / (1 - point)), t * se / (point * (1 - point))
    lo, hi = 1 / (1 + np.exp(-(centre - half))), 1 / (1 + np.exp(-(centre + half)))
    return point, float(lo), float(hi)


def with_pooled(items: pl.DataFrame) -> pl.DataFrame:
    """Items plus model "*" (every generator pooled) when there are several models."""
    if items["model"].n_unique() < 2:
        return items
    return pl.concat([items, items.with_columns(pl.lit("*").alias("model"))])


def cluster_counts(
    group_idx: np.ndarray, cluster: np.ndarray | None, errors: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray, bool]:
    """(E, N, clustered): errors and items per cluster (rows) x group (columns); without
    clusters every item is its own. ``clustered``: some cluster holds more than one item."""
    if cluster is None:
        c = np.arange(group_idx.size)
    else:
        _, c = np.unique(np.asarray(cluster), return_inverse=True)
    n_c = int(c.max()) + 1 if c.size else 0
    E = np.zeros((n_c, k))
    N = np.zeros((n_c, k))
    np.add.at(E, (c, group_idx), errors)
    np.add.at(N, (c, group_idx), 1.0)
    return E, N, bool(n_c and N.sum(1).max() > 1)


def cluster_covariance(E: np.ndarray, N: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p, V): per-group error rates p_g = sum_c E_cg / sum_c N_cg and their cluster-robust
    covariance V = C / (C - 1) Z'Z, Z_cg = (E_cg - p_g N_cg) / N_g (linearised ratio
    estimator). Needs C >= 2 clusters; NaN otherwise."""
    n_g = N.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = E.sum(0) / n_g
        Z = (E - p * N) / n_g
    c = E.shape[0]
    if c < 2:
        return p, np.full((E.shape[1], E.shape[1]), np.nan)
    return p, c / (c - 1) * (Z.T @ Z)


def design_effects(E: np.ndarray, N: np.ndarray, clustered: bool) -> np.ndarray:
    """Per group: cluster-robust variance of the error rate over its binomial variance, at
    least 1 (1 for independent items, and where the rate is 0 or 1 or C < 2)."""
    k = E.shape[1]
    if not clustered or E.shape[0] < 2:
        return np.ones(k)
    p, V = cluster_covariance(E, N)
    binom = p * (1 - p) / N.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.diag(V) / binom
    return np.where(np.isfinite(d), np.maximum(d, 1.0), 1.0)


def _adjusted(E: np.ndarray, N: np.ndarray, clustered: bool) -> tuple[np.ndarray, np.ndarray]:
    """Agresti-Caffo adjusted error rates (one wrong and one right pseudo-item per group, in
    clusters of their own) and their covariance: binomial for independent items; else the
    cluster covariance with each variance at least the binomial one (design effect >= 1)."""
    k = E.shape[1]
    pt = (E.sum(0) + 1) / (N.sum(0) + 2)
    binom = pt * (1 - pt) / (N.sum(0) + 2)
    if not clustered:
        return pt, np.diag(binom)
    eye = np.eye(k)
    _, V = cluster_covariance(np.vstack([E, eye, 0 * eye]), np.vstack([N, eye, eye]))
    V[np.diag_indices(k)] = np.maximum(np.diag(V), binom)
    return pt, V


def simultaneous_gap(
    E: np.ndarray, N: np.ndarray, clustered: bool, level: float = 0.95
) -> tuple[float, float, float]:
    """(gap_low, gap_high, critical value): the interval of the largest error-rate gap between
    two groups from simultaneous Bonferroni-t intervals over all pairs (docs/statistics.md)."""
    from scipy import stats

    k = E.shape[1]
    pt, V = _adjusted(E, N, clustered)
    m = k * (k - 1) // 2
    df = E.shape[0] - 1 if clustered else np.inf
    crit = float(stats.t.ppf(1 - (1 - level) / (2 * m), df))
    d = pt[:, None] - pt[None, :]
    var = np.diag(V)[:, None] + np.diag(V)[None, :] - 2 * V
    se = np.sqrt(np.maximum(var, 0.0))
    off = ~np.eye(k, dtype=bool)
    lo = float(np.clip((d - crit * se)[off].max(), 0.0, 1.0))
    hi = float(np.clip((d + crit * se)[off].max(), 0.0, 1.0))
    return lo, hi, crit


def induced_shares(accuracy) -> np.ndarray | None:
    """a_g / sum_h a_h (what accuracies alone make of an unbiased cell); None if undefined."""
    a = np.asarray(accuracy, dtype=float)
    if a.size < 2 or not np.isfinite(a).all() or a.sum() <= 0:
        return None
    return a / a.sum()


def difference_test(correct: np.ndarray, total: np.ndarray) -> tuple[str, float]:
    """(test, p) of equal accuracy across groups: Fisher's exact test for two groups with an
    expected count below 5, else Pearson's chi-squared; p = 1 where accuracy is constant."""
    from scipy import stats

    table = np.stack([correct, total - correct], axis=1).astype(float)
    if table.shape[0] < 2 or (table.sum(0) == 0).any():
        return "none (one outcome only)", 1.0
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    if table.shape[0] == 2 and (expected < 5).any():
        return "fisher exact", float(stats.fisher_exact(table.astype(int))[1])
    chi2, p, _, _ = stats.chi2_contingency(table, correction=False)
    return "chi-squared", float(p)


def rao_scott(E: np.ndarray, N: np.ndarray) -> tuple[str, float]:
    """(test, p) of equal error rates across groups for clustered items: Pearson's X^2 with
    the second-order Rao-Scott correction, F form (docs/statistics.md)."""
    from scipy import stats

    name = "rao-scott F"
    n_g = N.sum(0)
    e = E.sum(0)
    pbar = e.sum() / n_g.sum()
    k = E.shape[1]
    if k < 2 or pbar <= 0 or pbar >= 1:
        return "none (one outcome only)", 1.0
    if E.shape[0] < 2:
        return "none (one cluster)", float("nan")
    p, V = cluster_covariance(E, N)
    x2 = float((n_g * (p - pbar) ** 2).sum() / (pbar * (1 - pbar)))
    cm = np.vstack([np.eye(k - 1), -np.ones((1, k - 1))])
    a = cm.T @ np.diag(pbar * (1 - pbar) / n_g) @ cm
    b = cm.T @ V @ cm
    delta = np.clip(np.linalg.eigvals(np.linalg.solve(a, b)).real, 0.0, None)
    s = float(delta.sum())
    if s <= 1e-12:
        return name, 0.0 if x2 > 1e-12 else 1.0
    d0 = s**2 / float((delta**2).sum())
    return name, float(stats.f.sf(x2 / s, d0, d0 * (E.shape[0] - 1)))


def group_rates(
    items: pl.DataFrame,
    *,
    keys: tuple[str, ...] = ("extractor", "model", "grouping", "group_dimension"),
    level: float = 0.95,
    replicates: int = 1000,
    seed: int = 0,
    min_clusters: int = MIN_CLUSTERS,
    min_f1_items: int = MIN_F1_ITEMS,
    cluster_name: str = "cluster",
) -> pl.DataFrame:
    """Per ``keys`` x group of ``items`` (keys, group, correct, false_positive, optional
    ``cluster``): items, accuracy, recall and precision (Wilson on effective counts), F1
    (bootstrap over clusters), clusters and design effect. Intervals are null below
    ``min_clusters`` clusters (F1: ``min_f1_items`` items), ``interval_note`` saying why."""
    rows, deff_p, withheld = [], [], []
    items = items.sort(pl.all())  # joins and group_by leave row order open: fix it (seeds)
    has_c = CLUSTER in items.columns
    for key, sub in items.group_by([*keys, "group"], maintain_order=True):
        c = sub["correct"].to_numpy()
        fp = sub["false_positive"].to_numpy()
        cl = sub[CLUSTER].to_numpy() if has_c else None
        E, N, clustered = cluster_counts(np.zeros(c.size, dtype=int), cl, 1.0 - c, 1)
        f1, f1_lo, f1_hi = f1_interval(c, fp, replicates, seed, level, cl if clustered else None)
        # precision's own design effect: contradicting labels among the labels read, by cluster
        pe = cluster_counts(np.zeros(c.size, dtype=int), cl, fp, 1)[0]
        pn = cluster_counts(np.zeros(c.size, dtype=int), cl, c + fp, 1)[0]
        keep = pn[:, 0] > 0
        deff_p.append(float(design_effects(pe[keep], pn[keep], clustered)[0]))
        note, every = _rate_note(
            clustered, int(E.shape[0]), int(c.size), min_clusters, min_f1_items, cluster_name
        )
        withheld.append(every)
        rows.append(dict(zip([*keys, "group"], key, strict=True)) | {
            "n_items": int(c.size), "n_correct": int(c.sum()), "n_false_positive": int(fp.sum()),
            "f1": f1, "f1_low": None if note else f1_lo, "f1_high": None if note else f1_hi,
            "n_clusters": int(E.shape[0]),
            "design_effect": float(design_effects(E, N, clustered)[0]), "interval_note": note,
        })  # fmt: skip
    out = pl.DataFrame(
        rows,
        schema_overrides={"f1_low": pl.Float64, "f1_high": pl.Float64, "interval_note": pl.String},
    )
    if out.height == 0:
        return out
    n, k, fp = (out[c].to_numpy() for c in ("n_items", "n_correct", "n_false_positive"))
    deff = out["design_effect"].to_numpy()
    a_lo, a_hi = wilson(k / deff, n / deff, level)
    dp = np.array(deff_p)
    p_lo, p_hi = wilson(k / dp, (k + fp) / dp, level)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(n > 0, k / np.maximum(n, 1), np.nan)
        prec = np.where(k + fp > 0, k / np.maximum(k + fp, 1), np.nan)
    out = out.with_columns(
        pl.Series("accuracy", acc), pl.Series("accuracy_low", a_lo),
        pl.Series("accuracy_high", a_hi), pl.Series("recall", acc),
        pl.Series("precision", prec), pl.Series("precision_low", p_lo),
        pl.Series("precision_high", p_hi),
    ).with_columns(pl.col(pl.Float64).fill_nan(None))  # fmt: skip
    gone = pl.Series(withheld, dtype=pl.Boolean)
    out = out.with_columns(
        pl.when(gone).then(None).otherwise(pl.col(c)).alias(c)
        for c in ("accuracy_low", "accuracy_high", "precision_low", "precision_high")
    )
    return out.select(*[c for c in out.columns if c != "interval_note"], "interval_note").sort(
        [*keys, "group"]
    )


def group_gaps(
    rates: pl.DataFrame,
    *,
    keys: tuple[str, ...] = ("extractor", "model", "grouping", "group_dimension"),
    level: float = 0.95,
    bias: Any = None,
    bias_source: str = "",
    test: Any = None,
    min_items: int = 1,
    measured: str = "the bias",
    items: pl.DataFrame | None = None,
    cluster_name: str = "item",
    induced: Any = None,
    induced_formula: str = "",
    min_test_clusters: int = MIN_TEST_CLUSTERS,
) -> pl.DataFrame:
    """Per ``keys``: the largest error-rate gap between two groups with its simultaneous
    interval, the difference test (default Pearson / Fisher, Rao-Scott for clustered
    ``items``; ``test`` overrides) and the flag, ``induced(acc)`` against ``bias(key)``. The
    Rao-Scott p-value is null below ``min_test_clusters`` clusters."""
    by_key = {}
    if items is not None and items.height:
        for key, part in items.group_by(list(keys)):
            by_key[tuple(key)] = part
    rows = []
    for key, sub in rates.filter(pl.col("n_items") >= min_items).group_by(
        list(keys), maintain_order=True
    ):
        if sub.height < 2:
            continue
        groups = sub["group"].to_list()
        acc = sub["accuracy"].to_numpy().astype(float)
        err = 1 - acc
        worst, best = int(np.argmax(err)), int(np.argmin(err))
        n = sub["n_items"].to_numpy()
        k = sub["n_correct"].to_numpy()
        gap = float(err[worst] - err[best])
        part = by_key.get(tuple(key))
        if part is not None:
            part = part.filter(pl.col("group").is_in(groups))
            gi = part["group"].replace_strict({g: i for i, g in enumerate(groups)}).to_numpy()
            cl = part[CLUSTER].to_numpy() if CLUSTER in part.columns else None
            E, N, clustered = cluster_counts(gi, cl, 1.0 - part["correct"].to_numpy(), len(groups))
        else:
            E, N, clustered = (n - k)[None, :].astype(float), n[None, :].astype(float), False
        lo, hi, crit = simultaneous_gap(E, N, clustered, level)
        if test is not None:
            name, p = test(sub)
        elif clustered:
            name, p = rao_scott(E, N)
        else:
            name, p = difference_test(k, n)
        note = None
        if test is None and clustered and E.shape[0] < min_test_clusters:
            note = (
                f"withheld (test only): {_plural(int(E.shape[0]), cluster_name)} < "
                f"{min_test_clusters} (the smallest size at which the Rao-Scott test holds "
                "its size within 93-97%, bench/COVERAGE.md)"
            )
            p = None
        deff = design_effects(E, N, clustered)
        kd = dict(zip(keys, key, strict=True))
        b = None if bias is None else bias(kd)
        ind = None if induced is None else float(induced(acc))
        flag = (
            b is not None and ind is not None and np.isfinite(b) and np.isfinite(ind)
            and ind >= abs(b)
        )  # fmt: skip
        text = ""
        if flag:
            p_text = "test withheld" if p is None else f"p = {p:.3g}"
            text = (
                f"error differs between {groups[worst]} and {groups[best]} by {gap:.3f} "
                f"[{lo:.3f}, {hi:.3f}] ({p_text}); these errors alone would produce "
                f"{ind:.3f}, at least {measured} it is used to measure ({abs(b):.3f})"
            )
        n_pairs = len(groups) * (len(groups) - 1) // 2
        rows.append(kd | {
            "n_groups": sub.height, "n_items": int(n.sum()), "worst_group": groups[worst],
            "best_group": groups[best], "error_gap": gap, "gap_low": lo, "gap_high": hi,
            "test": name, "p_value": p, "bias": None if b is None else abs(float(b)),
            "bias_source": None if b is None else bias_source, "flag": bool(flag),
            "flag_text": text, "n_clusters": int(E.shape[0]),
            "cluster": cluster_name if clustered else "item (independent)",
            "design_effect": float(deff.mean()),
            "gap_method": f"simultaneous over {n_pairs} pair(s): Agresti-Caffo differences, "
            f"Bonferroni-t ({'C - 1' if clustered else 'normal'})",
            "critical_value": crit, "induced_bias": ind,
            "induced_formula": induced_formula if ind is not None else None,
            "interval_note": note,
        })  # fmt: skip
    schema = {c: pl.String for c in keys} | {
        "n_groups": pl.Int64, "n_items": pl.Int64, "worst_group": pl.String,
        "best_group": pl.String, "error_gap": pl.Float64, "gap_low": pl.Float64,
        "gap_high": pl.Float64, "test": pl.String, "p_value": pl.Float64, "bias": pl.Float64,
        "bias_source": pl.String, "flag": pl.Boolean, "flag_text": pl.String,
        "n_clusters": pl.Int64, "cluster": pl.String, "design_effect": pl.Float64,
        "gap_method": pl.String, "critical_value": pl.Float64, "induced_bias": pl.Float64,
        "induced_formula": pl.String, "interval_note": pl.String,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema)
