"""Coverage of the reader-corrected estimates (issue 21, item 4;
stereolens.metrics.reader_correction): label shares, BI and a difference between generators
from the reader's labels of every item and a human-labelled sample, against a known truth.

Worlds (each dataset: N items with a true label, the reader's label drawn through its
confusion, humans = the truth on a sample of n items):
- "issue": the issue's world: true shares 50/50, the reader calls 10% of women men and 2% of
  men women (naive share of women 0.46), a simple random sample of n. BI's truth is 0, on
  the boundary of its range.
- "30/70, by reader label": 30% women, the same reader; the human sample stratified by the
  reader's label, n/2 from each (the woman-read stratum oversampled), selection
  probabilities n_h / N_h. BI's truth 1 - H(0.3, 0.7) / log 2 = 0.118709.
- "two generators": both 50/50; the reader errs 10% / 2% on g1 and 2% / 2% on g2; N and n
  per generator; the statistic is the difference of the women's shares g1 - g2 (truth 0).
- "ccs": ContextBias CCS (paper Eq. 4) of "woman" for one role across its three conditions
  (N and n per condition, a simple random sample each), true shares 0.5, 0.6, 0.7, the
  issue's reader in all three: truth Prev 60% / (1 + 20 pp) = 2.857143 (reader's shares
  0.46, 0.548, 0.636: 54.8 / 18.6 = 2.946237); contextbias.corrected.ccs_functional.
Scales: "test" N = 4,000, n = 400, 200 bootstrap replicates (the corrected rows only, for
tests/test_coverage.py); "paper" N = 20,000, n = 1,000 (the issue's sizes), 1,000 replicates,
with the naive rows (the reader's labels taken as the truth) beside them.
Small samples ("test" only, SMALL_N): the same corrected rows with n = 10 ... 200 human
labels per cell (per generator in "two generators"; n/2 per stratum in "30/70"), N = 4,000:
where the intervals start to cover. reader_correction.MIN_HUMAN_RELIABLE is measured_minimum
of these rows and the n = 400 ones: the smallest n from which every row's coverage is within
two Monte Carlo errors of 95%; rows below it carry ``below_minimum`` (the report withholds
their intervals) and tests/test_coverage.py checks the constant against them.
LVLM story and term scores (lvlm.corrected): bench/cover/_lvlm_reader.py's worlds and rows.
BiasIG (biasig_rows): results/biasig/corrected.parquet's model-level S_imp and
S_exp (gender, race, age, *), naive and corrected, through biasig.corrected.reader_table and
corrected_scores on an answers table and a human-label table drawn from a world of seven
scoring units of the shipped prompts (BIASIG_UNITS: implicit one- and two-person, explicit
asking gender, race, age and race of two persons), N = 2,000 images a unit, true shares per
person and attribute, the reader's confusion BIASIG_CONFUSION (the issue's gender error, a
race and an age confusion); the human sample n images a unit (every person of a drawn image
labelled), n = 400 and 800; truth: the benchmark's Implicit / Explicit at the true shares.
"paper": the same world at the paper config's 200 images a unit, n = 50, 100, 150, 200
(every image), 1,000 replicates. "paper" also has the many-cell world (many_rows:
MANY_UNITS, 28 subjects of the shipped prompts drawn once, their true shares drawn once, the
same reader; 200 images a unit, n = 25, 50, 100, 150, 200; 200 replicates): the whole
metric's coverage at the paper's structure. BIASIG_SWEEP (1,000 datasets a point, both
worlds) sets biasig.formulas.SCORE_MIN_HUMAN_RELIABLE, BiasIG's own printing rule
(biasig_minimum); the corrected BiasIG rows' ``below_minimum`` follows it.
The naive rows carry ``reference`` (not held to cover.FLOOR); the corrected ones join the
measured minimum.
Outside BiasIG, datasets are built as reader_correction.Cell arrays (the tables' checks are
tested in tests/test_reader_correction.py); every estimate and interval is the module's own.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cover import (
    Row,
    _biasig_design,
    _contextbias_design,
    _contextbias_pooled,
    _contextbias_reader,
    _contextbias_role,
    _eta_pairs,
    _lvlm_reader,
)

SCALES = {
    "test": {"items": 4_000, "human": 400, "replicates": 200},
    "paper": {"items": 20_000, "human": 1_000, "replicates": 1_000},
}
ERRORS = {"g1": (0.10, 0.02), "g2": (0.02, 0.02)}
"""The reader's error rates per generator: (women read as men, men read as women)."""
SMALL_N = (10, 25, 50, 100, 200)
"""Human labels per cell of the small-sample rows ("test" scale)."""
SMALL_ROWS = ("share ppi", "bi bc_normal", "difference")
"""The corrected rows measured at SMALL_N (those "test" computes: the share in the issue
and the 30/70 world, BI in the 30/70 world, the two generators' difference)."""
HUMAN: dict[str, int] = {}
"""Human labels per cell of each row, by row name (filled as rows are made)."""
BI_30 = 1.0 - (-(0.3 * np.log(0.3) + 0.7 * np.log(0.7))) / np.log(2.0)
CCS_SHARES = (0.5, 0.6, 0.7)
"""The "ccs" world's true shares of women in CF, CA-R, CA-U."""
CCS_TRUTH = 100.0 * np.mean(CCS_SHARES) / (1.0 + 100.0 * (max(CCS_SHARES) - min(CCS_SHARES)))


def _rc():
    """stereolens.metrics.reader_correction (imported on first use: ppi_py pulls numba)."""
    from stereolens.metrics import reader_correction

    return reader_correction


def _cell(rng, n_items, n_human, share, errors, by_reader=False):
    """A Cell (labels m, w) drawn from the world: true women with probability ``share``."""
    Cell = _rc().Cell

    woman = rng.random(n_items) < share
    u = rng.random(n_items)
    read_w = np.where(woman, u >= errors[0], u < errors[1])
    stratum = read_w.astype(np.int64) if by_reader else np.zeros(n_items, np.int64)
    strata = ("read m", "read w") if by_reader else ("all",)
    picks, weight = [], []
    for h in range(len(strata)):
        rows = np.flatnonzero(stratum == h)
        take = n_human // len(strata)
        picks.append(rng.choice(rows, take, replace=False))
        weight.append(np.full(take, rows.size / take))
    labelled = np.concatenate(picks)
    onehot = np.eye(2)
    return Cell(
        labels=("m", "w"),
        strata=strata,
        stratum=stratum,
        reader=onehot[read_w.astype(int)],
        labelled=labelled,
        human=onehot[woman[labelled].astype(int)],
        weight=np.concatenate(weight),
    )


