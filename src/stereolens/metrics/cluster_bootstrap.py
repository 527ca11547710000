"""The reader correction's bootstrap over clusters: with a ``cluster`` column in the reader
table, a stratum's clusters (e.g. an LVLM term round) are resampled with all their items
(docs/statistics.md, "Correcting for the reader's errors")."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

CLUSTER = "cluster"
"""The optional column of the reader (and human-label) table: the item's cluster id (any
value; an item has one). Clusters are resampled within strata."""


def item_clusters(
    reader: pl.DataFrame, human: pl.DataFrame, ids: Sequence[str]
) -> np.ndarray | None:
    """The cluster code of each of ``ids`` from the reader table's CLUSTER column (None
    without one); a ValueError where an item has two, in either table."""
    if CLUSTER not in reader.columns:
        return None
    pairs = reader.select("item_id", pl.col(CLUSTER).cast(pl.String)).unique()
    if pairs[CLUSTER].null_count():
        raise ValueError(f"reader table: column {CLUSTER} has nulls; give every item its cluster")
    two = pairs.filter(pl.col("item_id").is_duplicated())
    if two.height:
        raise ValueError(
            f"reader table: item {two['item_id'][0]!r} has two {CLUSTER}s; an item has one"
        )
    of = dict(pairs.iter_rows())
    if CLUSTER in human.columns:
        for item, c in human.select("item_id", pl.col(CLUSTER).cast(pl.String)).iter_rows():
            if item in of and c != of[item]:
                raise ValueError(
                    f"human-label table: item {item!r} has {CLUSTER} {c!r} but "
                    f"{of[item]!r} in the reader table"
                )
    names = sorted(set(of[i] for i in ids))
    code = {c: k for k, c in enumerate(names)}
    return np.array([code[of[i]] for i in ids], dtype=np.int64)


def _cluster_sums(cluster, reader, labelled, human, weight, lam):
    """Per cluster (codes 0..m-1): items, reader rows summed, weighted rectifier summed,
    weights summed; and the two parts (clusters holding a labelled item, the others)."""
    names, code = np.unique(cluster, return_inverse=True)
    m, k = names.size, reader.shape[1]
    size = np.bincount(code, minlength=m).astype(float)
    reader_sum = np.zeros((m, k))
    np.add.at(reader_sum, code, reader)
    lab_code = code[labelled]
    rect_sum = np.zeros((m, k))
    np.add.at(rect_sum, lab_code, weight[:, None] * (human - lam * reader[labelled]))
    w_sum = np.bincount(lab_code, weights=weight, minlength=m)
    parts = [p for p in (np.unique(lab_code), np.setdiff1d(np.arange(m), lab_code)) if p.size]
    return m, size, reader_sum, rect_sum, w_sum, parts


def _counts(size: int, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """(replicates, size) multiplicities of ``size`` draws with replacement of ``size`` clusters."""
    pick = rng.integers(size, size=(replicates, size))
    pick += np.arange(replicates)[:, None] * size
    return np.bincount(pick.ravel(), minlength=replicates * size).reshape(replicates, size)


def resample_stratum(
    cluster: np.ndarray,
    reader: np.ndarray,
    labelled: np.ndarray,
    human: np.ndarray,
    weight: np.ndarray,
    lam: float,
    replicates: int,
    rng: np.random.Generator,
    inner: int | None = None,
) -> tuple[np.ndarray, ...]:
    """(the reader's mean share, the rectifier) per replicate, (replicates, K), of one
    stratum, its clusters resampled with all their items (those holding a human label apart
    from the others, so every replicate has labels). ``labelled``: the human-labelled items'
    positions. With ``inner``: also both per second-level replicate (replicates, inner, K)."""
    m, size, reader_sum, rect_sum, w_sum, parts = _cluster_sums(
        cluster, reader, labelled, human, weight, lam
    )
    draws = [np.zeros((replicates, m))]
    if inner is not None:
        draws.append(np.zeros((replicates, inner, m)))
    for part in parts:
        outer = _counts(part.size, replicates, rng)
        draws[0][:, part] = outer
        if inner is not None:
            draws[1][:, :, part] = np.moveaxis(
                rng.multinomial(part.size, outer / part.size, size=(inner, replicates)), 0, 1
            )
    out = []
    for d in draws:
        out += [(d @ reader_sum) / (d @ size)[..., None], (d @ rect_sum) / (d @ w_sum)[..., None]]
    return tuple(out)


def resample_rows(counts: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    """Resamples of a multiset: ``counts`` (..., P) multiplicities of P distinct rows ->
    (..., size, P), each a multinomial of the same total at the counts' shares."""
    total = counts.sum(-1, keepdims=True)
    shares = counts / np.where(total > 0, total, 1)
    drawn = rng.multinomial(total[..., 0], shares, size=(size, *counts.shape[:-1]))
    return np.moveaxis(drawn, 0, -2)
