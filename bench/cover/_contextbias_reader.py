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
TIES = {"two tied": (0.3, 0.35, 0.3), "three tied": (0.3, 0.3, 0.3)}
"""Worlds where g2's shares tie (CF and CA-U; all three: the context changes nothing), where
CCS's range is not smooth: the table withholds a tied row's interval (TIE_SE); measured at
"paper" only."""


def ccs(shares) -> float:
    return 100.0 * float(np.mean(shares)) / (1.0 + 100.0 * (max(shares) - min(shares)))


def truth(g1, g2=CCS_G2) -> float:
    """The mean of the two generators' CCS (n_c equal): (60 / 21 + 40 / 21) / 2 = 100 / 42."""
    return (ccs(g1) + ccs(g2)) / 2.0


@lru_cache(maxsize=8)
def simulate(scale: str, n: int, size: tuple, make_cell, g1: tuple, errors: tuple, g2=CCS_G2):
    """{"naive", "corrected"}: (estimate, low, high, notes) over ``n`` datasets; ``size`` =
    (items, human, replicates) per condition cell; ``make_cell`` = reader._cell. A note is
    the table's withheld_reason where a generator's shares tie (contextbias.corrected.
    ccs_ties on its three cells, as _ccs_table runs it; the naive side on the reader's
    shares), else None."""
    from stereolens.contextbias.corrected import ccs_mean_functional
    from stereolens.contextbias.corrected_ties import TIE_REASON, ccs_ties
    from stereolens.metrics.reader_correction import corrected_metrics

    items, human, replicates = size
    rng = np.random.default_rng([21, 5, n, len(scale), *([int(1000 * x) for x in g2])])
    sizes = np.full(3, float(items))
    fn = ccs_mean_functional(np.array([1]), [sizes, sizes], np.ones((1, 2), dtype=bool))
    out: dict[str, list] = {"naive": [], "corrected": []}
    for _ in range(n):
        seed = int(rng.integers(2**31))
        cells = [
            make_cell(rng, items, human, s, err)
            for shares, err in ((g1, errors[0]), (g2, errors[1]))
            for s in shares
        ]
        (m,) = corrected_metrics(cells, fn, replicates=replicates, seed=seed, bounds=(0.0, 100.0))
        opts = {"replicates": replicates, "seed": seed}
        ties = [ccs_ties(cells[i : i + 3], np.array([1]), sizes, opts) for i in (0, 3)]
        tied = [any(t[k][0] for t in ties) for k in (1, 2)]
        for key, low, high, tie in (("naive", "naive_low", "naive_high", tied[0]),
                                    ("corrected", "ci_low", "ci_high", tied[1])):  # fmt: skip
            est = m["naive"] if key == "naive" else m["estimate_bc"]
            note = TIE_REASON if tie else None
            lo, hi = (np.nan, np.nan) if tie else (m[low], m[high])
            out[key].append((est, lo, hi, note))
    return {k: tuple(list(col) for col in zip(*v, strict=True)) for k, v in out.items()}


ROWS = {
    "naive": ("naive: reader's labels, bootstrap bc-normal", True),
    "corrected": ("PPI per condition x generator, bootstrap bc-normal", False),
}


def rows(scale: str, scales: dict, make_cell, g1, errors, human_of: dict, minimum: int) -> list:
    """The rows of ``scale`` (the naive one and the tied worlds at "paper" only); each row's
    n in ``human_of``."""
    from cover import Row

    if scale not in scales:
        return []
    size = scales[scale]
    worlds = {"": CCS_G2, **(TIES if scale == "paper" else {})}
    out = []
    for world, g2 in worlds.items():
        value = truth(g1, g2)
        for key, (interval, paper_only) in ROWS.items():
            if paper_only and scale != "paper":
                continue
            name = (
                f"reader {scale}: contextbias ccs_mean {key}, 2 generators x 3 conditions"
                + (f", g2 {world} {'/'.join(f'{x:g}' for x in g2)}" if world else "")
                + f", N {size['items']:,}, n {size['human']:,} per condition, truth {value:.4g}"
            )
            human_of[name] = size["human"]

            def draw(rng, n, key=key, g2=g2):
                args = (size["items"], size["human"], size["replicates"])
                got = simulate(scale, n, args, make_cell, tuple(g1), tuple(errors), g2)[key]
                return tuple(np.array(a, dtype=float) for a in got[:3]) + (got[3],)

            below = size["human"] < minimum
            out.append(
                Row(name, "reader correction", interval, value, draw,
                    withheld="two conditions' shares within TIE_SE = 2 sd" if world else "",
                    below_minimum=f"n {size['human']} < MIN_HUMAN_RELIABLE {minimum}"
                    if below else "",
                    reference="naive: the reader's labels taken as the truth"
                    if key == "naive" else "")
            )  # fmt: skip
    return out