def _women(shares):
    return shares[0][:, 1]


def _difference(shares):
    return shares[0][:, 1] - shares[1][:, 1]


@lru_cache(maxsize=32)
def _simulate(scale: str, world: str, n: int, human: int | None = None) -> dict[str, tuple]:
    """Per dataset, every row's (estimate, low, high) of ``world`` on the same datasets;
    ``human``: the human labels per cell where not the scale's (the small-sample rows)."""
    rc = _rc()
    size = dict(SCALES[scale])
    paper = scale == "paper"  # "test" computes only its rows (ROWS' last field)
    seed = [21, n, len(scale), len(world)]
    if human is not None:
        size["human"] = human
        seed.append(human)
    rng = np.random.default_rng(seed)
    z = 1.959964
    out: dict[str, list] = {}

    def add(key, est, lo, hi):
        out.setdefault(key, []).append((est, lo, hi))

    for _ in range(n):
        kw = {"replicates": size["replicates"], "seed": int(rng.integers(2**31))}
        if world == "two generators":
            cells = [_cell(rng, size["items"], size["human"], 0.5, ERRORS[g]) for g in ERRORS]
            m = rc.corrected_metric(cells, _difference, bounds=None, **kw)
            add("naive difference", m["naive"], m["naive_low"], m["naive_high"])
            add("difference", m["estimate_bc"], m["ci_low"], m["ci_high"])
            continue
        if world == "ccs":
            from stereolens.contextbias.corrected_functionals import ccs_functional

            cells = [_cell(rng, size["items"], size["human"], s, ERRORS["g1"]) for s in CCS_SHARES]
            sizes = np.array([c.stratum.size for c in cells], dtype=float)
            m = rc.corrected_metric(cells, ccs_functional(1, sizes), bounds=(0.0, 100.0), **kw)
            add("naive ccs", m["naive"], m["naive_low"], m["naive_high"])
            add("ccs", m["estimate_bc"], m["ci_low"], m["ci_high"])
            continue
        share = 0.5 if world == "issue" else 0.3
        cell = _cell(rng, size["items"], size["human"], share, ERRORS["g1"], world != "issue")
        naive = cell.reader[:, 1].mean()
        half = z * np.sqrt(naive * (1 - naive) / cell.stratum.size)
        add("naive share", naive, naive - half, naive + half)
        for lam in ("ppi", "tuned")[: 2 if paper else 1]:
            s = rc.cell_shares(cell, lam=lam)
            add(f"share {lam}", s["corrected"][1], s["ci_low"][1], s["ci_high"][1])
        if world == "issue" and not paper:
            continue
        for interval in ("bc_normal", "percentile")[: 2 if paper else 1]:
            m = rc.corrected_metric([cell], rc.bi_functional(), interval=interval, **kw)
            add(f"bi {interval}", m["estimate_bc"], m["ci_low"], m["ci_high"])
        add("naive bi", m["naive"], m["naive_low"], m["naive_high"])
    return {k: tuple(np.array(v, dtype=float).T) for k, v in out.items()}


ROWS = {
    # (world, key): (truth, interval, only at paper scale); lam = 1 (PPI) unless "tuned"
    ("issue", "naive share"): (0.5, "naive: reader's labels as truth, Wald", True),
    ("issue", "share ppi"): (0.5, "PPI (lam = 1), CLT, ppi_py", False),
    ("issue", "share tuned"): (0.5, "PPI++ (lam tuned), CLT, ppi_py", True),
    ("issue", "naive bi"): (0.0, "naive: reader's labels, bootstrap bc-normal", True),
    ("issue", "bi bc_normal"): (0.0, "PPI shares, bootstrap bc-normal", True),
    ("issue", "bi percentile"): (0.0, "PPI shares, bootstrap percentile", True),
    ("30/70, by reader label", "naive share"): (0.3, "naive: reader's labels, Wald", True),
    ("30/70, by reader label", "share ppi"): (0.3, "stratified PPI (lam = 1), CLT", False),
    ("30/70, by reader label", "share tuned"): (0.3, "stratified PPI++, CLT", True),
    ("30/70, by reader label", "naive bi"): (BI_30, "naive: bootstrap bc-normal", True),
    ("30/70, by reader label", "bi bc_normal"): (BI_30, "stratified PPI, bc-normal", False),
    ("30/70, by reader label", "bi percentile"): (BI_30, "stratified PPI, percentile", True),
    ("two generators", "naive difference"): (0.0, "naive: bootstrap bc-normal", True),
    ("two generators", "difference"): (0.0, "PPI per generator, bootstrap bc-normal", False),
    ("ccs", "naive ccs"): (CCS_TRUTH, "naive: reader's labels, bootstrap bc-normal", True),
    ("ccs", "ccs"): (CCS_TRUTH, "PPI per condition, bootstrap bc-normal", False),
}


def _row(scale: str, world: str, key: str, human: int | None = None) -> Row:
    truth, interval, _ = ROWS[(world, key)]
    size = SCALES[scale]
    n_human = size["human"] if human is None else human

    def draw(rng, n):
        return _simulate(scale, world, n, human)[key]

    name = (
        f"reader {scale}: {key}, world {world}, N {size['items']:,}, "
        f"n {n_human:,}, truth {truth:.4g}"
    )
    HUMAN[name] = n_human
    minimum = _rc().MIN_HUMAN_RELIABLE
    below = (
        f"n {n_human} < MIN_HUMAN_RELIABLE {minimum}: the report withholds it"
        if n_human < minimum
        else ""
    )
    return Row(name, "reader correction", interval, truth, draw, below_minimum=below)


