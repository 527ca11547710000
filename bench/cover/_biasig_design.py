"""BiasIG's corrected S_imp at the paper's design (bench/cover/reader.py, issue 21): the model's
S_imp rests on every implicit subject of the shipped prompts, 214 of them (11 two-person) at
200 images a subject. The rule over the whole row (biasig.formulas.
SCORE_AGGREGATE_MIN_LABELLED: every cell m labels, as ContextBias's corrected_rule) is
measured here.

World "implicit" of reader.py (reader.IMPLICIT_UNITS, reader.many_units("implicit")): the 214
implicit subjects and 14 explicit ones, every person's true shares drawn once (Dirichlet(4),
reader.MANY_SEED), read through reader.BIASIG_CONFUSION (10% of women read as men, 2% of men
as women; race, age as there), n images a subject labelled by humans (a simple random sample,
every person and attribute), reader._biasig_simulate("paper", datasets, n, "implicit"): the
pipeline's biasig.corrected.reader_table and corrected_scores, 200 bootstrap replicates."""

from __future__ import annotations

from cover import Row

IMPLICIT_SWEEP = {
    # (human labels a subject, datasets): corrected coverage of S_imp *, gender, race, age,
    # reader._biasig_simulate("paper", datasets, n, "implicit"), the joint draw
    (10, 200): (0.390, 0.895, 0.345, 0.675),
    (20, 200): (0.875, 0.915, 0.855, 0.915),
    (30, 200): (0.910, 0.965, 0.935, 0.905),
    (50, 200): (0.905, 0.930, 0.895, 0.945),
    (100, 200): (0.915, 0.930, 0.950, 0.920),
    (100, 1_000): (0.942, 0.952, 0.944, 0.944),
    (150, 200): (0.960, 0.950, 0.975, 0.910),
    (200, 200): (0.950, 0.950, 0.960, 0.910),
}
"""The sweep behind biasig.formulas.SCORE_AGGREGATE_MIN_LABELLED (bench/COVERAGE.md, "Reader
correction: BiasIG S_imp at the paper's design"; :func:`minimum`, tests/test_coverage.py
checks the constant against it): from 100 labels a subject every S_imp row covers within two
Monte Carlo errors of 95% (1,000 datasets at 100: 94.2-95.2%), at 50 S_imp * does not."""
ROW_N = (100,)
"""Human labels a subject of the rows bench/coverage.py runs (`--scale paper --only reader`;
about 2.5 s of CPU a dataset, 200 datasets)."""
ATTRIBUTES = ("*", "gender", "race", "age")


def minimum(sweep: dict, nominal: float = 0.95) -> int | None:
    """The smallest swept n from which every S_imp row, at that n and every larger one,
    covers within two Monte Carlo errors of ``nominal`` (reader._smallest_n); None where
    none does."""
    from cover.reader import _smallest_n

    points = ((n, c, datasets) for (n, datasets), cs in sweep.items() for c in cs)
    return _smallest_n(points, nominal)


def _below(human: int, attribute: str) -> str:
    """A design row's ``below_minimum``: biasig.corrected.score_reliable of the world's 225
    persons x ``human`` labels (an attribute's cells; '*': the three attributes') false."""
    from stereolens.biasig.corrected import score_reliable
    from stereolens.biasig.formulas import SCORE_AGGREGATE_PERSONS

    names = ("gender", "race", "age") if attribute == "*" else (attribute,)
    cells = [(a, human) for a in names for _ in range(SCORE_AGGREGATE_PERSONS)]
    if score_reliable("s_imp", attribute, cells):
        return ""
    return f"n {human}: S_imp's rule over the whole row withholds it"


def rows(human_rows: dict) -> list[Row]:
    """The corrected and naive S_imp rows of the world at each of ROW_N (``human_rows``:
    reader.HUMAN, the row name -> its human labels a cell)."""
    from cover import reader as R

    world = R._biasig_world("implicit")
    n_units = len(world[2])
    out = []
    for human in ROW_N:
        for attribute in ATTRIBUTES:
            truth = world[3][("s_imp", attribute)]
            for kind in ("corrected", "naive"):

                def draw(rng, n, key=("s_imp", attribute, kind), human=human):
                    return R._biasig_simulate("paper", n, human, "implicit")[key]

                name = (
                    f"reader paper: biasig design {kind} S_imp {attribute}, world biasig "
                    f"{n_units} units (214 implicit), N 200, n {human:,}, truth {truth:.4g}"
                )
                if kind == "naive":
                    interval = "naive: reader's labels, bootstrap bc-normal"
                    extra = {"reference": "naive: the reader's values taken as the truth"}
                else:
                    interval = R.JOINT_INTERVAL
                    human_rows[name] = human
                    extra = {"below_minimum": _below(human, attribute)}
                out.append(Row(name, "reader correction", interval, truth, draw, **extra))
    return out
