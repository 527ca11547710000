"""The ContextBias pooled-BI summary rows of bench/cover/reader.py (issue 21): the cohort
mean (dimension "*") and the overall value (cohort "*") of pooled BI corrected for the
extractor's errors (contextbias.corrected's ``bi_pooled`` summary rows), against a known
truth; the dimensions of a role are read from the same images, so they are resampled with
one draw (reader_correction.corrected_metrics ``joint``).

World: one generator, one condition, two roles of N images each (reader.SCALES), a simple
random sample of n of each role's images labelled by humans (the truth) on every dimension.
An image's truth: a woman with probability 0.3 (role 1) or 0.2 (role 2); long hair with
probability 0.9 for a woman and 0.1 for a man; a bag 0.8 and 0.05: the three dimensions
are correlated through the person. Cohort people = gender_presentation and hair, objects =
bag. The reader errs on every dimension as the issue's reader (10% of the first label read
as the second, 2% the other way), independently per dimension. Truth (the pooled shares
0.25, 0.30, 0.2375, K = 2): pooled BI 0.188722, 0.118709, 0.209142; people 0.153715;
overall (the mean of the cohort means) 0.181429. Each dataset's rows come from
contextbias.corrected's own _pooled_rows and _summary_table on the six cells (as
corrected_table runs them); the "independent" row is the same functional with every cell
drawn on its own (the draw corrected_metrics makes without ``joint``), the interval the
joint draw replaces. The "mean" rows (:func:`simulate_mean`): the ``bi_pooled_mean`` rows,
the mean over two generators of this world (the same truth), g1 read by the issue's
reader and g2 by a 2% / 2% one (READERS).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import polars as pl

WOMEN = (0.3, 0.2)
"""The two roles' true shares of women."""
GIVEN = {"hair": (0.9, 0.1), "bag": (0.8, 0.05)}
"""P(the first label | woman), P(the first label | man) of the other two dimensions."""
DIMS = (("objects", "bag"), ("people", "gender_presentation"), ("people", "hair"))


def _bi(p: float) -> float:
    return float(1.0 + (p * np.log(p) + (1 - p) * np.log(1 - p)) / np.log(2.0))


def truth_at(women: float) -> dict[str, float]:
    """BI per dimension, the people cohort mean and the overall value of images with this
    share of women (this world's and bench/cover/_contextbias_role.py's truth)."""
    share = {"gender_presentation": women}
    for dim, (a, b) in GIVEN.items():
        share[dim] = a * women + b * (1 - women)
    bi = {d: _bi(s) for d, s in share.items()}
    people = (bi["gender_presentation"] + bi["hair"]) / 2.0
    return {**bi, "people": people, "*": (people + bi["bag"]) / 2.0}


def truth() -> dict[str, float]:
    """The population's pooled BI per dimension, cohort mean and overall value."""
    return truth_at(float(np.mean(WOMEN)))


def _role_cells(rng, items: int, human: int, women: float, role: str, errors=(0.10, 0.02)):
    """The three dimensions' cells of one role: one set of images, one human sample."""
    from stereolens.metrics.reader_correction import Cell

    woman = rng.random(items) < women
    first = {"gender_presentation": woman}
    for dim, (a, b) in GIVEN.items():
        first[dim] = rng.random(items) < np.where(woman, a, b)
    labelled = np.sort(rng.choice(items, human, replace=False))
    ids = tuple(f"{role}{j}" for j in range(items))
    onehot = np.eye(2)
    cells = {}
    for cohort, dim in DIMS:
        u = rng.random(items)
        read = np.where(first[dim], u >= errors[0], u < errors[1])  # the by default
        cells[("g", role, "CF", cohort, dim)] = Cell(
            labels=("a", "b"), strata=("s",), stratum=np.zeros(items, dtype=np.int64),
            reader=onehot[(~read).astype(int)], labelled=labelled,
            human=onehot[(~first[dim][labelled]).astype(int)],
            weight=np.full(human, items / human), items=ids,
        )  # fmt: skip
    return cells