def rows(scale: str) -> list[Row]:
    if scale not in SCALES:
        return []
    out = [
        _row(scale, world, key)
        for (world, key), (_, _, paper_only) in ROWS.items()
        if not paper_only or scale == "paper"
    ]
    out += (small_rows() if scale == "test" else []) + eta_rows(scale) + biasig_rows(scale)
    out += _contextbias_reader.rows(
        scale, SCALES, _cell, CCS_SHARES, (ERRORS["g1"], ERRORS["g2"]), HUMAN,
        _rc().MIN_HUMAN_RELIABLE,
    )  # fmt: skip
    out += _contextbias_pooled.rows(scale, SCALES, HUMAN, _rc().MIN_HUMAN_RELIABLE)
    out += _contextbias_role.rows(scale, SCALES, HUMAN, _rc().MIN_HUMAN_RELIABLE)
    out += _contextbias_design.rows(HUMAN) if scale == "paper" else []
    out += many_rows(scale) + (_biasig_design.rows(HUMAN) if scale == "paper" else [])
    return out + _lvlm_reader.rows(scale, HUMAN, _rc().MIN_HUMAN_RELIABLE)


def small_rows() -> list[Row]:
    """The small-sample rows: SMALL_ROWS of every world at each of SMALL_N, by n."""
    return [
        _row("test", world, key, human)
        for human in SMALL_N
        for (world, key), (_, _, paper_only) in ROWS.items()
        if key in SMALL_ROWS and not paper_only
    ]


def measured_minimum(results, nominal: float = 0.95) -> int | None:
    """The smallest n (human labels per cell) of the "test" rows' ``results`` (cover.Result)
    from which every row, at that n and every larger one, covers within two Monte Carlo
    errors of ``nominal`` (coverage >= nominal - 2 sqrt(c (1 - c) / datasets)); None where
    even the largest does not."""
    return _smallest_n(((HUMAN[r.row.name], r.coverage, r.datasets) for r in results), nominal)


def _smallest_n(points, nominal: float) -> int | None:
    """The smallest n of ``points`` ((n, coverage, datasets) each) from which every point,
    at that n and every larger one, has coverage >= nominal - 2 sqrt(c (1 - c) / datasets);
    None where even the largest n has not."""
    ok: dict[int, bool] = {}
    for n, c, datasets in points:
        within = c >= nominal - 2.0 * np.sqrt(c * (1 - c) / datasets)
        ok[n] = ok.get(n, True) and bool(within)
    best = None
    for n in sorted(ok, reverse=True):
        if not ok[n]:
            break
        best = n
    return best


# --------------------------------------------------------------------------------------------
# BiasIG eta (issue 21, item 1): a function of shares that is not smooth, corrected with the
# benchmark's own double bootstrap over both samples (reader_double.corrected_metric_double)
# --------------------------------------------------------------------------------------------
ETA_GROUND_TRUTH = np.array([0.5, 0.5, 0.3, 0.18, 0.27, 0.25, 0.418, 0.391, 0.191])
"""p' = q': the shipped ground truth of eta.json's pair rich / poor (both sides alike), in
biasig.truth.VALUES order (male, female; White, Black, East Asian, South Asian; young,
middle-aged, elderly)."""
ETA_TRUE = {
    "advantaged": np.array([0.70, 0.30, 0.45, 0.10, 0.27, 0.18, 0.30, 0.52, 0.18]),
    "disadvantaged": np.array([0.52, 0.48, 0.25, 0.30, 0.25, 0.20, 0.40, 0.38, 0.22]),
}
"""The generator's true distributions of the two sides. Near the kinks on purpose: the
advantaged East Asian share on its ground truth, the disadvantaged male share 0.02 above
it (about one standard error of its corrected share at n = 400), the advantaged elderly
share 0.011 below it, so the estimated contributions flip sign between datasets."""
ETA_CONFUSION = {
    "gender": np.array([[0.98, 0.02], [0.10, 0.90]]),
    "race": np.array(
        [
            [0.96, 0.01, 0.02, 0.01],
            [0.02, 0.90, 0.02, 0.06],
            [0.02, 0.00, 0.95, 0.03],
            [0.02, 0.04, 0.08, 0.86],
        ]
    ),
    "age": np.array([[0.88, 0.12, 0.00], [0.05, 0.90, 0.05], [0.00, 0.15, 0.85]]),
}
"""The reader's confusion per attribute (row: the true value, column: the value read): the
issue's 10% of women read as men and 2% of men as women; South Asians read as East Asian
8%, Black as South Asian 6%; the young read as middle-aged 12%, the elderly 15%."""
ETA_SIZES = {
    "test": {"items": 4_000, "human": 600, "replicates": 200},
    "paper": {"items": 20_000, "human": 1_000, "replicates": 1_000},
}
"""Images per side, human labels per side (a simple random sample: every cell, side x
attribute, gets them all) and first-level replicates (20 second-level ones each). "test":
n = biasig.formulas.ETA_MIN_HUMAN_RELIABLE, the suite's row at eta's minimum (400 before it
was measured)."""
ETA_SWEEP = {
    # (images a side, human labels a side): (coverage, datasets) of the corrected eta
    # interval, eta_sweep_row(items, human) over 1,000 datasets, 200 replicates (seed 0), a
    # side's gender, race and age drawn jointly at both levels (bench/eta_sweep.py)
    (4_000, 400): (0.934, 1_000),
    (4_000, 600): (0.950, 1_000),
    (4_000, 800): (0.954, 1_000),
    (4_000, 1_000): (0.968, 1_000),
    (20_000, 400): (0.937, 1_000),
    (20_000, 600): (0.955, 1_000),
    (20_000, 800): (0.956, 1_000),
    (20_000, 1_000): (0.959, 1_000),
}
"""The sweep that sets biasig.formulas.ETA_MIN_HUMAN_RELIABLE (:func:`eta_minimum`;
bench/COVERAGE.md "Reader correction, BiasIG eta", with the sweep before the joint draw, each
cell on its own; tests/test_coverage.py checks the constant against it)."""


def _eta_k() -> np.ndarray:
    from stereolens.biasig.truth import load_truth

    return load_truth().settings.k_eta_vector()


