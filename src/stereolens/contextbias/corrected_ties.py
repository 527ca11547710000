"""CCS's tie rule: where two conditions' shares of a label lie within TIE_SE bootstrap
standard errors, CCS is not smooth and its interval is withheld (docs/statistics.md, "CCS
at ties")."""

from __future__ import annotations

import numpy as np
import polars as pl

from stereolens.contextbias.corrected_functionals import ccs_functional
from stereolens.contextbias.corrected_means import with_reason
from stereolens.metrics import reader_correction as rc

TIE_SE = 2.0
"""A CCS interval is withheld where two of the label's three condition shares lie within
TIE_SE bootstrap standard errors of each other (:func:`ccs_ties`): CCS's range, max - min,
is not smooth where shares tie, and there its bootstrap interval fails (bench/COVERAGE.md)."""
TIE_REASON = (
    f"two conditions' shares within {TIE_SE:g} standard errors: CCS's range is not smooth at "
    "a tie, where its bootstrap interval does not cover (bench/COVERAGE.md, 'CCS at ties')"
)
"""withheld_reason of a CCS row withheld by :data:`TIE_SE`."""
PAIRS = ((0, 1), (0, 2), (1, 2))
"""The condition pairs (indices into CONDITIONS) whose share differences :func:`ccs_ties`
tests."""


def pair_differences(j):
    """(B, 3 len(j)): per pair of PAIRS (pair-major) the difference of label ``j``'s shares
    (indices, as ccs_functional's) in the two conditions, per replicate."""

    def diffs(shares: list[np.ndarray]) -> np.ndarray:
        s = [np.atleast_2d(np.asarray(x, dtype=float))[:, j] for x in shares]
        return np.concatenate([s[a] - s[b] for a, b in PAIRS], -1)

    return diffs


def ccs_ties(three, labels: np.ndarray, sizes: np.ndarray, options: dict):
    """corrected_metrics of the CCS of ``labels`` (as :func:`_ccs_table` needs them) from one
    bootstrap of the three condition cells, and per label whether the reader's and the
    corrected shares tie: some pair of conditions whose share difference is within TIE_SE of
    its bootstrap sd (or has none). Returns (results, tie_naive (L,), tie_corrected (L,))."""
    n = len(labels)
    ccs, diffs = ccs_functional(labels, sizes), pair_differences(labels)
    results = rc.corrected_metrics(
        three,
        lambda shares: np.concatenate([ccs(shares), diffs(shares)], -1),
        bounds=(0.0, 100.0),
        with_se=True,
        **options,
    )
    gaps = results[n:]

    def tied(which: str) -> np.ndarray:
        diff = np.array([g[which] for g in gaps], dtype=float)
        se = np.array([g[f"{which}_se"] for g in gaps], dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            z = (np.abs(diff) / se).reshape(len(PAIRS), n)  # 0 / 0 (no spread): a tie
        return ~(z >= TIE_SE).all(0)

    for r in results[:n]:
        del r["naive_se"], r["corrected_se"]
    return results[:n], tied("naive"), tied("corrected")


def withhold_ties(record: dict, tie_naive: bool, tie_corrected: bool) -> dict:
    """A CCS record with its naive interval NaN where the reader's shares tie and its
    corrected interval withheld (interval_reliable false, withheld_reason TIE_REASON) where
    the corrected shares do."""
    out = dict(record)
    if tie_naive:
        out["naive_low"] = out["naive_high"] = np.nan
    if tie_corrected:
        out["interval_reliable"] = False
        out["withheld_reason"] = TIE_REASON
    return out


def with_reasons(table: pl.DataFrame, records: list[dict]) -> pl.DataFrame:
    """A CCS table with k null and withheld_reason (null where the interval is not
    withheld for a tie) from its records, in their order."""
    return with_reason(table.with_columns(pl.lit(None, pl.Int64).alias("k")), records)
