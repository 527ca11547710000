"""Bias estimates corrected for the reader's (extractor's) errors from a human-labelled sample:
stratified prediction-powered inference (PPI, ppi_py) on label shares and a bootstrap for any
metric of the shares (docs/statistics.md, "Correcting for the reader's errors")."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import stats

from stereolens.metrics.cluster_bootstrap import CLUSTER, item_clusters, resample_stratum
from stereolens.metrics.human_labels import (
    NO_LABEL,
    check_human_in_reader,
    check_human_labels,
)
from stereolens.metrics.joint_bootstrap import bootstrap_joint


def _import_ppi():
    """ppi_py, with any non-coverage.py module named ``coverage`` (bench/coverage.py) hidden
    during the import: numba, which ppi_py imports, subclasses coverage.types.Tracer."""
    if "ppi_py" in sys.modules:
        return sys.modules["ppi_py"]
    loaded = sys.modules.get("coverage", False)
    if loaded is False:
        spec = importlib.util.find_spec("coverage")
        shadowed = spec is not None and not (spec.origin or "").endswith(("coverage/__init__.py",))
    else:
        shadowed = loaded is not None and not hasattr(loaded, "Coverage")
    if not shadowed:
        return importlib.import_module("ppi_py")
    sys.modules["coverage"] = None  # type: ignore[assignment]  # import coverage: ImportError
    try:
        return importlib.import_module("ppi_py")
    finally:
        if loaded is False:
            del sys.modules["coverage"]
        else:
            sys.modules["coverage"] = loaded


ppi_py = _import_ppi()
ppi_mean_ci = ppi_py.ppi_mean_ci
ppi_mean_pointestimate = ppi_py.ppi_mean_pointestimate

LAMBDAS = ("tuned", "ppi")
"""``ppi`` (the default): lam = 1, the original PPI estimator, for which the planner sizes
the human sample; ``tuned``: PPI++ power tuning, lam per stratum in [0, 1]."""
OFF_SIMPLEX = ("clip", "raw")
"""``clip``: shares clipped to [0, 1], renormalised to sum 1 where every item carries one
label; ``raw``: the unbiased estimates as they are."""
INTERVALS = ("bc_normal", "percentile", "normal")
"""Interval of a metric: ``bc_normal`` = the bootstrap bias-corrected normal interval of
BiasIG's scores (estimate 2 x point - mean of the replicates, +- z sd); ``percentile``;
``normal`` = the point +- z sd, for an estimator already bias-corrected (Miller-Madow)."""
MIN_LABELLED = 2
"""Human-labelled items a stratum of a cell needs (a rectifier and its variance)."""
MIN_HUMAN_RELIABLE = 400
"""Human-labelled items every cell of a metric needs before its corrected interval is
printed (``interval_reliable``), as measured in bench/COVERAGE.md "Reader correction, small
samples" (bench/cover/reader.measured_minimum; tests/test_coverage.py checks it)."""
SHARE_COLUMNS = [
    "attribute", "label", "n_items", "n_human", "naive", "corrected_raw", "corrected",
    "off_simplex", "ci_low", "ci_high", "lam",
]  # fmt: skip


@dataclass(frozen=True)
class Cell:
    """The items of one cell (e.g. model x condition x attribute) as arrays."""

    labels: tuple[str, ...]
    strata: tuple[str, ...]
    stratum: np.ndarray
    """(N,) stratum index of each audited item."""
    reader: np.ndarray
    """(N, K) 1 where the reader gave the item label k."""
    labelled: np.ndarray
    """(n,) indices of the human-labelled items among the N."""
    human: np.ndarray
    """(n, K) 1 where the human gave label k."""
    weight: np.ndarray
    """(n,) inverse selection probabilities of the labelled items."""
    cluster: np.ndarray | None = None
    """(N,) cluster code of each item (the reader table's ``cluster``), or None: the
    bootstrap then resamples items, else clusters (metrics.cluster_bootstrap)."""
    items: tuple[str, ...] = ()
    """(N,) the items' ids, in order (build_cells): cells of the same items share a draw
    in corrected_metrics' ``joint`` groups (metrics.joint_bootstrap checks they match)."""

    @property
    def single_label(self) -> bool:
        """Every item carries exactly one label, in both readings (the shares sum to 1)."""
        return bool((self.reader.sum(1) == 1).all() and (self.human.sum(1) == 1).all())