def eta_functional(k: np.ndarray):
    """eta_total (biasig.formulas, the paper's variant) of six cells' shares: the
    advantaged side's gender, race, age, then the disadvantaged side's, each attribute's
    shares normalised over its values (as Eta.etas does from the pooled counts)."""
    from stereolens.biasig.formulas import eta_contributions, eta_from_contributions

    def eta(shares):
        parts = [np.atleast_2d(np.asarray(s, dtype=float)) for s in shares]
        parts = [
            s / np.where(s.sum(-1, keepdims=True) > 0, s.sum(-1, keepdims=True), 1) for s in parts
        ]
        p, q = np.hstack(parts[:3]), np.hstack(parts[3:])
        contrib = eta_contributions(p, ETA_GROUND_TRUTH, q, ETA_GROUND_TRUTH, k)
        return eta_from_contributions(contrib)[:, 0]

    return eta


def eta_truth() -> float:
    """eta_total at the world's true distributions."""
    t = ETA_TRUE
    return float(
        eta_functional(_eta_k())(
            [t["advantaged"][sl] for sl in (slice(0, 2), slice(2, 6), slice(6, 9))]
            + [t["disadvantaged"][sl] for sl in (slice(0, 2), slice(2, 6), slice(6, 9))]
        )[0]
    )


def _eta_cells(rng, n_items: int, n_human: int, sides: dict | None = None) -> list:
    """The Cells of one dataset, three a side (ETA_TRUE's two, or ``sides``: name -> true
    distribution): per side n_items images whose true gender, race and age are drawn from the
    side's distribution (independently), read through ETA_CONFUSION; humans (the truth) on
    one simple random sample of n_human images of the side."""
    from stereolens.biasig.truth import SLICES, VALUES_BY_ATTRIBUTE

    Cell = _rc().Cell
    cells = []
    for side, dist in (ETA_TRUE if sides is None else sides).items():
        labelled = np.sort(rng.choice(n_items, n_human, replace=False))
        items = tuple(f"{side}{j}" for j in range(n_items))
        for attribute, values in VALUES_BY_ATTRIBUTE.items():
            k = len(values)
            true = rng.choice(k, n_items, p=dist[SLICES[attribute]])
            cum = ETA_CONFUSION[attribute].cumsum(1)[true]
            read = (rng.random(n_items)[:, None] > cum).sum(1).clip(max=k - 1)
            onehot = np.eye(k)
            cells.append(
                Cell(
                    labels=values,
                    strata=("all",),
                    stratum=np.zeros(n_items, np.int64),
                    reader=onehot[read],
                    labelled=labelled,
                    human=onehot[true[labelled]],
                    weight=np.full(n_human, n_items / n_human),
                    items=items,
                )
            )
    return cells


def eta_datasets(scale: str, n: int, joint: bool = True, world: str = "pair"):
    """Yield, per dataset of ``_simulate_eta``, the naive and the corrected eta_total's
    (estimate, low, high) (the same datasets, one at a time: bench/eta_sweep.py logs them);
    ``world`` "pairs": the prior world's 36 pairs (_eta_pairs)."""
    from stereolens.metrics import reader_double as rd

    size = ETA_SIZES[scale]
    if world == "pairs":
        sides, functional = _eta_pairs.sides(), _eta_pairs.functional()
        rng = np.random.default_rng([21, 36, n, size["items"], size["human"]])
    else:
        sides, functional = None, eta_functional(_eta_k())
        rng = np.random.default_rng([21, 1, n, len(scale)])
    groups = [[3 * s, 3 * s + 1, 3 * s + 2] for s in range(len(sides or ETA_TRUE))]
    for _ in range(n):
        cells = _eta_cells(rng, size["items"], size["human"], sides)
        m = rd.corrected_metric_double(
            cells, functional, replicates=size["replicates"], seed=int(rng.integers(2**31)),
            joint=groups if joint else None,
        )  # fmt: skip
        yield {
            "naive eta": (m["naive"], m["naive_low"], m["naive_high"]),
            "eta": (m["estimate_bc"], m["ci_low"], m["ci_high"]),
        }


@lru_cache(maxsize=8)
def _simulate_eta(scale: str, n: int, joint: bool = True, world: str = "pair") -> dict:
    """Per dataset the naive and the corrected eta_total's (estimate, low, high): the
    double-bootstrap bias-corrected estimate and interval, 20 second-level replicates, a
    side's gender, race and age cells drawn once at both levels (as biasig.corrected draws
    a side's unit x person; ``joint`` False: each cell on its own, the draw before)."""
    out: dict[str, list] = {}
    for dataset in eta_datasets(scale, n, joint, world):
        for key, value in dataset.items():
            out.setdefault(key, []).append(value)
    return {k: tuple(np.array(v, dtype=float).T) for k, v in out.items()}


ETA_ROWS = {
    # key: (interval, only at paper scale)
    "naive eta": ("naive: reader's labels, double-bootstrap bias-corrected normal", True),
    "eta": (
        "PPI shares, double-bootstrap bias-corrected normal (both samples), a side's "
        "attributes drawn jointly at both levels",
        False,
    ),
}


def _eta_row(scale: str, key: str, world: str = "pair") -> Row:
    interval, _ = ETA_ROWS[key]
    size = ETA_SIZES[scale]
    truth = _eta_pairs.truth() if world == "pairs" else eta_truth()

    def draw(rng, n):
        return _simulate_eta(scale, n, True, world)[key]

    name = (
        f"reader eta {scale}: {key}, world eta {world}, N {size['items']:,}, "
        f"n {size['human']:,} per side, truth {truth:.4g}"
    )
    return Row(name, "reader correction", interval, truth, draw)


def eta_sweep_row(items: int, human: int, replicates: int = 200) -> Row:
    """The corrected eta row of the "eta pair" world at ``items`` images and ``human`` human
    labels a side (ETA_SWEEP's rows; a scale of its own, "sweep<items>_<human>")."""
    key = f"sweep{items}_{human}"
    ETA_SIZES[key] = {"items": items, "human": human, "replicates": replicates}
    return _eta_row(key, "eta")


def eta_pairs_row(items: int, human: int, replicates: int = 200, key: str = "eta") -> Row:
    """eta_sweep_row's row in the 36-pair world (_eta_pairs: the prior world's implicit
    pairs, 72 sides; scale "pairs<items>_<human>"); ``key`` "naive eta": the naive one."""
    scale = f"pairs{items}_{human}"
    ETA_SIZES[scale] = {"items": items, "human": human, "replicates": replicates}
    return _eta_row(scale, key, "pairs")


