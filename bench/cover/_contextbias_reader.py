"""The ContextBias cross-generator CCS rows of bench/cover/reader.py (issue 21): the mean
over generators of CCS (paper Eq. 5, contextbias.ccs.ccs_mean) corrected for the
extractor's errors (contextbias.corrected's ``ccs_mean`` rows), against a known truth.

World: two generators, each one role's three condition cells (N items and n human labels
per condition, reader.SCALES), true shares of women CCS_G1 (reader.CCS_SHARES) and CCS_G2;
the reader errs as reader.ERRORS per generator (g1: 10% of women read as men, 2% of men as
women; g2: 2% / 2%). Humans (the truth) label a simple random sample of n per condition.
Each dataset's interval is contextbias.corrected.ccs_mean_functional (every generator's
CCS defined, as at these sizes) through reader_correction.corrected_metrics (bc-normal,
bounds 0-100), the six cells resampled independently, as corrected_table runs it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

CCS_G2 = (0.3, 0.4, 0.5)
"""Generator g2's true shares of women in CF, CA-R, CA-U."""


def ccs(shares) -> float:
    return 100.0 * float(np.mean(shares)) / (1.0 + 100.0 * (max(shares) - min(shares)))


def truth(g1) -> float:
    """The mean of the two generators' CCS (n_c equal): (60 / 21 + 40 / 21) / 2 = 100 / 42."""
    return (ccs(g1) + ccs(CCS_G2)) / 2.0


@lru_cache(maxsize=4)
def simulate(scale: str, n: int, size: tuple, make_cell, g1: tuple, errors: tuple):
    """{"naive", "corrected"}: (estimate, low, high) arrays over ``n`` datasets; ``size`` =
    (items, human, replicates) per condition cell; ``make_cell`` = reader._cell."""
    from stereolens.contextbias.corrected import ccs_mean_functional
    from stereolens.metrics.reader_correction import corrected_metrics

    items, human, replicates = size
    rng = np.random.default_rng([21, 5, n, len(scale)])
    sizes = np.full(3, float(items))
    fn = ccs_mean_functional(np.array([1]), [sizes, sizes], np.ones((1, 2), dtype=bool))
    out: dict[str, list] = {"naive": [], "corrected": []}
    for _ in range(n):
        seed = int(rng.integers(2**31))
        cells = [
            make_cell(rng, items, human, s, err)
            for shares, err in ((g1, errors[0]), (CCS_G2, errors[1]))
            for s in shares
        ]
        (m,) = corrected_metrics(cells, fn, replicates=replicates, seed=seed, bounds=(0.0, 100.0))
        out["naive"].append((m["naive"], m["naive_low"], m["naive_high"]))
        out["corrected"].append((m["estimate_bc"], m["ci_low"], m["ci_high"]))
    return {k: tuple(np.array(v, dtype=float).T) for k, v in out.items()}


ROWS = {
    "naive": ("naive: reader's labels, bootstrap bc-normal", True),
    "corrected": ("PPI per condition x generator, bootstrap bc-normal", False),
}


def rows(scale: str, scales: dict, make_cell, g1, errors, human_of: dict, minimum: int) -> list:
    """The rows of ``scale`` (the naive one at "paper" only); each row's n in ``human_of``."""
    from cover import Row

    if scale not in scales:
        return []
    size = scales[scale]
    value = truth(g1)
    out = []
    for key, (interval, paper_only) in ROWS.items():
        if paper_only and scale != "paper":
            continue
        name = (
            f"reader {scale}: contextbias ccs_mean {key}, 2 generators x 3 conditions, "
            f"N {size['items']:,}, n {size['human']:,} per condition, truth {value:.4g}"
        )
        human_of[name] = size["human"]

        def draw(rng, n, key=key):
            args = (size["items"], size["human"], size["replicates"])
            return simulate(scale, n, args, make_cell, tuple(g1), tuple(errors))[key]

        below = size["human"] < minimum
        out.append(
            Row(name, "reader correction", interval, value, draw,
                below_minimum=f"n {size['human']} < MIN_HUMAN_RELIABLE {minimum}" if below else "",
                reference="naive: the reader's labels taken as the truth" if key == "naive" else "")
        )  # fmt: skip
    return out
