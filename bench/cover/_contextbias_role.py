"""The ContextBias role-level BI summary rows of bench/cover/reader.py (issue 21): a role's
cohort mean (dimension "*", the mean of its BI over the cohort's dimensions) and its overall
value (cohort "*", the mean of the cohort means) of role-level BI corrected for the
extractor's errors (contextbias.corrected's ``bi`` summary rows), against a known truth; the
role's dimensions are read from the same images, so they are resampled with one draw
(reader_correction.corrected_metrics ``joint``).

World: bench/cover/_contextbias_pooled.py's (the pooled rows'), its first role alone: N
images, 30% women, long hair 0.9 / 0.1 and a bag 0.8 / 0.05 for a woman / a man (the three
dimensions correlated through the person), the issue's reader (10% / 2%) on each dimension
independently, a simple random sample of n images labelled by humans on every dimension.
Truth (shares 0.3, 0.34, 0.275, K = 2): BI gender 0.118709, hair 0.075181, bag 0.151452;
people 0.096945; overall 0.124199. Each dataset's rows come from contextbias.corrected's own
_role_summary_table on the role's three cells (as corrected_table runs it); the
"independent" rows are the same functional with every cell drawn on its own (the draw
corrected_metrics makes without ``joint``), the interval the joint draw replaces.
The "role-mean" rows (:func:`simulate_mean`): the ``bi_role`` and ``bi_role_mm`` rows (the
mean over roles, bi.parquet's "role" and "role_miller_madow") of the pooled world's two
roles (WOMEN), naive and corrected, and the "independent" reference (every cell drawn on its
own) of ``bi_role``; truth the mean of the roles' BI (Miller-Madow targets it
too): gender 0.198391, hair 0.124217, bag 0.214762; people 0.161304, overall 0.188033.
The "generators" rows (:func:`simulate_generators`): their model "*" rows (``bi_role_mean``,
``bi_role_mm_mean``), the mean over two generators of that world (the same truth), g1 read
by the issue's reader and g2 by a 2% / 2% one (READERS).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cover._contextbias_pooled import (
    READERS,
    REFERENCE,
    WOMEN,
    _arrays,
    _datasets,
    _role_cells,
    collect,
    row_table,
    summary_rows,
    truth_at,
)

SHARE = WOMEN[0]
"""The role's true share of women (the pooled world's first role)."""


def truth() -> dict[str, float]:
    """The role's BI per dimension, its people cohort mean and overall value."""
    return truth_at(SHARE)


@lru_cache(maxsize=4)
def simulate(scale: str, n: int, size: tuple) -> dict[str, tuple]:
    """Per dataset (estimate, low, high) of every row key; ``size`` = (items, human,
    replicates)."""
    from stereolens.contextbias import corrected as cc
    from stereolens.metrics import reader_correction as rc

    items, human, replicates = size
    rng = np.random.default_rng([21, 9, n, len(scale)])
    out: dict[str, list] = {}
    for _ in range(n):
        seed = int(rng.integers(2**31))
        cells = _role_cells(rng, items, human, SHARE, "r0")
        fns = [rc.bi_functional(k=2, single_label_bi=0.0) for _ in cells]
        rows = [
            (dict(zip(("model", "role", "condition", "cohort", "dimension"), key, strict=True)),
             [cell], fn, (0.0, 1.0))
            for (key, cell), fn in zip(sorted(cells.items()), fns, strict=True)
        ]  # fmt: skip
        opts = {"replicates": replicates, "seed": seed}
        table = cc._role_summary_table(rows, "cohort", opts)
        # the same functional, every cell drawn on its own (sorted: bag, gender, hair)
        three = [row[1][0] for row in rows]
        collect(out, table, three, fns, [slice(d, d + 1) for d in range(3)], opts)
    return _arrays(out)


ROWS = row_table({
    "corrected": "PPI, the role's dimensions drawn jointly, bc-normal",
    "independent": "PPI, every cell drawn on its own, bc-normal",
    "naive": "naive: reader's labels, the role's dimensions jointly, bc-normal",
})  # fmt: skip
"""key: (interval, at paper scale only, reference)."""


def truth_mean() -> dict[str, float]:
    """The mean over the two roles (WOMEN) of their BI per dimension, people cohort mean
    and overall value."""
    each = [truth_at(w) for w in WOMEN]
    return {k: float(np.mean([t[k] for t in each])) for k in each[0]}