def _named(labels: pl.Series) -> np.ndarray:
    """True where a label is a label (not one of NO_LABEL, any case or padding)."""
    return (~labels.str.strip_chars().str.to_lowercase().is_in(list(NO_LABEL))).to_numpy()


def _indicators(table, rows, ids: list[str], vocabulary: list[str]) -> np.ndarray:
    """(len(ids), K) 1 where an item has label k, from ``rows`` of ``table``."""
    row, col = {v: i for i, v in enumerate(ids)}, {v: k for k, v in enumerate(vocabulary)}
    out = np.zeros((len(ids), len(vocabulary)))
    items, labels, named = table
    keep = [(row[items[j]], col[labels[j]]) for j in rows if named[j]]
    if keep:
        out[tuple(np.array(keep).T)] = 1.0
    return out


def build_cells(
    reader: pl.DataFrame, human: pl.DataFrame, keys: Sequence[str] = ()
) -> dict[tuple, Cell]:
    """One Cell per (``keys``..., attribute) of the reader table (``keys`` = its columns that
    name a cell, e.g. model, condition). Every cell of an attribute has the same labels:
    those the reader or the humans gave anywhere, sorted. Each stratum of a cell needs
    MIN_LABELLED human-labelled items."""
    reader = check_human_labels(reader, "reader table", reader=True)
    human = check_human_labels(human)
    absent = [k for k in keys if k not in reader.columns]
    if absent:
        raise ValueError(f"reader table lacks the cell columns {absent}")
    check_human_in_reader(reader, human)
    vocabulary = {
        a: sorted(v for v in set(part["label"]) if v.strip().lower() not in NO_LABEL)
        for (a,), part in pl.concat(
            [reader.select("attribute", "label"), human.select("attribute", "label")]
        ).group_by("attribute")
    }
    r_item, r_stratum = reader["item_id"].to_list(), reader["stratum"].to_list()
    r_table = (r_item, reader["label"].to_list(), _named(reader["label"]))
    h_item, h_prob = human["item_id"].to_list(), human["selection_probability"].to_list()
    h_table = (h_item, human["label"].to_list(), _named(human["label"]))
    h_rows: dict[tuple[str, str], list[int]] = {}  # (attribute, item) -> human rows, in order
    for j, key in enumerate(zip(human["attribute"].to_list(), h_item, strict=True)):
        h_rows.setdefault(key, []).append(j)
    cells: dict[tuple, Cell] = {}
    clustered = CLUSTER in reader.columns  # else item_clusters is None
    groups = reader.with_row_index("_row").group_by([*keys, "attribute"], maintain_order=True)
    for *key, rows in groups.agg(pl.col("_row")).iter_rows():
        attribute = key[-1]
        id_list = list(dict.fromkeys(r_item[i] for i in rows))  # an item has one stratum
        stratum_of = {r_item[i]: r_stratum[i] for i in rows}
        hum = sorted(j for v in id_list for j in h_rows.get((attribute, v), ()))
        h_ids = list(dict.fromkeys(h_item[j] for j in hum))
        prob = {h_item[j]: h_prob[j] for j in hum}
        strata = sorted(set(stratum_of.values()))
        code = {s: i for i, s in enumerate(strata)}
        position = {v: i for i, v in enumerate(id_list)}
        labelled = np.array([position[v] for v in h_ids], dtype=np.int64)
        stratum = np.array([code[stratum_of[v]] for v in id_list], dtype=np.int64)
        counts = np.bincount(stratum[labelled], minlength=len(strata))
        short = [s for s, c in zip(strata, counts, strict=True) if c < MIN_LABELLED]
        if short:
            raise ValueError(
                f"cell {dict(zip([*keys, 'attribute'], key, strict=True))}: strata {short} "
                f"have fewer than {MIN_LABELLED} human-labelled items; label more there or "
                "merge strata"
            )
        labels = vocabulary[attribute]
        cells[tuple(key)] = Cell(
            labels=tuple(labels),
            strata=tuple(strata),
            stratum=stratum,
            reader=_indicators(r_table, rows, id_list, labels),
            labelled=labelled,
            human=_indicators(h_table, hum, h_ids, labels),
            weight=1.0 / np.array([prob[v] for v in h_ids], dtype=float),
            cluster=item_clusters(reader[rows], human[hum], id_list) if clustered else None,
            items=tuple(id_list),
        )
    return cells


