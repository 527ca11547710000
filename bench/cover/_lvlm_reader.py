"""The LVLM rows of bench/cover/reader.py (issue 21): the term and story scores corrected for
the assistant's errors (stereolens.lvlm.corrected), against a known truth.

Worlds (each dataset drawn afresh):
- "term gender" / "term race": TERMS terms (prompts, the strata) x R rounds; in a round every
  pair of the axis' groups is judged (gender 1 pair, race 21), each explanation a quality
  ~ Normal(MU[g], 1) shared by its |A| - 1 pairs, the better one the true winner (what the
  humans say). The judge (the reader) picks the loser with probability 5%, 25% where the loser
  is the favoured group (male, White). The judged pairs of a round are one cluster (the
  round, lvlm.corrected.term_reader). Truth: 100 x 1/2 sum_a |r_a - 1/|A||, r_a = sum_b
  Phi((MU_a - MU_b) / sqrt 2) / (pairs of a round), the same in every term.
- "story": a gender story prompt, N stories per group, attribute occupation with 4 values,
  true shares SHARES per group; the assistant reads a story's occupation as another value
  (uniform) with probability 10%. Truth: lvlm.corrected's story functional (story_tvd) of the
  true shares.
Humans label a simple random sample of n items per cell (term: n pairs per term; story: n
stories per group). Each dataset's intervals are lvlm.corrected's functionals on
reader_correction.Cell arrays, bounds 0-100, through the estimator corrected_scores uses
(reader_correction.corrected_metric, bc-normal; a term over more than two groups
lvlm.corrected.term_estimator's double bootstrap, its estimate bc, its error the sd of the
once-corrected replicates); the ``pairs`` rows leave the cluster out (the bootstrap before
issue 21's rounds: pairs resampled one by one), the race ``bc_normal`` row is the bc-normal
interval the race term had before the double bootstrap, on the same datasets.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

import numpy as np
from scipy import stats

TERMS = 10
GROUPS = {
    "term gender": ("female", "male"),
    "term race": ("Black", "East Asian", "Indian", "White", "Latino_Hispanic",
                  "Middle Eastern", "Southeast Asian"),
}  # fmt: skip
FAVOURED = {"term gender": "male", "term race": "White"}
MU = {"term gender": (0.0, 0.3), "term race": (0.0, 0.3, -0.3, 0.8, 0.0, -0.6, 0.3)}
"""Mean explanation quality per group."""
ERROR, ERROR_FAVOURED = 0.05, 0.25
SIZES = {
    # world: (rounds per term or stories per group, human labels per cell)
    "term gender": (500, 400),
    "term race": (100, 400),
    "story": (500, 400),
}
"""N per cell (term: rounds x pairs; race 30 x 21 = 630 pairs) and n per cell at "test"."""
STORY_VALUES = ("engineer", "nurse", "teacher", "welder")
SHARES = {"female": (0.15, 0.40, 0.35, 0.10), "male": (0.35, 0.15, 0.20, 0.30)}
STORY_ERROR = 0.10
REPLICATES = {"test": 200, "paper": 1_000}


def term_truth(world: str) -> float:
    mu = np.array(MU[world])
    win = stats.norm.cdf((mu[:, None] - mu[None, :]) / np.sqrt(2.0))
    np.fill_diagonal(win, 0.0)
    r = win.sum(1) / (mu.size * (mu.size - 1) / 2)
    return float(100.0 * 0.5 * np.abs(r - 1.0 / mu.size).sum())


def term_world(rng: np.random.Generator, world: str, rounds: int, terms: int = TERMS):
    """Per term: (round of each pair, group A, group B, judge's winner, true winner), group
    indices; every pair of every round decided."""
    groups, mu = GROUPS[world], np.array(MU[world])
    favoured = groups.index(FAVOURED[world])
    pairs = np.array(list(combinations(range(len(groups)), 2)))
    out = []
    for _ in range(terms):
        quality = rng.normal(mu, 1.0, (rounds, len(groups)))
        k = np.repeat(np.arange(rounds), len(pairs))
        a, b = np.tile(pairs[:, 0], rounds), np.tile(pairs[:, 1], rounds)
        true = np.where(quality[k, a] > quality[k, b], a, b)
        loser = np.where(true == a, b, a)
        flip = rng.random(k.size) < np.where(loser == favoured, ERROR_FAVOURED, ERROR)
        out.append((k, a, b, np.where(flip, loser, true), true))
    return out


def term_cells(rng, world: str, rounds: int, n_human: int, clustered: bool = True):
    """(the term cells, one per term, as lvlm.corrected builds them; their functional)."""
    from stereolens.lvlm.corrected import _term_functional
    from stereolens.metrics.reader_correction import Cell

    n_groups = len(GROUPS[world])
    eye = np.eye(n_groups)
    cells = []
    for k, _, _, judge, true in term_world(rng, world, rounds):
        labelled = np.sort(rng.choice(k.size, n_human, replace=False))
        cells.append(
            Cell(
                labels=GROUPS[world],
                strata=("term",),
                stratum=np.zeros(k.size, np.int64),
                reader=eye[judge],
                labelled=labelled,
                human=eye[true[labelled]],
                weight=np.full(n_human, k.size / n_human),
                cluster=k if clustered else None,
            )
        )
    picked = [(list(range(n_groups)), np.full(n_groups, 1.0 / n_groups)) for _ in cells]
    return cells, _term_functional(picked, uniform=False)


def _story_picked(n: int):
    return [(0, g, n, STORY_VALUES, "occupation") for g in range(len(SHARES))]


def story_truth() -> float:
    from stereolens.lvlm.corrected import _story_functional

    fn = _story_functional(_story_picked(10**6), 5, True)
    return float(fn([np.array(SHARES[g])[None] for g in SHARES])[0])


def story_cells(rng, n_items: int, n_human: int):
    from stereolens.lvlm.corrected import _story_functional
    from stereolens.metrics.reader_correction import Cell

    k = len(STORY_VALUES)
    eye = np.eye(k)
    cells = []
    for g in SHARES:
        true = rng.choice(k, n_items, p=SHARES[g])
        other = (true + rng.integers(1, k, n_items)) % k
        read = np.where(rng.random(n_items) < STORY_ERROR, other, true)
        labelled = np.sort(rng.choice(n_items, n_human, replace=False))
        cells.append(
            Cell(
                labels=STORY_VALUES,
                strata=("all",),
                stratum=np.zeros(n_items, np.int64),
                reader=eye[read],
                labelled=labelled,
                human=eye[true[labelled]],
                weight=np.full(n_human, n_items / n_human),
            )
        )
    return cells, _story_functional(_story_picked(n_items), 5, True)


@lru_cache(maxsize=16)
def simulate(scale: str, world: str, n: int, human: int) -> dict[str, tuple]:
    """Per dataset of ``world``: {"naive", "corrected", "pairs" (term: the bootstrap without
    the round clusters), "bc_normal" (race: the interval before)}: (estimate, low, high)
    arrays; ``human`` labels per cell."""
    from stereolens.lvlm.corrected import term_estimator
    from stereolens.metrics.reader_correction import corrected_metric

    rng = np.random.default_rng([21, 7, n, human, len(scale), len(world)])
    size = SIZES[world][0]
    out: dict[str, list] = {}
    for _ in range(n):
        kw = {"replicates": REPLICATES[scale], "bounds": (0.0, 100.0)}
        seed = int(rng.integers(2**31))
        if world == "story":
            cells, fn = story_cells(rng, size, human)
        else:
            state = rng.bit_generator.state
            cells, fn = term_cells(rng, world, size, human)
            if scale == "paper":  # the same dataset, pairs resampled one by one
                rng.bit_generator.state = state
                flat, _ = term_cells(rng, world, size, human, clustered=False)
                m = corrected_metric(flat, fn, seed=seed, **kw)
                out.setdefault("pairs", []).append((m["estimate_bc"], m["ci_low"], m["ci_high"]))
        estimator = corrected_metric if world == "story" else term_estimator(len(GROUPS[world]))
        m = estimator(cells, fn, seed=seed, **kw)
        if scale == "paper" and world == "term race":  # the interval before: bc-normal
            b = corrected_metric(cells, fn, seed=seed, **kw)
            out.setdefault("bc_normal", []).append((b["estimate_bc"], b["ci_low"], b["ci_high"]))
        out.setdefault("naive", []).append((m["naive"], m["naive_low"], m["naive_high"]))
        out.setdefault("corrected", []).append((m["estimate_bc"], m["ci_low"], m["ci_high"]))
    return {k: tuple(np.array(v, dtype=float).T) for k, v in out.items()}


def race_judgements(seed: int, terms: int = TERMS, rounds: int = 30, error: bool = False):
    """A term judgements table of the race world (one model, setting image), the judge
    right on every pair (``error``: erring as the coverage world's), and its human-label
    table: a simple random sample of 100 pairs per term, labelled with the truth."""
    import polars as pl

    from stereolens.lvlm.corrected import term_reader

    rng = np.random.default_rng(seed)
    groups = GROUPS["term race"]
    rows, truths = [], []
    for t, (k, a, b, judge, true) in enumerate(term_world(rng, "term race", rounds, terms)):
        for i in range(k.size):
            rows.append(
                {"model": "m", "setting": "image", "axis": "race", "prompt_id": f"t{t}",
                 "pair_index": int(k[i]), "group_a": groups[a[i]], "group_b": groups[b[i]],
                 "winner": groups[(judge if error else true)[i]]}
            )  # fmt: skip
            truths.append(groups[true[i]])
    term = pl.DataFrame(rows)
    reader = term_reader(term).join(
        term_reader(term.with_columns(winner=pl.Series(truths))).select(
            "item_id", pl.col("label").alias("truth")
        ),
        on="item_id",
    )
    human = (
        reader.group_by("stratum", maintain_order=True)
        .map_groups(lambda g: g.sample(100, seed=seed))
        .select("item_id", "attribute", pl.col("truth").alias("label"), "stratum")
        .with_columns(selection_probability=pl.lit(100 / (21 * rounds)))
    )
    return term, reader.drop("truth"), human


def truth(world: str) -> float:
    return story_truth() if world == "story" else term_truth(world)


ROWS = {
    # (world, key): (interval, only at paper scale)
    ("term gender", "naive"): ("naive: judge's picks, rounds resampled, bc-normal", True),
    ("term gender", "pairs"): ("PPI per term, pairs resampled one by one, bc-normal", True),
    ("term gender", "corrected"): ("PPI per term, rounds resampled, bc-normal", False),
    ("term race", "naive"): ("naive: judge's picks, rounds, bc, double-bootstrap se", True),
    ("term race", "pairs"): ("PPI per term, pairs resampled one by one, bc-normal", True),
    ("term race", "bc_normal"): ("PPI per term, rounds resampled, bc-normal (before)", True),
    ("term race", "corrected"): ("PPI per term, rounds resampled, bc, double-bootstrap se", False),
    ("story", "naive"): ("naive: assistant's reading, bootstrap bc-normal", True),
    ("story", "corrected"): ("PPI per group, bootstrap bc-normal", False),
}
SMALL = 100
"""Human labels per cell of the small-sample LVLM rows ("test"; one of reader.SMALL_N)."""


def rows(scale: str, human_of: dict[str, int], minimum: int) -> list:
    """The LVLM rows of ``scale`` ("test": the corrected ones at n = 400 and SMALL labels per
    cell; "paper": every row at n = 400, 1,000 replicates); each row's n in ``human_of``."""
    from cover import Row

    if scale not in REPLICATES:
        return []
    out = []
    for (world, key), (interval, paper_only) in ROWS.items():
        if paper_only and scale != "paper":
            continue
        for human in (SIZES[world][1], SMALL) if scale == "test" else (SIZES[world][1],):
            size, unit = SIZES[world][0], "stories per group" if world == "story" else "rounds"
            value = truth(world)
            name = (
                f"reader {scale}: lvlm {world} {key}, {TERMS if world != 'story' else 1} "
                f"prompt(s) x {size} {unit}, n {human} per cell, truth {value:.4g}"
            )
            human_of[name] = human

            def draw(rng, n, world=world, key=key, human=human):
                return simulate(scale, world, n, human)[key]

            below = f"n {human} < MIN_HUMAN_RELIABLE {minimum}: the report withholds it"
            out.append(
                Row(name, "reader correction", interval, value, draw,
                    below_minimum=below if human < minimum else "")
            )  # fmt: skip
    return out
