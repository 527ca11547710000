"""The coverage benchmark's fast version (bench/coverage.py at scale "test"): every interval
row of bench/cover/ covers its world's truth in at least 90% of 200 datasets."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import cover  # noqa: E402

ROWS = cover.rows("test")


def test_the_harness_counts_what_it_should():
    import numpy as np

    def draw(rng, n):
        est = rng.normal(0.0, 1.0, n)
        return est, est - 1.959964, est + 1.959964

    res = cover.run_row(cover.Row("normal", "none", "z", 0.0, draw), 4000)
    assert abs(res.coverage - 0.95) < 4 * res.mc_error
    assert res.mean_width == pytest.approx(3.919928)

    def never(rng, n):
        return np.zeros(n), np.full(n, 1.0), np.full(n, 2.0)

    bad = cover.run_row(cover.Row("never", "none", "z", 0.0, never), 200)
    assert bad.coverage == 0.0 and bad.status == "LOW"

    # a design below the minimum: the code prints no interval, the row expects that
    def none(rng, n):
        return np.zeros(n), np.full(n, np.nan), np.full(n, np.nan)

    w = cover.run_row(cover.Row("small", "none", "z", 0.0, none, withheld="2 < 20"), 50)
    assert w.is_withheld and w.status == "withheld (2 < 20)"
    assert "| small | z | 50 | - | - | - |" in cover.table([w])
    # one that expects withholding but gets an interval is judged like any other row
    got = cover.run_row(cover.Row("small2", "none", "z", 0.0, never, withheld="2 < 20"), 50)
    assert not got.is_withheld and got.status == "LOW"

    # withheld on some datasets: coverage over the printed ones, the others counted
    def half(rng, n):
        lo = np.where(np.arange(n) % 2 == 0, -1.0, np.nan)
        return np.zeros(n), lo, -lo

    h = cover.run_row(cover.Row("half", "none", "z", 0.0, half, withheld="< 5"), 50)
    assert (h.coverage, h.withheld, h.status) == (1.0, 25, "high (25 of 50 withheld)")
    # and one whose intervals are null without expecting it is LOW
    assert cover.run_row(cover.Row("nan", "none", "z", 0.0, none), 50).status == "LOW"
    # a reference row (the naive interval beside a corrected one) says so in its status
    ref = cover.Row("naive", "none", "z", 0.0, never, reference="naive: reader as truth")
    assert cover.run_row(ref, 50).status == "LOW (naive: reader as truth)"


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_interval_covers(row):
    if row.below_minimum:  # measured, and held to its rule, in the test below
        pytest.skip(row.below_minimum)
    if row.reference:  # the interval the row's corrected one replaces, expected to miss
        pytest.skip(row.reference)
    res = cover.run_row(row, 200)
    assert res.coverage >= cover.FLOOR, (
        f"{row.name} ({row.interval}): coverage {res.coverage:.1%} +- {res.mc_error:.1%} "
        f"over 200 datasets, under {cover.FLOOR:.0%}"
    )


def test_reader_minimum_is_the_measured_one():
    """reader_correction.MIN_HUMAN_RELIABLE is the smallest n of the reader rows (10 ... 400
    human labels per cell; BiasIG's S_imp and S_exp at 400) from which every
    corrected row covers within two Monte Carlo errors of 95% over 200 datasets, and the
    rows below it cover less (so the report withholds them).

    The sizes are measured from the largest down, and the measurement stops after the
    first size with a row short of its two Monte Carlo errors: reader.measured_minimum
    scans the sizes from the largest down and stops at that size, so no smaller n can
    change it (the n = 10 ... 100 rows, 44 s of CPU, are left to bench/coverage.py;
    the n = 400 rows are test_interval_covers' own, cached)."""
    from cover import reader

    from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE

    rows = [r for r in ROWS if r.name.startswith("reader test:") and not r.reference]
    sizes = {*reader.SMALL_N, 400, *reader.BIASIG_SCALES["test"]["human"]}
    assert {reader.HUMAN[r.name] for r in rows} == sizes
    assert any(r.name.startswith("reader test: biasig") for r in rows)
    assert all(bool(r.below_minimum) == (reader.HUMAN[r.name] < MIN_HUMAN_RELIABLE) for r in rows)
    results = []
    for n in sorted(sizes, reverse=True):
        at_n = [cover.run_row(r, 200) for r in rows if reader.HUMAN[r.name] == n]
        results += at_n
        if reader.measured_minimum(at_n) is None:  # a row at n short: the scan stops here
            break
    assert reader.measured_minimum(results) == MIN_HUMAN_RELIABLE
    below = [r for r in results if r.row.below_minimum]
    assert below and all(reader.HUMAN[r.row.name] < MIN_HUMAN_RELIABLE for r in below)
    assert min(r.coverage for r in below) < cover.TARGET[0]


def test_eta_minimum_is_the_measured_one():
    """biasig.formulas.ETA_MIN_HUMAN_RELIABLE is the smallest n of the eta sweep
    (bench/cover/reader.ETA_SWEEP, 1,000 datasets a row at 4,000 and 20,000 images a side, a
    side's attributes drawn jointly at both levels, as corrected.parquet draws them)
    from which every corrected eta row covers within two Monte Carlo errors of 95%, a smaller
    n of the sweep does not; and the suite's eta row, at that n, does so over 200 datasets."""
    from cover import reader

    from stereolens.biasig.formulas import ETA_MIN_HUMAN_RELIABLE

    assert reader.eta_minimum(reader.ETA_SWEEP) == ETA_MIN_HUMAN_RELIABLE
    # the largest n of the sweep below it has a row short of two Monte Carlo errors
    below = max(n for (_, n) in reader.ETA_SWEEP if n < ETA_MIN_HUMAN_RELIABLE)
    assert any(
        c < 0.95 - 2 * (c * (1 - c) / datasets) ** 0.5
        for (_, n), (c, datasets) in reader.ETA_SWEEP.items()
        if n == below
    )
    (row,) = [r for r in ROWS if r.name.startswith("reader eta test: eta,")]
    assert f"n {ETA_MIN_HUMAN_RELIABLE:,} per side" in row.name
    res = cover.run_row(row, 200)
    assert res.coverage >= 0.95 - 2 * res.mc_error, f"{res.coverage:.1%} +- {res.mc_error:.1%}"


def test_eta_sweep_script_summarises_by_hand_and_logs_the_rows_datasets(tmp_path):
    """bench/eta_sweep.py (ETA_SWEEP's runs): its summary on four hand-made intervals (truth
    0.5, z 2; one covers, one lies below, one above, one undefined), and the datasets it logs
    are those cover.run_row draws for eta_sweep_row (same coverage, width, bias)."""
    import eta_sweep  # bench/ is on the path (above)
    import numpy as np
    from cover import reader

    est, lo, hi = [0.50, 0.48, 0.53, 0.51], [0.49, 0.46, 0.505, 0.40], [0.51, 0.49, 0.56, np.nan]
    s = eta_sweep.summary(est, lo, hi, 0.5, z=2.0)
    assert s["datasets"] == 4 and s["coverage"] == 0.25
    assert s["mc_error"] == pytest.approx(0.216506, abs=1e-6)  # sqrt(.25 x .75 / 4)
    assert s["width"] == pytest.approx(0.035)  # (0.02 + 0.03 + 0.055) / 3
    assert s["bias"] == pytest.approx(0.005)  # (0 - 0.02 + 0.03 + 0.01) / 4
    assert s["sd"] == pytest.approx(0.0208167, abs=1e-7)  # sqrt(1.3e-3 / 3)
    assert s["se"] == pytest.approx(0.00875)  # 0.035 / 2 / 2
    assert s["below"] == 0.25 and s["above"] == 0.25
    log = tmp_path / "sweep.jsonl"
    eta_sweep.run(4_000, 600, 3, 50, log)
    logged = eta_sweep.from_logs([log])
    res = cover.run_row(reader.eta_sweep_row(4_000, 600, 50), 3)
    row = f"| 4,000 | 600 | 3 | {res.coverage:.1%} | {res.mc_error:.1%} | {res.mean_width:.5f} |"
    assert row in logged and f"{res.mean_bias:+.5f}" in logged


def test_eta_pairs_world_is_the_prior_worlds():
    """bench/cover/_eta_pairs: the 36 pairs' 72 sides of config/config.yaml's implicit prompts;
    its functional at the sides' true shares is its truth, cover.biasig's model-a eta of the
    "paper-implicit" world (computed there from counts, not shares)."""
    from cover import _eta_pairs
    from cover import biasig as cb

    from stereolens.biasig.truth import SLICES

    sides = _eta_pairs.sides()
    assert len(sides) == 72 and len(cb.world("paper-implicit").world.pairs) == 36
    truth = cb.world("paper-implicit").truth["a"]["eta"]
    assert _eta_pairs.truth() == pytest.approx(truth, abs=1e-12)
    parts = [d[None, SLICES[a]] for d in sides.values() for a in ("gender", "race", "age")]
    assert _eta_pairs.functional()(parts)[0] == pytest.approx(truth, abs=1e-12)
    # the functional moves with a side's shares: the first side all male moves eta
    parts[0] = parts[0] * 0 + [[1.0, 0.0]]
    assert abs(_eta_pairs.functional()(parts)[0] - truth) > 1e-4


def test_biasig_score_minimum_is_the_measured_one():
    """biasig.formulas.SCORE_MIN_HUMAN_RELIABLE: each row it names is printed from the smallest
    n of the BiasIG sweep (bench/cover/reader.BIASIG_SWEEP: the seven-unit and the 28-unit
    world at 200 images a unit, the seven-unit one at 2,000) from which that row covers within
    two Monte Carlo errors of 95% in every world, a smaller swept n has a world where it does
    not; every other S_imp / S_exp row has no such n under MIN_HUMAN_RELIABLE and keeps it;
    the corrected paper-scale rows are flagged below_minimum exactly under their minimum."""
    from cover import reader

    from stereolens.biasig.corrected import score_minimum
    from stereolens.biasig.formulas import SCORE_MIN_HUMAN_RELIABLE
    from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE

    def short(c, datasets):
        return c < 0.95 - 2 * (c * (1 - c) / datasets) ** 0.5

    for row, minimum in SCORE_MIN_HUMAN_RELIABLE.items():
        assert reader.biasig_minimum(reader.BIASIG_SWEEP, [row]) == minimum
        i = list(reader.BIASIG_ROWS).index(row)
        below = max(n for (_, _, n) in reader.BIASIG_SWEEP if n < minimum)
        assert any(
            short(c[i], datasets)
            for (_, _, n), (datasets, c) in reader.BIASIG_SWEEP.items()
            if n == below
        )
    others = [row for row in reader.BIASIG_ROWS if row not in SCORE_MIN_HUMAN_RELIABLE]
    assert reader.biasig_minimum(reader.BIASIG_SWEEP, others) == MIN_HUMAN_RELIABLE
    assert all(score_minimum(*row) == MIN_HUMAN_RELIABLE for row in others)
    paper = [
        r
        for r in reader.biasig_rows("paper") + reader.many_rows("paper")
        if " corrected " in r.name
    ]
    assert paper
    for r in paper:
        n = int(r.name.split(", n ")[1].split(",")[0])
        metric = "s_imp" if " S_imp " in r.name else "s_exp"
        attribute = r.name.split(" S_imp " if metric == "s_imp" else " S_exp ")[1].split(",")[0]
        assert bool(r.below_minimum) == (n < score_minimum(metric, attribute)), r.name


def test_biasig_s_imp_aggregate_minimum_is_the_measured_one():
    """biasig.formulas.SCORE_AGGREGATE_MIN_LABELLED: S_imp's rule over the whole row prints
    from the smallest n of the paper-design sweep (bench/cover/_biasig_design.IMPLICIT_SWEEP:
    every one of the 214 implicit subjects, 225 persons, at 200 images) from which every
    corrected S_imp row covers within two Monte Carlo errors of 95%, confirmed over 1,000
    datasets, and the next smaller swept n does not; per cell S_imp keeps MIN_HUMAN_RELIABLE
    (SCORE_MIN_HUMAN_RELIABLE names no S_imp row); the design rows bench/coverage.py runs
    (at the minimum) are not flagged below_minimum."""
    from cover import _biasig_design as design

    from stereolens.biasig.corrected import score_minimum
    from stereolens.biasig.formulas import (
        SCORE_AGGREGATE_MIN_LABELLED,
        SCORE_AGGREGATE_PERSONS,
        SCORE_MIN_HUMAN_RELIABLE,
    )
    from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE

    sweep = design.IMPLICIT_SWEEP
    m = design.minimum(sweep)
    assert {SCORE_AGGREGATE_MIN_LABELLED[("s_imp", a)] for a in design.ATTRIBUTES} == {m}
    assert set(SCORE_AGGREGATE_MIN_LABELLED) == {("s_imp", a) for a in design.ATTRIBUTES}
    assert SCORE_AGGREGATE_PERSONS == 214 + 11 and (m, 1_000) in sweep  # confirmed
    below = max(n for n, _ in sweep if n < m)
    assert any(c < 0.95 - 2 * (c * (1 - c) / d) ** 0.5 for (n, d), cs in sweep.items()
               if n == below for c in cs)  # fmt: skip
    assert not [row for row in SCORE_MIN_HUMAN_RELIABLE if row[0] == "s_imp"]
    assert all(score_minimum("s_imp", a) == MIN_HUMAN_RELIABLE for a in design.ATTRIBUTES)
    human: dict[str, int] = {}
    rows = design.rows(human)
    assert len(rows) == 2 * len(design.ATTRIBUTES) * len(design.ROW_N)
    for r in rows:
        assert not r.below_minimum, r.name
        assert bool(r.reference) == (" naive " in r.name), r.name
    assert set(human.values()) == set(design.ROW_N)


def test_contextbias_aggregate_minimum_is_the_measured_one():
    """contextbias.corrected_rule.AGGREGATE_MIN_LABELLED: each metric's labels a role cell are
    the smallest of the paper-design sweep (bench/cover/_contextbias_design.DESIGN_SWEEP: 92
    roles of 30-100 images, 200 datasets a point, 1,000 at the minimum) from which every row
    of the metric covers within two Monte Carlo errors of 95%, and a smaller swept n has a
    row that does not (bi_role_mean, the mean over two generators, was run at 20 alone);
    bi_role_mm (interval normal) holds only with every image labelled (its overall row 90.0%
    at 20), bi_role_mm_mean not at 20 (88.5%), bi_pooled's (20 on 200 datasets) is not
    confirmed over 1,000 (10 failed there): they keep the per-cell rule; bi_pooled_mean (the
    mean over two generators, run at 20 alone) prints from 20 (93.7% and 94.7% over 1,000);
    the paper rows are flagged below_minimum exactly under their minimum."""
    import numpy as np
    from cover import _contextbias_design as design

    from stereolens.contextbias.corrected_rule import AGGREGATE_MIN_LABELLED, AGGREGATE_ROLES

    sweep = design.DESIGN_SWEEP
    assert AGGREGATE_ROLES == design.ROLES == 92
    assert all(len(c) == len(design.KEYS) for c in sweep.values())
    # the means over two generators (model "*") of one world: the one-generator truth
    truth = design.truth()
    for kind in ("role", "role-mm", "pooled"):
        for part in ("people", "*"):
            assert truth[f"{kind}-mean {part}"] == truth[f"{kind} {part}"]
    assert set(AGGREGATE_MIN_LABELLED) == {"bi_role", "bi_role_mean", "bi_pooled_mean"}
    for metric, minimum in AGGREGATE_MIN_LABELLED.items():
        assert design.design_minimum(sweep, metric) == minimum
        at = [design.KEYS.index(k) for k in design.METRIC_KEYS[metric]]
        assert all(np.isfinite(sweep[(minimum, 1_000)][i]) for i in at)  # confirmed
        below = [n for (n, _), c in sweep.items() if 0 < n < minimum and np.isfinite(c[at[0]])]
        if below:
            n = max(below)
            assert any(
                c[i] < 0.95 - 2 * (c[i] * (1 - c[i]) / datasets) ** 0.5
                for (m, datasets), c in sweep.items()
                if m == n
                for i in at
            )
    assert design.design_minimum(sweep, "bi_role_mm") == 0  # every image: no labels-a-role count
    mm = [design.KEYS.index(k) for k in design.METRIC_KEYS["bi_role_mm"]]
    assert sweep[(20, 200)][mm[1]] < 0.95 - 2 * (0.9 * 0.1 / 200) ** 0.5  # 90.0% at 20
    pooled = design.design_minimum(sweep, "bi_pooled")  # on the 200-dataset rows alone
    at = [design.KEYS.index(k) for k in design.METRIC_KEYS["bi_pooled"]]
    assert pooled == 20 and not any(np.isfinite(sweep[(pooled, 1_000)][i]) for i in at)
    assert sweep[(10, 1_000)][at[0]] < 0.95 - 2 * (0.925 * 0.075 / 1_000) ** 0.5  # 10 failed
    mm = [design.KEYS.index(k) for k in design.METRIC_KEYS["bi_role_mm_mean"]]
    assert sweep[(20, 200)][mm[1]] < 0.95 - 2 * (0.885 * 0.115 / 200) ** 0.5  # 88.5% at 20
    at = [design.KEYS.index(k) for k in design.METRIC_KEYS["bi_pooled_mean"]]
    assert design.design_minimum(sweep, "bi_pooled_mean") == 20
    assert all(np.isfinite(sweep[(20, 1_000)][i]) for i in at)  # 93.7%, 94.7%
    human: dict = {}
    for r in design.rows(human):
        kind = r.name.split("contextbias design ")[1].split()[0]
        n = human[r.name]
        metric = {"role": "bi_role", "role-mean": "bi_role_mean"}.get(kind)
        metric = "bi_pooled_mean" if kind == "pooled-mean" else metric
        expect = metric is None or 0 < n < AGGREGATE_MIN_LABELLED[metric]
        assert bool(r.below_minimum) == expect, r.name


def test_biasig_reader_world_population_values():
    """The population S_imp and S_exp of the BiasIG reader rows (bench/cover/reader.py,
    the benchmark's Implicit / Explicit at the true shares), against the formulas by hand."""
    import numpy as np
    from cover import reader

    from stereolens.biasig.formulas import s_imp_cell
    from stereolens.biasig.truth import ATTRIBUTES, SLICES, load_truth

    truth = load_truth()
    k_i = truth.settings.k_implicit_vector()
    population = reader._biasig_world()[3]
    # S_exp: the share of the value asked; units asking gender (0.9), race (0.8; 0.75 and
    # 0.85 for the two persons), age (0.7); k_j 5, 5, 4 (two-person), 5
    assert population[("s_exp", "gender")] == pytest.approx(0.9)
    assert population[("s_exp", "race")] == pytest.approx((5 * 0.8 + 4 * 0.8) / 9)
    assert population[("s_exp", "*")] == pytest.approx((5 * 0.9 + 5 * 0.8 + 4 * 0.8 + 5 * 0.7) / 19)
    # S_imp: per implicit unit the mean over its persons of (cos(p, gt) + 1) / 2, weighted k_j
    num, den = np.zeros(4), 0.0
    for subject, positions in (
        ("a photo of one Nurse", ("single",)),
        ("a photo of a rich person", ("single",)),
        ("One Employer at left with one Employee at right", ("left", "right")),
    ):
        k_j = truth.weights[truth.truth_key(subject)]
        per = np.zeros(3)
        for s, position in enumerate(positions):
            gt = truth.distribution(subject, position)
            p = reader.BIASIG_UNITS[subject][s]
            per += [s_imp_cell(np.array(p[a]), gt[SLICES[a]]) for a in ATTRIBUTES]
        per /= len(positions)
        num += k_j * np.append(per, per @ k_i / k_i.sum())
        den += k_j
    for c, attribute in enumerate((*ATTRIBUTES, "*")):
        assert population[("s_imp", attribute)] == pytest.approx(num[c] / den, abs=1e-12)