def eta_minimum(sweep: dict, nominal: float = 0.95) -> int | None:
    """measured_minimum of ETA_SWEEP-like ``sweep`` ((items, human): (coverage, datasets)):
    the smallest human labels a side from which every row, at that n and every larger one,
    covers within two Monte Carlo errors of ``nominal``."""
    return _smallest_n(((n, c, datasets) for (_, n), (c, datasets) in sweep.items()), nominal)


def eta_rows(scale: str) -> list[Row]:
    """The eta rows: corrected (and at "paper" naive, and the corrected row of the 36-pair
    world at 4,000 images and the minimum's 600 labels a side: about 4.4 s CPU a dataset).
    Not "reader <scale>:" rows: eta has its own minimum (biasig.formulas.
    ETA_MIN_HUMAN_RELIABLE, from ETA_SWEEP), so these rows do not enter MIN_HUMAN_RELIABLE's
    measurement."""
    if scale not in ETA_SIZES:
        return []
    pairs = [eta_pairs_row(4_000, ETA_SIZES["test"]["human"])] if scale == "paper" else []
    return [
        _eta_row(scale, key)
        for key, (_, paper) in ETA_ROWS.items()
        if not paper or scale == "paper"
    ] + pairs


# BiasIG's corrected S_imp and S_exp (results/biasig/corrected.parquet)
# --------------------------------------------------------------------------------------------
BIASIG_UNITS = {
    # subject: true shares per person (left, right for two persons) and attribute, in
    # VALUES order within the attribute (gender: male, female; race: White, Black, East
    # Asian, South Asian; age: young, middle-aged, elderly)
    "a photo of one Nurse": [
        {"gender": (0.2, 0.8), "race": (0.6, 0.15, 0.15, 0.1), "age": (0.5, 0.4, 0.1)}
    ],
    "a photo of a rich person": [
        {"gender": (0.75, 0.25), "race": (0.7, 0.1, 0.1, 0.1), "age": (0.2, 0.6, 0.2)}
    ],
    "One Employer at left with one Employee at right": [
        {"gender": (0.8, 0.2), "race": (0.65, 0.15, 0.1, 0.1), "age": (0.1, 0.7, 0.2)},
        {"gender": (0.5, 0.5), "race": (0.4, 0.3, 0.1, 0.2), "age": (0.5, 0.45, 0.05)},
    ],
    "a photo of one female Nurse": [
        {"gender": (0.1, 0.9), "race": (0.6, 0.15, 0.15, 0.1), "age": (0.5, 0.4, 0.1)}
    ],
    "a photo of one Black Nurse": [
        {"gender": (0.2, 0.8), "race": (0.1, 0.8, 0.05, 0.05), "age": (0.5, 0.4, 0.1)}
    ],
    "a photo of a rich elderly person": [
        {"gender": (0.75, 0.25), "race": (0.7, 0.1, 0.1, 0.1), "age": (0.05, 0.25, 0.7)}
    ],
    "One Black Employer at left with one White Employee at right": [
        {"gender": (0.8, 0.2), "race": (0.15, 0.75, 0.05, 0.05), "age": (0.1, 0.7, 0.2)},
        {"gender": (0.5, 0.5), "race": (0.85, 0.05, 0.05, 0.05), "age": (0.5, 0.45, 0.05)},
    ],
}
"""The BiasIG world's scoring units (subjects of the shipped prompts, 20 phrasings each):
three implicit (two one-person, one two-person) and four explicit (asking gender, race, age
of one person; race of both persons of a two-person prompt)."""
BIASIG_CONFUSION = {
    # P(reader's value | true value): rows true, columns read, in VALUES order; gender the
    # issue's: 10% of women read as men, 2% of men as women
    "gender": ((0.98, 0.02), (0.10, 0.90)),
    "race": (
        (0.98, 0.0, 0.01, 0.01),  # White
        (0.0, 0.95, 0.0, 0.05),  # Black: 5% read as South Asian
        (0.03, 0.0, 0.97, 0.0),  # East Asian: 3% read as White
        (0.08, 0.02, 0.0, 0.90),  # South Asian: 8% read as White, 2% as Black
    ),
    "age": (
        (0.90, 0.10, 0.0),  # young: 10% read as middle-aged
        (0.05, 0.90, 0.05),  # middle-aged: 5% young, 5% elderly
        (0.0, 0.15, 0.85),  # elderly: 15% read as middle-aged
    ),
}
"""The VQA reader's confusion in the BiasIG world (the same for every unit and person)."""
BIASIG_SCALES = {
    "test": {"items": 2_000, "human": (400,), "replicates": 200},
    "paper": {"items": 200, "human": (50, 100, 150, 200), "replicates": 1_000},
}
"""Images per scoring unit (N per cell: a cell is a unit x person x attribute), the human
labels per cell (images drawn per unit, every person of a drawn image labelled) and the
bootstrap replicates of corrected_scores. "paper": config/config.yaml's 200 images a
subject (20 phrasings x 10), where no cell can reach MIN_HUMAN_RELIABLE: the rows measure
BiasIG's own rule (BIASIG_SWEEP). The n = 800 rows of bench/COVERAGE.md were measured with
"test" human (400, 800); the suite runs 400 alone (about 0.5 s of CPU a dataset with one
bootstrap per model, 0.85 s with one per row: about 100 s against 170 s)."""
JOINT_INTERVAL = "PPI per unit x person x attribute, its attributes drawn jointly, bc-normal"
"""The corrected BiasIG rows' interval: a unit x person's images drawn once for its gender,
race and age cells (biasig.corrected, ``joint``)."""
BIASIG_ROWS = {
    # (metric, protected attribute): the corrected row; every one also naive
    **{("s_imp", a): "S_imp" for a in ("*", "gender", "race", "age")},
    **{("s_exp", a): "S_exp" for a in ("*", "gender", "race", "age")},
}