def _check_options(lam: str, off_simplex: str, interval: str = "bc_normal") -> None:
    for name, value, allowed in (
        ("lam", lam, LAMBDAS),
        ("off_simplex", off_simplex, OFF_SIMPLEX),
        ("interval", interval, INTERVALS),
    ):
        if value not in allowed:
            raise ValueError(f"{name} {value!r}; allowed: {', '.join(allowed)}")


def tuned_lambda(y: np.ndarray, yhat: np.ndarray, yhat_all: np.ndarray, w: np.ndarray) -> float:
    """PPI++'s power-tuning lam for a mean as ppi_py 0.2.3 computes (not returns) it, in
    [0, 1]; 0 where the reader gives every item the same labels."""
    n, big_n = y.shape[0], yhat_all.shape[0]
    wn = (w / w.sum() * n)[:, None]
    theta1 = yhat_all.mean(0) + (wn * (y - yhat)).mean(0)
    g, gh = wn * (y - theta1), wn * (yhat - theta1)
    cov = ((g - g.mean(0)) * (gh - gh.mean(0))).sum() / n
    var = np.var(np.concatenate([gh, yhat_all - theta1]), axis=0, ddof=1).sum()
    if var <= 0:
        return 0.0
    return float(np.clip(cov / ((1.0 + n / big_n) * var), 0.0, 1.0))


def _strata(cell: Cell):
    """Per stratum: (N_h / N, the stratum's reader rows, the labelled positions in it)."""
    big_n = cell.stratum.size
    for h in range(len(cell.strata)):
        rows = np.flatnonzero(cell.stratum == h)
        lab = np.flatnonzero(cell.stratum[cell.labelled] == h)
        yield rows.size / big_n, rows, lab


def apply_off_simplex(shares: np.ndarray, rule: str, single_label: bool) -> np.ndarray:
    """Shares (..., K) under ``rule`` (OFF_SIMPLEX): ``clip`` clips to [0, 1] and, for a
    single-label attribute, renormalises each row to sum 1; ``raw`` returns them as they are."""
    if rule == "raw":
        return shares
    out = np.clip(shares, 0.0, 1.0)
    if single_label:
        total = out.sum(-1, keepdims=True)
        out = np.divide(out, total, out=np.full_like(out, np.nan), where=total > 0)
    return out


def cell_shares(
    cell: Cell,
    lam: str = "ppi",
    off_simplex: str = "clip",
    ci: float = 0.95,
    fixed_strata: bool = False,
) -> dict[str, np.ndarray]:
    """Corrected label shares of one cell: ppi_py's PPI estimate and CLT interval per
    stratum, combined with weights W_h = N_h / N (variance sum W_h^2 se_h^2, plus, unless
    ``fixed_strata``, sum W_h (theta_h - theta)^2 / N for the random stratum sizes). Keys:
    naive, corrected_raw, corrected, off_simplex, ci_low, ci_high (length K), lam (per
    stratum)."""
    _check_options(lam, off_simplex)
    z = float(stats.norm.ppf(0.5 + ci / 2.0))
    k = len(cell.labels)
    est, var, lams, parts = np.zeros(k), np.zeros(k), [], []
    for weight, rows, lab in _strata(cell):
        y, yhat = cell.human[lab], cell.reader[cell.labelled[lab]]
        yhat_all, w = cell.reader[rows], cell.weight[lab]
        lam_h = tuned_lambda(y, yhat, yhat_all, w) if lam == "tuned" else 1.0
        point = ppi_mean_pointestimate(y, yhat, yhat_all, lam=lam_h, w=w)
        lo, hi = ppi_mean_ci(y, yhat, yhat_all, alpha=1.0 - ci, lam=lam_h, w=w)
        parts.append((weight, np.reshape(point, k)))
        est += weight * np.reshape(point, k)
        var += weight**2 * (np.reshape(np.asarray(hi) - np.asarray(lo), k) / (2.0 * z)) ** 2
        lams.append(lam_h)
    if not fixed_strata:
        var += sum(w * (p - est) ** 2 for w, p in parts) / cell.stratum.size
    se = np.sqrt(var)
    lo, hi = est - z * se, est + z * se
    if off_simplex == "clip":
        lo, hi = np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
    return {
        "naive": cell.reader.mean(0),
        "corrected_raw": est,
        "corrected": apply_off_simplex(est, off_simplex, cell.single_label),
        "off_simplex": (est < 0.0) | (est > 1.0),
        "ci_low": lo,
        "ci_high": hi,
        "lam": np.array(lams),
    }