@lru_cache(maxsize=4)
def simulate_mean(scale: str, n: int, size: tuple) -> dict[str, tuple]:
    """Per dataset (estimate, low, high) of the ``bi_role`` ("corrected", "naive") and
    ``bi_role_mm`` ("corrected-mm", "naive-mm") people and * rows of the two roles' six
    cells, through contextbias.corrected's own _bi_rows and corrected_means.role_mean_table;
    "independent": the ``bi_role`` functional with every cell drawn on its own."""
    import polars as pl

    from stereolens.contextbias import corrected as cc
    from stereolens.contextbias.corrected_functionals import role_mean_functional
    from stereolens.contextbias.corrected_means import role_mean_table

    items, human, replicates = size
    rng = np.random.default_rng([21, 10, n, len(scale)])
    out: dict[str, list] = {}
    for _ in range(n):
        seed = int(rng.integers(2**31))
        cells = {}
        for r, women in enumerate(WOMEN):
            cells.update(_role_cells(rng, items, human, women, f"r{r}"))
        rows = cc._bi_rows(cells, {}, 0.0)
        opts = {"replicates": replicates, "seed": seed}
        table = role_mean_table(rows, "cohort", 0.0, opts).filter(pl.col("dimension") == "*")
        # the six cells by dimension (bag, gender, hair), each dimension's two roles in order
        by_dim = sorted(rows, key=lambda row: (row[0]["dimension"], row[0]["role"]))
        six = [row[1][0] for row in by_dim]
        fns = [role_mean_functional([row[2] for row in by_dim[d : d + 2]]) for d in (0, 2, 4)]
        spans = [slice(d, d + 2) for d in (0, 2, 4)]
        collect(out, table.filter(pl.col("metric") == "bi_role"), six, fns, spans, opts)
        for r in table.filter(pl.col("metric") == "bi_role_mm").iter_rows(named=True):
            if r["cohort"] in ("people", "*"):
                out.setdefault(f"corrected-mm {r['cohort']}", []).append(
                    (r["estimate_bc"], r["ci_low"], r["ci_high"])
                )
                out.setdefault(f"naive-mm {r['cohort']}", []).append(
                    (r["naive"], r["naive_low"], r["naive_high"])
                )
    return _arrays(out)


MEAN_ROWS = {
    f"{kind} {cohort}": (interval, False, REFERENCE.get(kind.split("-")[0], ""))
    for kind, interval in (
        ("corrected", "PPI, mean over roles, a role's dimensions drawn jointly, bc-normal"),
        ("corrected-mm", "PPI, Miller-Madow, mean over roles, dimensions jointly, normal"),
        ("independent", "PPI, mean over roles, every cell drawn on its own, bc-normal"),
        ("naive", "naive: reader's labels, mean over roles, dimensions jointly, bc-normal"),
        ("naive-mm", "naive: reader's labels, Miller-Madow, mean over roles, normal"),
    )
    for cohort in ("*", "people")
}
"""The role-mean rows, naive at every scale: key: (interval, at paper scale only, reference)."""


@lru_cache(maxsize=4)
def simulate_generators(scale: str, n: int, size: tuple) -> dict[str, tuple]:
    """Per dataset (estimate, low, high) of the ``bi_role_mean`` ("generators") and
    ``bi_role_mm_mean`` ("generators-mm") people and * rows: the mean over two generators
    of this world (the same truth), read by READERS, through contextbias.corrected's own
    _bi_rows and corrected_means.generator_means."""
    import polars as pl

    from stereolens.contextbias.corrected_means import GENERATOR_MEANS, generator_means

    kind = dict(zip(GENERATOR_MEANS.values(), ("generators", "generators-mm"), strict=True))
    out: dict[str, list] = {}
    readers = tuple((model, model, errors) for model, errors in READERS.items())
    for rows, opts in _datasets(scale, n, size, 11, readers, role_level=True):
        table = generator_means(rows, "cohort", 0.0, opts).filter(pl.col("dimension") == "*")
        for r in table.iter_rows(named=True):
            if r["cohort"] in ("people", "*"):
                out.setdefault(f"{kind[r['metric']]} {r['cohort']}", []).append(
                    (r["estimate_bc"], r["ci_low"], r["ci_high"])
                )
    return _arrays(out)


GENERATOR_ROWS = {
    f"{kind} {cohort}": (interval, False, "")
    for kind, interval in (
        ("generators", "PPI, mean over roles, then over 2 generators, dimensions jointly, "
         "bc-normal"),
        ("generators-mm", "PPI, Miller-Madow, mean over roles, then over 2 generators, "
         "dimensions jointly, normal"),
    )
    for cohort in ("*", "people")
}  # fmt: skip
"""The role means' model "*" rows (bi_role_mean, bi_role_mm_mean): key: (interval, at paper
scale only, reference)."""


def rows(scale: str, scales: dict, human_of: dict, minimum: int) -> list:
    """The rows of ``scale`` (the one-role naive ones at "paper" only); each row's n in
    ``human_of``."""
    one = summary_rows(
        scale, scales, human_of, minimum, ROWS, truth(), "role", lambda key: "1 role", "",
        lambda key: simulate,
    )  # fmt: skip
    mean = summary_rows(
        scale, scales, human_of, minimum, MEAN_ROWS, truth_mean(), "role-mean",
        lambda key: "2 roles", " per role", lambda key: simulate_mean,
    )  # fmt: skip
    return one + mean + summary_rows(
        scale, scales, human_of, minimum, GENERATOR_ROWS, truth_mean(), "role-mean",
        lambda key: "2 generators x 2 roles", " per role", lambda key: simulate_generators,
    )  # fmt: skip