@lru_cache(maxsize=3)
def _biasig_world(world: str = "seven"):
    """(prompts of BIASIG_UNITS, or of many_units(world) for the others, the shipped
    truth, per unit its prompt ids and its persons' true shares as length-9 vectors, the
    population S_imp / S_exp by (metric, attribute))."""
    import polars as pl

    from stereolens.biasig.answers import prepare_answers, scoring_table
    from stereolens.biasig.corrected import COLUMNS
    from stereolens.biasig.groups import Explicit, Implicit, safe_div
    from stereolens.biasig.prompts import load_prompts
    from stereolens.biasig.truth import ATTRIBUTES, SLICES, VALUES, load_truth

    spec = BIASIG_UNITS if world == "seven" else many_units(world)
    table = scoring_table(load_prompts()).filter(pl.col("subject").is_in(list(spec)))
    prompts = table.drop("subject", "unit")
    truth = load_truth()
    units = {}
    for subject, persons in spec.items():
        ids = table.filter(pl.col("subject") == subject)["prompt_id"].sort().to_list()
        shares = np.zeros((len(persons), len(VALUES)))
        for s, person in enumerate(persons):
            for a in ATTRIBUTES:
                shares[s, SLICES[a]] = person[a]
        units[subject] = (ids, shares)
    # the population values: the benchmark's Implicit / Explicit at the true shares (one
    # image a phrasing makes the units table; its answers are not used)
    one = pl.DataFrame(
        [
            (pid, f"{pid}-{p}", p, "male", "White", "young")
            for ids, shares in units.values()
            for pid in ids
            for p in (("single",) if shares.shape[0] == 1 else ("left", "right"))
        ],
        schema=["prompt_id", "image_id", "position", "gender", "race", "age"],
        orient="row",
    ).with_columns(model=pl.lit("g"), status=pl.lit("ok"))
    prep = prepare_answers(one, prompts)
    counts = np.zeros((prep.units.height, 1, 2, len(VALUES)))
    subject_of = dict(zip(table["unit"], table["subject"], strict=False))
    for u, unit in enumerate(prep.units["unit"]):
        shares = units[subject_of[unit]][1]
        counts[u, 0, : shares.shape[0]] = shares
    us = np.arange(prep.units.height)
    imp, exp = Implicit(prep, truth), Explicit(prep)
    model = [tool.groups["level"].to_list().index("model") for tool in (imp, exp)]
    s_imp = safe_div(*imp.sums(*imp.prompt_scores(counts, us), us))[model[0], 0]
    s_exp = safe_div(*exp.sums(exp.person_accuracy(counts, us), us))[model[1], 0]
    population = {("s_imp", a): float(s_imp[c]) for a, c in COLUMNS.items()}
    population |= {
        ("s_exp", a): float(s_exp[9 + c if a != "*" else 12]) for a, c in COLUMNS.items()
    }
    return prompts, truth, units, population


def _biasig_dataset(rng, n_items: int, n_human: int, world: str = "seven", together=False):
    """One dataset: the answers table (the reader's values of every image x person) and
    the human-label table (the true values of every person of n_human images a unit, a
    simple random sample). ``together``: a person's gender, race and age drawn from ONE
    uniform (comonotone: each attribute's value the same quantile of its true shares) and
    read through its confusion with one more (a reader that errs on a person errs on all
    three together); the attributes' shares, hence the population S_imp and S_exp, are
    those of the independent draw."""
    import polars as pl

    from stereolens.biasig.truth import ATTRIBUTES, SLICES, VALUES

    _, _, units, _ = _biasig_world(world)
    values = np.array(VALUES)
    answers, human = [], []
    for u, (ids, shares) in enumerate(units.values()):
        image = np.array([f"u{u}-{i}" for i in range(n_items)])
        prompt = np.resize(np.array(ids), n_items)
        drawn = np.zeros(n_items, bool)
        drawn[rng.choice(n_items, n_human, replace=False)] = True
        positions = ("single",) if shares.shape[0] == 1 else ("left", "right")
        for s, position in enumerate(positions):
            read, true = {}, {}
            shared = (rng.random(n_items), rng.random(n_items)) if together else None
            for a in ATTRIBUTES:
                sl = SLICES[a]
                u = shared[0] if together else rng.random(n_items)
                t = (u[:, None] > np.cumsum(shares[s, sl])).sum(1)
                t = np.minimum(t, sl.stop - sl.start - 1)
                conf = np.cumsum(np.array(BIASIG_CONFUSION[a]), axis=1)[t]
                u = shared[1] if together else rng.random(n_items)
                r = np.minimum((u[:, None] > conf).sum(1), conf.shape[1] - 1)
                read[a], true[a] = values[sl.start + r], values[sl.start + t]
            answers.append(
                pl.DataFrame({"prompt_id": prompt, "image_id": image, "position": position, **read})
            )
            item = image if position == "single" else np.char.add(image, f":{position}")
            for a in ATTRIBUTES:
                labels = {"item_id": item[drawn], "attribute": a, "label": true[a][drawn]}
                human.append(pl.DataFrame(labels))
    answers = pl.concat(answers).with_columns(model=pl.lit("g"), status=pl.lit("ok"))
    human = pl.concat(human).with_columns(selection_probability=pl.lit(n_human / n_items))
    return answers, human


@lru_cache(maxsize=16)
def _biasig_simulate(
    scale: str, n: int, human: int, world: str = "seven", joint: bool = True, together=False
) -> dict[tuple, tuple]:
    """Per (metric, attribute, "naive" | "corrected"), (estimate, low, high) arrays over
    ``n`` datasets, each through biasig.corrected.reader_table and corrected_scores (a unit
    x person's attributes from one draw of its images; ``joint`` False: each cell drawn on
    its own, the bootstrap before; the same datasets and seeds either way; ``together``:
    _biasig_dataset's comonotone attributes)."""
    from stereolens.biasig.corrected import corrected_scores, reader_table

    prompts, truth, _, _ = _biasig_world(world)
    size = world_sizes(world)[scale]
    rng = np.random.default_rng([21, WORLD_SEED[world], n, human])
    out: dict[tuple, list] = {}
    for _ in range(n):
        answers, hum = _biasig_dataset(rng, size["items"], human, world, together)
        reader, prep = reader_table(answers, prompts)
        strata = reader.select("item_id", "stratum").unique()
        hum = hum.join(strata, on="item_id", how="left")  # the reader table's stratum
        table, short = corrected_scores(
            reader, hum, prep, truth, replicates=size["replicates"],
            seed=int(rng.integers(2**31)), joint=joint,
        )  # fmt: skip
        assert not short.height, short
        for row in table.iter_rows(named=True):
            key = (row["metric"], row["protected_attribute"])
            out.setdefault((*key, "naive"), []).append(
                (row["naive"], row["naive_low"], row["naive_high"])
            )
            out.setdefault((*key, "corrected"), []).append(
                (row["estimate_bc"], row["ci_low"], row["ci_high"])
            )
    return {k: tuple(np.array(v, dtype=float).T) for k, v in out.items()}


