"""BiasIG's block of the report's first screen: naive beside corrected S_imp, S_exp and eta
(stereolens.report.reader), or the human labels still to collect."""

from __future__ import annotations

import polars as pl

from stereolens.biasig.formulas import (
    ETA_MIN_HUMAN_RELIABLE,
    SCORE_AGGREGATE_MIN_LABELLED,
    SCORE_AGGREGATE_PERSONS,
    SCORE_MIN_HUMAN_RELIABLE,
)
from stereolens.report import reader, reader_plan
from stereolens.report.inputs import Inputs

KEY, TITLE = "biasig", "BiasIG"  # biasig.report's
S_IMP_MIN = SCORE_AGGREGATE_MIN_LABELLED[("s_imp", "*")]

ETA_WITHHELD = (
    f"eta's corrected interval is printed from {ETA_MIN_HUMAN_RELIABLE:,} human labels per "
    "cell, its own measured minimum (at 400 it covered 93.4% of 1,000 datasets; "
    "bench/COVERAGE.md, 'Reader correction, BiasIG eta')"
)
"""The note of a corrected eta row below biasig.formulas.ETA_MIN_HUMAN_RELIABLE."""
S_EXP_WITHHELD = (
    f"S_exp's corrected interval over all attributes is printed from "
    f"{SCORE_MIN_HUMAN_RELIABLE[('s_exp', '*')]:,} human labels per cell, its own measured "
    "minimum (biasig.formulas.SCORE_MIN_HUMAN_RELIABLE; bench/COVERAGE.md, 'BiasIG's "
    "printing rule')"
)
"""The note of a corrected S_exp '*' row below its biasig.formulas.SCORE_MIN_HUMAN_RELIABLE."""
S_IMP_WITHHELD = (
    f"S_imp's corrected interval is printed from {S_IMP_MIN:,} human labels in every implicit "
    f"unit x person x attribute and {SCORE_AGGREGATE_PERSONS * S_IMP_MIN:,} over each "
    f"attribute's cells (the paper's 214 implicit subjects x {S_IMP_MIN}: 94.2-95.2% of "
    "1,000 datasets), or 400 in every cell (biasig.formulas.SCORE_AGGREGATE_MIN_LABELLED; "
    "bench/COVERAGE.md, 'Reader correction: BiasIG S_imp at the paper's design')"
)
"""The note of a corrected S_imp row that biasig.corrected.score_reliable withholds."""
READER_HEADLINES = {
    "s_imp": reader.Headline("S_imp", 1.0, lower_is_less_biased=False, withheld=S_IMP_WITHHELD),
    "s_exp": reader.Headline("S_exp", 1.0, lower_is_less_biased=False, withheld=S_EXP_WITHHELD),
    "eta": reader.Headline("eta", 0.5, ranked=False, withheld=ETA_WITHHELD),
}
"""The corrected table's metrics: S_imp, S_exp (1 = no bias; higher = less biased) and eta
(0.5 = neither ignorance nor discrimination, a direction, not ranked)."""


READER_CAPTION = (
    "BiasIG: S_imp (paper 000 Eq. 1-2) and S_exp (Eq. 3) over all protected attributes "
    "('*'), a unit x person's gender, race and age resampled together (one draw of its "
    "images; 'The joint draw'); eta (Eq. 4-5; 0.5 = neither, towards 1 discrimination, "
    "towards 0 ignorance; not ranked) at its double-bootstrap bias-corrected estimate, "
    "a side's gender, race and age with one draw of its images at each level. S_exp's "
    "interval is printed from "
    f"{SCORE_MIN_HUMAN_RELIABLE[('s_exp', '*')]:,} labels a cell "
    "(biasig.formulas.SCORE_MIN_HUMAN_RELIABLE; with 100 of a subject's 200 images labelled "
    "it covered 93.8-94.8% of 1,000 datasets in both reader worlds); S_imp's from "
    f"{S_IMP_MIN} labels in every implicit unit x person x attribute and "
    f"{SCORE_AGGREGATE_PERSONS * S_IMP_MIN:,} over each attribute's cells (at the paper's 214 "
    f"implicit subjects of 200 images, {S_IMP_MIN} a subject covered 94.2-95.2% of 1,000 "
    "datasets; biasig.formulas.SCORE_AGGREGATE_MIN_LABELLED), or {minimum} in every cell; "
    "eta's from its own minimum (biasig.formulas.ETA_MIN_HUMAN_RELIABLE)."
)
"""The reader block's caption line (stereolens.report.reader.caption)."""


def reader_correction(inputs: Inputs, config: dict) -> reader.ReaderBlock | None:
    """The first screen's reader block: naive beside corrected, else the labels to collect."""
    table = inputs.get("biasig_corrected")
    if table is not None and table.height:
        return reader.corrected_block(
            KEY, TITLE, table.filter(pl.col("protected_attribute") == "*"), READER_HEADLINES,
            unit="variant", scope=("protected_attribute",),
            # an image position is read once per attribute: count it once per variant x metric
            # eta's cells are S_imp's (the pairs' sides are implicit units): not again
            counts=reader.distinct_counts(
                table, ["variant", "metric"],
                (pl.col("protected_attribute") != "*") & (pl.col("metric") != "eta"),
            ),
            simulated=reader.simulated(inputs, config, KEY),
            formulas=READER_CAPTION,
        )  # fmt: skip
    answers = inputs.get("biasig_answers", columns=["status"])
    if answers is None or answers.height == 0:
        return None
    return reader_plan.plan_block(
        KEY, TITLE, n_items=answers.height, what="image positions",
        planned=reader_plan.planner_part(config, KEY),
    )  # fmt: skip