def corrected_shares(
    reader: pl.DataFrame,
    human: pl.DataFrame,
    keys: Sequence[str] = (),
    lam: str = "ppi",
    off_simplex: str = "clip",
    ci: float = 0.95,
    fixed_strata: bool = False,
) -> pl.DataFrame:
    """One row per (``keys``..., attribute, label): SHARE_COLUMNS (``lam`` the strata's lam
    weighted by N_h / N) for the reader and human-label tables (build_cells)."""
    rows = []
    for key, cell in build_cells(reader, human, keys).items():
        res = cell_shares(cell, lam, off_simplex, ci, fixed_strata)
        weights = np.array([w for w, _, _ in _strata(cell)])
        for j, label in enumerate(cell.labels):
            rows.append(
                {
                    **dict(zip([*keys, "attribute"], key, strict=True)),
                    "label": label,
                    "n_items": cell.stratum.size,
                    "n_human": cell.labelled.size,
                    **{c: float(res[c][j]) for c in ("naive", "corrected_raw", "corrected")},
                    "off_simplex": bool(res["off_simplex"][j]),
                    "ci_low": float(res["ci_low"][j]),
                    "ci_high": float(res["ci_high"][j]),
                    "lam": float(weights @ res["lam"]),
                }
            )
    schema = {**{k: pl.String for k in keys}, "attribute": pl.String, "label": pl.String}
    schema.update({"n_items": pl.Int64, "n_human": pl.Int64, "off_simplex": pl.Boolean})
    schema.update({c: pl.Float64 for c in SHARE_COLUMNS if c not in schema})
    return pl.DataFrame(rows, schema=schema).select([*keys, *SHARE_COLUMNS])