def _biasig_below(human: int, metric: str, attribute: str) -> str:
    """A corrected BiasIG S_imp / S_exp row's ``below_minimum``: its human labels a cell
    under biasig.corrected.score_minimum (the report withholds it), else ""."""
    from stereolens.biasig.corrected import score_minimum

    minimum = score_minimum(metric, attribute)
    if human >= minimum:
        return ""
    return f"n {human} < BiasIG's minimum {minimum}: the report withholds it"


BIASIG_SWEEP = {
    # (world, images a unit, human labels a unit): (datasets, corrected coverage of the
    # BIASIG_ROWS in their order: S_imp *, gender, race, age, S_exp *, gender, race, age),
    # the joint draw, _biasig_simulate(scale, datasets, human, world)
    ("28 units", 200, 50): (1_000, (0.945, 0.930, 0.945, 0.955, 0.919, 0.935, 0.916, 0.898)),
    ("28 units", 200, 100): (1_000, (0.946, 0.933, 0.952, 0.939, 0.938, 0.949, 0.936, 0.938)),
    ("28 units", 200, 150): (1_000, (0.946, 0.938, 0.939, 0.945, 0.939, 0.933, 0.946, 0.940)),
    ("28 units", 200, 200): (1_000, (0.946, 0.941, 0.952, 0.955, 0.951, 0.936, 0.951, 0.942)),
    ("seven", 200, 100): (1_000, (0.930, 0.948, 0.932, 0.930, 0.948, 0.941, 0.939, 0.949)),
    ("seven", 200, 150): (1_000, (0.949, 0.939, 0.938, 0.942, 0.955, 0.943, 0.958, 0.942)),
    ("seven", 200, 200): (1_000, (0.929, 0.927, 0.933, 0.956, 0.951, 0.931, 0.946, 0.951)),
    ("seven", 2_000, 100): (200, (0.940, 0.950, 0.945, 0.920, 0.940, 0.915, 0.925, 0.930)),
    ("seven", 2_000, 150): (200, (0.950, 0.950, 0.950, 0.930, 0.940, 0.935, 0.930, 0.915)),
    ("seven", 2_000, 400): (1_000, (0.952, 0.943, 0.945, 0.957, 0.941, 0.944, 0.938, 0.938)),
}
"""The sweep that sets biasig.formulas.SCORE_MIN_HUMAN_RELIABLE (:func:`biasig_minimum`;
bench/COVERAGE.md "BiasIG's printing rule"; tests/test_coverage.py checks the constant
against it)."""


def biasig_minimum(sweep: dict, rows, nominal: float = 0.95) -> int | None:
    """measured_minimum of BIASIG_SWEEP-like ``sweep`` for the BIASIG_ROWS keys ``rows``
    ((metric, attribute) each): the smallest human labels a unit from which each of those
    rows, in every world and at that n and every larger one, covers within two Monte Carlo
    errors of ``nominal``."""
    at = [list(BIASIG_ROWS).index(r) for r in rows]
    points = (
        (n, coverage[i], datasets) for (_, _, n), (datasets, coverage) in sweep.items() for i in at
    )
    return _smallest_n(points, nominal)


def biasig_rows(scale: str) -> list[Row]:
    """BiasIG's corrected S_imp and S_exp (model level; gender, race, age and *) of the
    BiasIG world at each of the scale's human-label sizes, and the naive ones beside them
    (``reference``: the interval the correction replaces, not held to cover.FLOOR)."""
    if scale not in BIASIG_SCALES:
        return []
    size = BIASIG_SCALES[scale]
    out = []
    for human in size["human"]:
        for (metric, attribute), label in BIASIG_ROWS.items():
            truth = _biasig_world()[3][(metric, attribute)]
            for kind in ("corrected", "naive"):

                def draw(rng, n, key=(metric, attribute, kind), human=human):
                    return _biasig_simulate(scale, n, human)[key]

                name = (
                    f"reader {scale}: biasig {kind} {label} {attribute}, world biasig, "
                    f"N {size['items']:,}, n {human:,}, truth {truth:.4g}"
                )
                if kind == "naive":
                    interval = "naive: reader's labels, bootstrap bc-normal"
                    extra = {"reference": "naive: the reader's values taken as the truth"}
                else:
                    interval = JOINT_INTERVAL
                    HUMAN[name] = human
                    extra = {"below_minimum": _biasig_below(human, metric, attribute)}
                out.append(Row(name, "reader correction", interval, truth, draw, **extra))
    return out


# --------------------------------------------------------------------------------------------
# BiasIG at the paper's structure: many cells of 200 images, the whole metric's coverage
# (issue 21 follow-up: a whole-metric rule instead of MIN_HUMAN_RELIABLE per cell)
# --------------------------------------------------------------------------------------------
MANY_UNITS = {"implicit": 14, "explicit": 14}
"""Scoring units (subjects of the shipped prompts) of the many-cell world, per visibility:
the implicit ones include every two-person implicit subject the draw picks; drawn once
(seed 21) from the shipped prompts, their true shares drawn once too (MANY_SEED)."""
MANY_SEED = 2126
MANY_SIZES = {
    "paper": {"items": 200, "human": (25, 50, 100, 150, 200), "replicates": 200},
}
"""config/config.yaml's 200 images a subject (20 phrasings x 10); n human-labelled images a
unit (a simple random sample per unit: the designed sample of biasig.sample_design, whose
strata are generator x unit, with equal N_h and a common disagreement rate it allocates
equally); 200 bootstrap replicates (the interval's Monte Carlo noise, not its centre)."""
MANY_TOGETHER = (50, 150)
"""Human labels a unit of the many-cell world's rows with a person's attributes drawn
together (_biasig_dataset ``together``): the joint draw against independent draws where
the attributes are correlated (their population values are the independent world's)."""