def _datasets(scale: str, n: int, size: tuple, stream: int, readers: tuple, role_level=False):
    """``n`` datasets (their stream [21, ``stream``, n, len(scale)]), each as (the pooled
    rows of its cells, or with ``role_level`` its role-level ``bi`` rows, the bootstrap
    options): per reader (model, role prefix, errors) the WOMEN roles' cells of ``size`` =
    (items, human, replicates) per role."""
    from stereolens.contextbias import corrected as cc

    items, human, replicates = size
    rng = np.random.default_rng([21, stream, n, len(scale)])
    for _ in range(n):
        seed = int(rng.integers(2**31))
        cells = {}
        for model, prefix, errors in readers:
            for r, women in enumerate(WOMEN):
                part = _role_cells(rng, items, human, women, f"{prefix}r{r}", errors)
                cells.update({(model, *key[1:]): c for key, c in part.items()})
        rows = (cc._bi_rows if role_level else cc._pooled_rows)(cells, {}, 0.0)
        yield rows, {"replicates": replicates, "seed": seed}


@lru_cache(maxsize=4)
def simulate(scale: str, n: int, size: tuple) -> dict[str, tuple]:
    """Per dataset (estimate, low, high) of every row key; ``size`` = (items, human,
    replicates) per role."""
    from stereolens.contextbias import corrected as cc

    out: dict[str, list] = {}
    for rows, opts in _datasets(scale, n, size, 7, (("g", "", (0.10, 0.02)),)):
        table = cc._summary_table(rows, "cohort", opts).filter(pl.col("metric") == "bi_pooled")
        # the same functional, every cell drawn on its own
        six = [cell for row in rows for cell in row[1]]
        spans = [slice(2 * d, 2 * d + 2) for d in range(len(rows))]
        collect(out, table, six, [row[2] for row in rows], spans, opts)
    return _arrays(out)


def collect(out: dict, table, cells: list, fns: list, spans: list, opts: dict) -> None:
    """Add one dataset's "corrected" and "naive" people and * rows of ``table`` (its summary
    rows by cohort) to ``out``, and the "independent" ones: the same functional of ``fns``
    (on ``cells`` by ``spans``) with every cell drawn on its own (corrected_metrics without
    ``joint``). Serves this world and bench/cover/_contextbias_role.py's."""
    from stereolens.contextbias import corrected as cc
    from stereolens.metrics.reader_correction import corrected_metrics

    got = {r["cohort"]: r for r in table.iter_rows(named=True)}
    for key in ("people", "*"):
        r = got[key]
        out.setdefault(f"corrected {key}", []).append((r["estimate_bc"], r["ci_low"], r["ci_high"]))
        out.setdefault(f"naive {key}", []).append((r["naive"], r["naive_low"], r["naive_high"]))
    fn = cc.summary_functional(fns, spans, [[0], [1, 2]], "cohort")
    res = corrected_metrics(cells, fn, bounds=(0.0, 1.0), **opts)
    for key, r in zip(("people", "*"), res[1:], strict=True):  # res[0]: objects
        out.setdefault(f"independent {key}", []).append(
            (r["estimate_bc"], r["ci_low"], r["ci_high"])
        )


def _arrays(out: dict[str, list]) -> dict[str, tuple]:
    """Per row key, the datasets' (estimate, low, high) as three float arrays."""
    return {k: tuple(np.array(v, dtype=float).T) for k, v in out.items()}


READERS = {"g1": (0.10, 0.02), "g2": (0.02, 0.02)}
"""The mean-over-generators world's readers: (first label read as the second, the second as
the first) per generator, on every dimension (g1 the issue's reader)."""


