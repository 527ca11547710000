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
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cover._contextbias_pooled import (
    WOMEN,
    _arrays,
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


def rows(scale: str, scales: dict, human_of: dict, minimum: int) -> list:
    """The rows of ``scale`` (the naive ones at "paper" only); each row's n in ``human_of``."""
    return summary_rows(
        scale, scales, human_of, minimum, ROWS, truth(), "role", lambda key: "1 role", "",
        lambda key: simulate,
    )  # fmt: skip
