"""The reader correction's joint bootstrap: cells read from the same items (ContextBias's
dimensions of one role x condition) resampled with one draw of those items, so a metric
averaging them carries their correlation (docs/statistics.md)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stereolens.metrics.cluster_bootstrap import resample_rows


def groups_of(n_cells: int, joint: Sequence[Sequence[int]]) -> list[list[int]]:
    """``joint`` (lists of cell indices read from the same items) completed to a partition
    of range(n_cells): every cell in at most one group, the others each a group of one."""
    seen: set[int] = set()
    out = []
    for group in joint:
        group = [int(i) for i in group]
        if not group or seen & set(group) or len(set(group)) < len(group):
            raise ValueError(f"joint groups must be disjoint and non-empty; got {list(joint)}")
        if min(group) < 0 or max(group) >= n_cells:
            raise ValueError(f"joint group {group}: a cell index outside 0..{n_cells - 1}")
        seen |= set(group)
        out.append(group)
    return out + [[i] for i in range(n_cells) if i not in seen]


def _check_group(cells: Sequence, group: list[int]) -> None:
    """The cells of one group read the same items (ids, order, strata) and have no clusters."""
    first = cells[group[0]]
    if len(group) > 1 and len(first.items) != first.stratum.size:
        raise ValueError(
            f"joint cells {group}: cell {group[0]} has no item ids (Cell.items, as "
            "build_cells sets them); a joint draw needs them to match the items"
        )
    for i in group:
        cell = cells[i]
        if cell.cluster is not None:
            raise ValueError("joint resampling of cells with clusters is not supported")
        same = (
            cell.strata == first.strata
            and np.array_equal(cell.stratum, first.stratum)
            and tuple(cell.items) == tuple(first.items)
        )
        if not same:
            raise ValueError(
                f"joint cells {group}: cell {i} does not read the same items (ids, order, "
                f"strata) as cell {group[0]}; only readings of the same items share a draw"
            )


def _unique_rows(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows, their counts): items with the same features are exchangeable."""
    if features.shape[1] == 0:
        return features[:1], np.array([features.shape[0]])
    return np.unique(features, axis=0, return_counts=True)


def bootstrap_joint(
    cells: Sequence,
    joint: Sequence[Sequence[int]],
    replicates: int,
    rng: np.random.Generator,
    lams: Sequence[Sequence[float]],
    fixed_strata: bool = False,
    inner: int = 0,
) -> list[tuple[np.ndarray, ...]]:
    """(naive, corrected) share replicates (replicates, K_c) of every cell, as
    reader_correction.bootstrap_shares, but with one draw of items per group of ``joint``:
    per stratum, items classed by the cells in which they carry a human label, each class
    resampled at its own size. ``lams``: per cell, each stratum's lam. ``inner`` > 0: also
    the second level of metrics.reader_double, (R, inner, K_c) naive and corrected."""

    out: list = [None] * len(cells)
    levels = [(replicates,)] + ([(replicates, inner)] if inner else [])
    for group in groups_of(len(cells), joint):
        _check_group(cells, group)
        first = cells[group[0]]
        sizes = np.bincount(first.stratum, minlength=len(first.strata))
        big_n = sizes.sum()
        weights = [np.broadcast_to(sizes / big_n, (*shape, sizes.size)) for shape in levels]
        if not fixed_strata:
            drawn = rng.multinomial(big_n, sizes / big_n, size=replicates)
            weights[0] = drawn / big_n
            if inner:
                weights[1] = resample_rows(drawn, rng, inner) / big_n
        sums = [
            ({i: np.zeros((*shape, len(cells[i].labels))) for i in group},
             {i: np.zeros((*shape, len(cells[i].labels))) for i in group})
            for shape in levels
        ]  # fmt: skip
        for h in range(sizes.size):
            rows = np.flatnonzero(first.stratum == h)
            _stratum(cells, group, rows, h, replicates, rng, lams, weights, sums, inner)
        for i in group:
            out[i] = tuple(part[i] for level in sums for part in level)
    return out


def _stratum(cells, group, rows, h, replicates, rng, lams, weights, sums, inner) -> None:
    """One stratum of one group: the classes' draws (and with ``inner`` their second-level
    draws), every cell's mean and rectifier at each level of ``sums``."""

    position = {}  # cell -> (labelled row index -> its index among cell.labelled)
    member = np.zeros((rows.size, len(group)), dtype=bool)
    for g, i in enumerate(group):
        lab = np.flatnonzero(cells[i].stratum[cells[i].labelled] == h)
        at = np.searchsorted(rows, cells[i].labelled[lab])
        member[at, g] = True
        position[i] = dict(zip(at.tolist(), lab.tolist(), strict=True))
    shapes = [(replicates,)] + ([(replicates, inner)] if inner else [])
    total = [{i: np.zeros((*sh, len(cells[i].labels))) for i in group} for sh in shapes]
    rect = [{i: np.zeros_like(t[i]) for i in group} for t in total]
    picked = [{i: np.zeros(sh) for i in group} for sh in shapes]
    classes, class_of = np.unique(member, axis=0, return_inverse=True)
    for c, pattern in enumerate(classes):
        at = np.flatnonzero(class_of.reshape(-1) == c)
        blocks, spans = [], []
        for g, i in enumerate(group):
            cell, start = cells[i], sum(b.shape[1] for b in blocks)
            blocks.append(cell.reader[rows[at]])
            if pattern[g]:
                lab = np.array([position[i][a] for a in at.tolist()], dtype=np.int64)
                rectifier = cell.human[lab] - float(lams[i][h]) * cell.reader[cell.labelled[lab]]
                blocks += [cell.weight[lab, None], rectifier]
            spans.append(start)
        distinct, counts = _unique_rows(np.hstack(blocks))
        draws = rng.multinomial(at.size, counts / at.size, size=replicates)
        every = [draws] + ([resample_rows(draws, rng, inner)] if inner else [])
        for level, d in enumerate(every):
            d = d.astype(float)
            for g, i in enumerate(group):
                k, start = len(cells[i].labels), spans[g]
                total[level][i] += d @ distinct[:, start : start + k]
                if pattern[g]:
                    w = distinct[:, start + k]
                    picked[level][i] += d @ w
                    rect[level][i] += (d * w) @ distinct[:, start + k + 1 : start + 2 * k + 1]
    for level, (naive, corr) in enumerate(sums):
        weight = weights[level][..., h, None]
        for i in group:
            lam = float(lams[i][h])
            mean_all = total[level][i] / rows.size
            naive[i] += weight * mean_all
            corr[i] += weight * (lam * mean_all + rect[level][i] / picked[level][i][..., None])