@lru_cache(maxsize=4)
def simulate_mean(scale: str, n: int, size: tuple) -> dict[str, tuple]:
    """The ``bi_pooled_mean`` rows (model "*": the mean over generators) of two generators
    with the same truth (the world above) read by READERS; per dataset (estimate, low,
    high) of "mean people" and "mean *"."""
    from stereolens.contextbias import corrected as cc

    out: dict[str, list] = {}
    readers = tuple((model, model, errors) for model, errors in READERS.items())
    for rows, opts in _datasets(scale, n, size, 8, readers):
        table = cc._summary_table(rows, "cohort", opts).filter(
            (pl.col("metric") == "bi_pooled_mean") & (pl.col("dimension") == "*")
        )
        for r in table.iter_rows(named=True):
            if r["cohort"] in ("people", "*"):
                out.setdefault(f"mean {r['cohort']}", []).append(
                    (r["estimate_bc"], r["ci_low"], r["ci_high"])
                )
    return _arrays(out)


REFERENCE = {
    "independent": "independent draws: the interval the joint draw replaces",
    "naive": "naive: the reader's labels taken as the truth",
}
"""The reference rows' reason (bench/cover Row.reference) by kind."""


def row_table(intervals: dict[str, str]) -> dict[str, tuple]:
    """A world's ROWS from its interval per kind ("corrected", "independent", "mean",
    "naive"; in order): "<kind> *" and "<kind> people" -> (interval, at paper scale only
    (naive), reference). Serves this world and bench/cover/_contextbias_role.py's."""
    return {
        f"{kind} {cohort}": (interval, kind == "naive", REFERENCE.get(kind, ""))
        for kind, interval in intervals.items()
        for cohort in ("*", "people")
    }


ROWS = row_table({
    "corrected": "PPI per role, a role's dimensions drawn jointly, bc-normal",
    "independent": "PPI per role, every cell drawn on its own, bc-normal",
    "mean": "mean over 2 generators, PPI per role, dimensions jointly, bc-normal",
    "naive": "naive: reader's labels, a role's dimensions jointly, bc-normal",
})  # fmt: skip
"""key: (interval, at paper scale only, reference)."""


def rows(scale: str, scales: dict, human_of: dict, minimum: int) -> list:
    """The rows of ``scale`` (the naive ones at "paper" only); each row's n in ``human_of``."""
    return summary_rows(
        scale, scales, human_of, minimum, ROWS, truth(), "pooled",
        lambda key: "2 generators x 2 roles" if key.startswith("mean") else "2 roles",
        " per role", lambda key: simulate_mean if key.startswith("mean") else simulate,
    )  # fmt: skip


def summary_rows(scale, scales, human_of, minimum, table, values, kind, world, per, simulate_of):
    """The Rows of ``table`` (key: (interval, at paper scale only, reference)) at ``scale``
    (the naive ones at "paper" only), each row's n in ``human_of``: "contextbias ``kind`` bi"
    rows of ``world(key)`` x 3 dimensions (n ``per``), their truth ``values``, drawn by
    ``simulate_of(key)``. Serves this world and bench/cover/_contextbias_role.py's."""
    from cover import Row

    if scale not in scales:
        return []
    size = scales[scale]
    out = []
    for key, (interval, paper_only, reference) in table.items():
        if paper_only and scale != "paper":
            continue
        what = "overall (cohort *)" if key.endswith("*") else "cohort people (dimension *)"
        name = (
            f"reader {scale}: contextbias {kind} bi {key.split()[0]} {what}, {world(key)} x 3 "
            f"dimensions, N {size['items']:,}, n {size['human']:,}{per}, "
            f"truth {values[key.split()[1]]:.4g}"
        )
        human_of[name] = size["human"]

        def draw(rng, n, key=key):
            args = (size["items"], size["human"], size["replicates"])
            return simulate_of(key)(scale, n, args)[key]

        below = size["human"] < minimum
        out.append(
            Row(name, "reader correction", interval, values[key.split()[1]], draw,
                below_minimum=f"n {size['human']} < MIN_HUMAN_RELIABLE {minimum}" if below else "",
                reference=reference)
        )  # fmt: skip
    return out