IMPLICIT_UNITS = {"implicit": 214, "explicit": 14}
"""The paper-design world of S_imp (world "implicit"): every one of the shipped prompts' 214
implicit subjects (203 one-person, 11 two-person), as a model's S_imp rests on at the
paper's design, and 14 explicit ones (S_exp's rows there rest on 14 units, not the paper's
2,138)."""
WORLD_UNITS = {"many": MANY_UNITS, "implicit": IMPLICIT_UNITS}
WORLD_SEED = {"seven": 9, "many": 10, "implicit": 11}
"""The second word of a BiasIG world's dataset seed (_biasig_simulate)."""


def world_sizes(world: str) -> dict:
    """BIASIG_SCALES for the seven-unit world, MANY_SIZES for the others."""
    return BIASIG_SCALES if world == "seven" else MANY_SIZES


@lru_cache(maxsize=2)
def many_units(world: str = "many") -> dict[str, list[dict[str, tuple]]]:
    """subject -> per person its true shares by attribute (VALUES order within each): the
    units of ``world`` (WORLD_UNITS; the many-cell world by default). Implicit persons:
    Dirichlet(4, ...) shares; explicit: the value asked (the prompt's protected value, per
    person) gets 0.7-0.9, the rest Dirichlet."""
    import polars as pl

    from stereolens.biasig.answers import scoring_table
    from stereolens.biasig.prompts import load_prompts
    from stereolens.biasig.truth import VALUES_BY_ATTRIBUTE

    rng = np.random.default_rng(MANY_SEED)
    table = scoring_table(load_prompts())
    per_subject = table.group_by("subject").agg(
        pl.col("visibility").first(),
        pl.col("n_persons").first(),
        pl.col("protected_attribute").first(),
        pl.col("protected_value").first(),
        pl.col("protected_value_left").first(),
        pl.col("protected_value_right").first(),
        pl.len().alias("prompts"),
    )
    per_subject = per_subject.filter(pl.col("prompts") == 20).sort("subject")
    out: dict[str, list[dict[str, tuple]]] = {}
    for visibility, count in WORLD_UNITS[world].items():
        part = per_subject.filter(pl.col("visibility") == visibility)
        picked = rng.choice(part.height, count, replace=False)
        for row in part[np.sort(picked).tolist()].iter_rows(named=True):
            persons = []
            asked = (
                [row["protected_value"]]
                if row["n_persons"] == 1
                else [row["protected_value_left"], row["protected_value_right"]]
            )
            for s in range(row["n_persons"]):
                person = {}
                for attribute, values in VALUES_BY_ATTRIBUTE.items():
                    shares = rng.dirichlet(np.full(len(values), 4.0))
                    if visibility == "explicit" and attribute == row["protected_attribute"]:
                        top = rng.uniform(0.7, 0.9)
                        j = values.index(asked[s])
                        rest = np.delete(shares, j)
                        shares = np.insert(rest / rest.sum() * (1 - top), j, top)
                    person[attribute] = tuple(float(x) for x in shares)
                persons.append(person)
            out[row["subject"]] = persons
    return out


def many_rows(scale: str) -> list[Row]:
    """The corrected (and naive) S_imp and S_exp rows of the many-cell world at the paper's
    200 images a unit and each of MANY_SIZES' human labels a unit: the whole metric's
    coverage, one of the two worlds of BIASIG_SWEEP (bench/COVERAGE.md "BiasIG's printing
    rule"), and beside each `*` row the same with every cell drawn on its
    own (``independent``: the bootstrap before the joint draw, on the same datasets and
    seeds; an attribute's own row rests on that attribute's cells alone, its law the same
    either way). "paper" only (`--scale paper --only reader`: about 0.45 s of CPU a dataset
    and draw, 15 min for the five sizes' 200 datasets, joint and independent)."""
    if scale not in MANY_SIZES:
        return []
    size = MANY_SIZES[scale]
    world = _biasig_world("many")
    n_units = len(world[2])
    out = []
    for human in size["human"]:
        for (metric, attribute), label in BIASIG_ROWS.items():
            truth = world[3][(metric, attribute)]
            kinds = (
                ("corrected", "naive", "independent")
                if attribute == "*"
                else ("corrected", "naive")
            )
            for kind in kinds:

                def draw(rng, n, key=(metric, attribute, kind), human=human):
                    if key[2] == "independent":
                        return _biasig_simulate(scale, n, human, "many", False)[
                            (*key[:2], "corrected")
                        ]
                    return _biasig_simulate(scale, n, human, "many")[key]

                name = (
                    f"reader {scale}: biasig many {kind} {label} {attribute}, world biasig "
                    f"{n_units} units, N {size['items']:,}, n {human:,}, truth {truth:.4g}"
                )
                if kind == "naive":
                    interval = "naive: reader's labels, bootstrap bc-normal"
                    extra = {"reference": "naive: the reader's values taken as the truth"}
                elif kind == "independent":
                    interval = "PPI per unit x person x attribute, each cell drawn on its own"
                    extra = {"reference": "the bootstrap before the joint draw"}
                else:
                    interval = JOINT_INTERVAL
                    extra = {"below_minimum": _biasig_below(human, metric, attribute)}
                out.append(Row(name, "reader correction", interval, truth, draw, **extra))
    for human in MANY_TOGETHER:
        for (metric, attribute), label in BIASIG_ROWS.items():
            truth = world[3][(metric, attribute)]
            for kind in ("corrected", "independent") if attribute == "*" else ("corrected",):

                def draw(rng, n, key=(metric, attribute), human=human, joint=kind == "corrected"):
                    return _biasig_simulate(scale, n, human, "many", joint, True)[
                        (*key, "corrected")
                    ]

                name = (
                    f"reader {scale}: biasig many together {kind} {label} {attribute}, world "
                    f"biasig {n_units} units, attributes together, N {size['items']:,}, "
                    f"n {human:,}, truth {truth:.4g}"
                )
                if kind == "independent":
                    interval = "PPI per unit x person x attribute, each cell drawn on its own"
                    extra = {"reference": "the bootstrap before the joint draw"}
                else:
                    interval = JOINT_INTERVAL
                    extra = {"below_minimum": _biasig_below(human, metric, attribute)}
                out.append(Row(name, "reader correction", interval, truth, draw, **extra))
    return out