def bootstrap_shares(
    cell: Cell,
    replicates: int,
    rng: np.random.Generator,
    lam: str = "ppi",
    fixed_strata: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(naive, corrected) share replicates (replicates, K): per stratum the unlabelled and
    the labelled items (or, with ``cell.cluster``, whole clusters) resampled independently;
    the weights N_h / N drawn unless ``fixed_strata``; lam held at its point value."""
    k = len(cell.labels)
    naive, corr = np.zeros((replicates, k)), np.zeros((replicates, k))
    sizes = np.bincount(cell.stratum, minlength=len(cell.strata))
    weights = np.broadcast_to(sizes / sizes.sum(), (replicates, sizes.size))
    if not fixed_strata:
        weights = rng.multinomial(sizes.sum(), sizes / sizes.sum(), size=replicates) / sizes.sum()
    labelled_rows = np.zeros(cell.stratum.size, dtype=bool)
    labelled_rows[cell.labelled] = True
    for h, (_, rows, lab) in enumerate(_strata(cell)):
        y, yhat = cell.human[lab], cell.reader[cell.labelled[lab]]
        w = cell.weight[lab]
        weight = weights[:, h, None]
        lam_h = tuned_lambda(y, yhat, cell.reader[rows], w) if lam == "tuned" else 1.0
        if cell.cluster is not None:  # whole clusters: metrics.cluster_bootstrap
            at = np.searchsorted(rows, cell.labelled[lab])
            args = (cell.cluster[rows], cell.reader[rows], at, y, w, lam_h, replicates, rng)
            mean_all, rect = resample_stratum(*args)
        else:
            unl = cell.reader[rows[~labelled_rows[rows]]]
            total = np.zeros((replicates, k))
            if unl.shape[0]:
                patterns, counts = _patterns(unl)
                draws = rng.multinomial(unl.shape[0], counts / counts.sum(), size=replicates)
                total += draws @ patterns
            pick = rng.multinomial(lab.size, np.full(lab.size, 1.0 / lab.size), size=replicates)
            total += pick @ yhat
            mean_all = total / rows.size
            rect = ((pick * w) @ (y - lam_h * yhat)) / (pick @ w)[:, None]
        naive += weight * mean_all
        corr += weight * (lam_h * mean_all + rect)
    return naive, corr


def _patterns(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(rows, axis=0, return_counts=True), faster for 0/1 rows via binary codes."""
    k = rows.shape[1]
    if k > 52 or not np.isin(rows, (0.0, 1.0)).all():
        return np.unique(rows, axis=0, return_counts=True)
    codes = rows @ (2.0 ** np.arange(k - 1, -1, -1))
    _, first, counts = np.unique(codes, return_index=True, return_counts=True)
    return rows[first], counts


ShareFunctional = Callable[[list[np.ndarray]], np.ndarray]
"""A metric of the shares of one or more cells: a list of (B, K_c) arrays -> (B,)."""


def bi_functional(k: int | None = None, single_label_bi: float = 0.0) -> ShareFunctional:
    """ContextBias BI of the first cell's shares per row, as metrics.entropy.bias_intensity
    (K = ``k`` or the cell's labels), vectorised; NaN where a share is negative."""

    def bi(shares: list[np.ndarray]) -> np.ndarray:
        s = np.atleast_2d(np.asarray(shares[0], dtype=float))
        kk = s.shape[-1] if k is None else k
        if kk < (s > 0).sum(-1).max(initial=0):
            raise ValueError(f"K={kk} is smaller than the labels with a positive share")
        total = s.sum(-1)
        if kk == 1:
            out = np.full(total.shape, float(single_label_bi))
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                out = 1.0 - stats.entropy(np.clip(s, 0.0, None), axis=-1) / np.log(kk)
        out = np.where(total > 0, out, np.nan)
        return np.where((s < 0).any(-1), np.nan, out)

    return bi


def _interval(point, reps, interval: str, ci: float, bounds):
    """(estimate, low, high) of ``reps`` around ``point`` (INTERVALS)."""
    reps = reps[np.isfinite(reps)]
    if not np.isfinite(point) or reps.size < 2:
        return point, np.nan, np.nan
    if interval == "percentile":
        lo, hi = np.quantile(reps, [(1.0 - ci) / 2.0, (1.0 + ci) / 2.0])
        return point, float(lo), float(hi)
    if interval == "normal":
        return _normal_interval(point, reps.std(ddof=1), ci, bounds)
    # as stereolens.biasig.groups.bias_corrected (a benchmark module this floor cannot import)
    return _normal_interval(2.0 * point - reps.mean(), reps.std(ddof=1), ci, bounds)


def _sd(reps: np.ndarray) -> float:
    """The sd of the finite replicates (NaN below two)."""
    reps = reps[np.isfinite(reps)]
    return float(reps.std(ddof=1)) if reps.size >= 2 else float("nan")


def _normal_interval(est, se, ci: float, bounds) -> tuple[float, float, float]:
    """(est, est - z se, est + z se), clipped to ``bounds`` (None: unclipped)."""
    z = float(stats.norm.ppf(0.5 + ci / 2.0))
    out = np.array([est, est - z * se, est + z * se])
    if bounds is not None:
        out = np.clip(out, *bounds)
    return tuple(float(v) for v in out)


def corrected_metric(
    cells: Sequence[Cell], functional: ShareFunctional, **options
) -> dict[str, float | int | str]:
    """A metric (``functional``) of the label shares of ``cells``, naive and corrected, each
    with a bootstrap interval (NaN replicates left out); ``options`` as corrected_metrics'.
    Keys: naive, naive_low, naive_high, corrected, estimate_bc, ci_low, ci_high, interval,
    n_human, n_items, off_simplex, interval_reliable (every cell has MIN_HUMAN_RELIABLE
    human labels)."""
    return corrected_metrics(
        cells, lambda shares: np.asarray(functional(shares))[:, None], **options
    )[0]


def corrected_metrics(
    cells: Sequence[Cell],
    functional: Callable[[list[np.ndarray]], np.ndarray],
    *,
    replicates: int = 1000,
    seed: int = 0,
    lam: str = "ppi",
    off_simplex: str = "clip",
    ci: float = 0.95,
    interval: str = "bc_normal",
    bounds: tuple[float, float] | None = (0.0, 1.0),
    fixed_strata: bool = False,
    column_cells: Sequence[Sequence[int]] | None = None,
    joint: Sequence[Sequence[int]] | None = None,
    with_se: bool = False,
    column_interval: Sequence[str] | None = None,
) -> list[dict[str, float | int | str]]:
    """corrected_metric of several metrics of the same ``cells`` from one bootstrap:
    ``functional`` maps the (B, K_c) share arrays to (B, L), one dict per column.
    ``column_cells``: per column the cells it depends on (default all); ``joint``: groups of
    cells read from the same items, resampled together (metrics.joint_bootstrap);
    ``with_se``: add naive_se and corrected_se; ``column_interval``: per column INTERVALS."""
    for kind in {interval, *(column_interval or ())}:
        _check_options(lam, off_simplex, kind)
    rng = np.random.default_rng(seed)
    points = [cell_shares(c, lam, off_simplex, ci, fixed_strata) for c in cells]
    if joint is None:
        boots = [bootstrap_shares(c, replicates, rng, lam, fixed_strata) for c in cells]
    else:
        lams = [p["lam"] for p in points]
        boots = bootstrap_joint(cells, joint, replicates, rng, lams, fixed_strata)
    naive_pt = np.asarray(functional([p["naive"][None] for p in points]), dtype=float)[0]
    corr_pt = np.asarray(functional([p["corrected"][None] for p in points]), dtype=float)[0]
    naive_reps = np.asarray(functional([b[0] for b in boots]), dtype=float)
    pairs = zip(boots, cells, strict=True)
    kept = [apply_off_simplex(b[1], off_simplex, c.single_label) for b, c in pairs]
    corr_reps = np.asarray(functional(kept), dtype=float)
    every = range(len(cells))
    out = []
    for j in range(naive_pt.size):
        use = every if column_cells is None else column_cells[j]
        kind = interval if column_interval is None else column_interval[j]
        common = {
            "interval": kind,
            "n_human": int(sum(cells[i].labelled.size for i in use)),
            "n_items": int(sum(cells[i].stratum.size for i in use)),
            "off_simplex": bool(any(points[i]["off_simplex"].any() for i in use)),
            "interval_reliable": bool(
                all(cells[i].labelled.size >= MIN_HUMAN_RELIABLE for i in use)
            ),
        }
        _, n_lo, n_hi = _interval(float(naive_pt[j]), naive_reps[:, j], kind, ci, bounds)
        est, lo, hi = _interval(float(corr_pt[j]), corr_reps[:, j], kind, ci, bounds)
        if with_se:
            common["naive_se"] = _sd(naive_reps[:, j])
            common["corrected_se"] = _sd(corr_reps[:, j])
        row = {"naive": float(naive_pt[j]), "naive_low": n_lo, "naive_high": n_hi}
        row |= {"corrected": float(corr_pt[j]), "estimate_bc": est, "ci_low": lo, "ci_high": hi}
        out.append({**row, **common})
    return out


def human_labels_needed(
    disagreement: float,
    target_width: float,
    n_items: int,
    share: float = 0.5,
    mean_difference: float = 0.0,
    ci: float = 0.95,
) -> int | None:
    """Human labels (a simple random sample of ``n_items``) for a corrected share's interval
    of ``target_width``, from PPI's variance with lam = 1: share (1 - share) / N + Var(d) / n,
    Var(d) = ``disagreement`` - ``mean_difference``^2; at least MIN_LABELLED; None where even
    n = N cannot reach the width."""
    z = float(stats.norm.ppf(0.5 + ci / 2.0))
    room = (target_width / (2.0 * z)) ** 2 - share * (1.0 - share) / n_items
    if room <= 0:
        return None
    var_d = max(disagreement - mean_difference**2, 0.0)
    n = max(int(np.ceil(var_d / room)), MIN_LABELLED)
    return n if n <= n_items else None
