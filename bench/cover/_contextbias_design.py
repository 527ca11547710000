"""ContextBias's aggregate corrected rows at the paper's structure (bench/cover/reader.py, issue
21): means over roles and pooled BI of 92 roles whose cells hold 30-100 images, with few human
labels a cell, through contextbias.corrected's own tables and the joint draw.

World: one generator x condition, ROLES roles, role r with SIZES[r] images (30 ... 100, even
steps) and a share WOMEN[r] of women (0.1 ... 0.5); long hair 0.9 / 0.1 and a bag 0.8 / 0.05
for a woman / a man (bench/cover/_contextbias_pooled.py's dimensions), the issue's reader
(10% / 2%) on each dimension independently, a simple random sample of n images a role (all
of them for n "all", capped at the role's images) labelled by humans on every dimension, K = 2
(k_definition "model"). Rows: ``bi_role`` (gender, people, *), ``bi_role_mm`` (people, *)
from corrected_means.role_mean_table; ``bi_pooled`` (people, *) from
contextbias.corrected._summary_table of the pooled rows. Truth: the mean over roles
of each role's BI (both role means), BI of the size-weighted pooled shares (pooled).
The "-mean" rows (:func:`simulate_generators`): their means over two generators of this world
(model "*"), g1 read 10% / 2%, g2 2% / 2% (_contextbias_pooled.READERS); the same truth.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cover._contextbias_pooled import READERS, _arrays, _bi, _role_cells, truth_at

ROLES = 92
"""The paper's roles (config/config.yaml: all 92)."""
SIZES = np.round(np.linspace(30, 100, ROLES)).astype(int)
"""Images a role x condition cell (the paper's design: 30-100)."""
WOMEN = np.linspace(0.1, 0.5, ROLES)
"""The roles' true shares of women."""
DESIGN_N = (2, 5, 10, 20, 30, 0)
"""Human labels a cell swept (0: every image of the cell)."""
REPLICATES = 200
"""Bootstrap replicates a dataset."""
DIMENSIONS = ("gender_presentation", "hair", "bag")
KEYS = (
    "role gender", "role people", "role *", "role-mm people", "role-mm *",
    "pooled people", "pooled *", "role-mean people", "role-mean *", "role-mm-mean people",
    "role-mm-mean *", "pooled-mean people", "pooled-mean *",
)  # fmt: skip
"""The rows, "<metric> <dimension or cohort>": role = bi_role, role-mm = bi_role_mm, pooled =
bi_pooled (its summary rows; its dimension rows are not measured here), "-mean": their model
"*" rows (bi_role_mean, bi_role_mm_mean, bi_pooled_mean; two generators); gender the dimension
row, people the cohort row, * the overall row."""
METRIC = {
    "role": "bi_role", "role-mm": "bi_role_mm", "pooled": "bi_pooled",
    "role-mean": "bi_role_mean", "role-mm-mean": "bi_role_mm_mean",
    "pooled-mean": "bi_pooled_mean",
}  # fmt: skip
"""corrected.parquet's metric of each KEYS row's kind."""


def truth() -> dict[str, float]:
    """Every KEYS row's population value."""
    each = [truth_at(w) for w in WOMEN]
    role = {k: float(np.mean([t[k] for t in each])) for k in each[0]}
    women = float(SIZES @ WOMEN / SIZES.sum())
    pooled = truth_at(women)  # the pooled shares are linear in the share of women
    out = {}
    for kind in METRIC:
        values = pooled if kind.startswith("pooled") else role
        for part, key in (("gender", "gender_presentation"), ("people", "people"), ("*", "*")):
            out[f"{kind} {part}"] = values[key]
    assert abs(_bi(women) - pooled["gender_presentation"]) < 1e-12
    return {k: out[k] for k in KEYS}


def cells_of(rng, human: int, readers: dict | None = None) -> dict:
    """One dataset's cells (condition CF): ``human`` labels a role (0: all); model g read
    10% / 2%, or per model of ``readers`` its (errors), its images its own (their ids
    prefixed with the model), the roles r00 ... shared."""
    cells = {}
    for model, errors in (readers or {"g": (0.10, 0.02)}).items():
        prefix = "" if readers is None else model
        for r in range(ROLES):
            n = SIZES[r] if human == 0 else min(human, SIZES[r])
            part = _role_cells(
                rng, int(SIZES[r]), int(n), float(WOMEN[r]), f"{prefix}r{r:02d}", errors
            )
            cells.update({(model, f"r{r:02d}", *key[2:]): c for key, c in part.items()})
    return cells


@lru_cache(maxsize=8)
def simulate(datasets: int, human: int, part: str = "both", generators: bool = False):
    """Per dataset (estimate, low, high) of every KEYS row of ``part`` ("role": the role
    means, "pooled": the pooled rows, "both"; the same datasets either way), and "reliable
    <key>": per dataset the row's interval_reliable (1.0 / 0.0) as written, three times.
    ``generators``: the "-mean" rows of two generators (READERS; corrected_means'
    generator_means, and cross_model_rows through _summary_table), their own datasets."""
    import polars as pl

    from stereolens.contextbias import corrected as cc
    from stereolens.contextbias.corrected_means import generator_means, role_mean_table

    readers = READERS if generators else None
    role_table = generator_means if generators else role_mean_table
    rng = np.random.default_rng([21, 31 if generators else 30, datasets, human])
    k_of = {(g, d): 2 for g in (readers or {"g": None}) for d in DIMENSIONS}
    name = {metric: kind for kind, metric in METRIC.items()}
    shown = {"gender_presentation": "gender", "*": None}
    out: dict[str, list] = {}
    for _ in range(datasets):
        seed = int(rng.integers(2**31))
        cells = cells_of(rng, human, readers)
        opts = {"replicates": REPLICATES, "seed": seed}
        tables = []
        if part != "pooled":
            tables.append(role_table(cc._bi_rows(cells, k_of, 0.0), "cohort", 0.0, opts))
        if part != "role":
            pooled = cc._pooled_rows(cells, k_of, 0.0)
            tables.append(cc._summary_table(pooled, "cohort", opts).drop("k"))
        table = pl.concat(tables, how="diagonal_relaxed").filter(pl.col("metric").is_in(list(name)))
        for r in table.iter_rows(named=True):
            where = shown.get(r["dimension"], "") if r["dimension"] != "*" else None
            label = r["cohort"] if where is None else where
            key = f"{name[r['metric']]} {label}"
            if key in KEYS and r["model"] == ("*" if generators else "g"):
                out.setdefault(key, []).append((r["estimate_bc"], r["ci_low"], r["ci_high"]))
                reliable = float(r["interval_reliable"])
                out.setdefault(f"reliable {key}", []).append((reliable,) * 3)
    return _arrays(out)


def _below(key: str, human: int) -> str:
    """A row's ``below_minimum``: under its metric's corrected_rule minimum, or a metric
    without one (per cell, MIN_HUMAN_RELIABLE), else ""."""
    from stereolens.contextbias.corrected_rule import AGGREGATE_MIN_LABELLED

    metric = METRIC[key.split()[0]]
    if metric not in AGGREGATE_MIN_LABELLED:
        return f"{metric} keeps MIN_HUMAN_RELIABLE per cell: the report withholds it"
    minimum = AGGREGATE_MIN_LABELLED[metric]
    if human == 0 or human >= minimum:
        return ""
    return f"n {human} < {metric}'s minimum {minimum}: the report withholds it"


def rows(human_of: dict) -> list:
    """The paper-scale Rows of every KEYS row at each DESIGN_N; each row's labels a cell in
    ``human_of`` (0: every image)."""
    from cover import Row

    values = truth()
    out = []
    for human in DESIGN_N:
        for key in KEYS:
            per = "all" if human == 0 else f"{human:,}"
            mean = key.split()[0].endswith("-mean")
            name = (
                f"reader paper: contextbias design {key}, {'2 generators x ' if mean else ''}"
                f"{ROLES} roles x 3 dimensions, N 30-100 a role, n {per} a role, "
                f"truth {values[key]:.4g}"
            )
            human_of[name] = human

            def draw(rng, n, key=key, human=human, mean=mean):
                part = "pooled" if key.startswith("pooled") else "role"
                return simulate(n, human, part, mean)[key]

            out.append(
                Row(name, "reader correction",
                    ("PPI per role, mean over 2 generators drawn independently, " if mean
                     else "PPI per role, ") + "a role's dimensions drawn jointly, "
                    + ("normal" if key.startswith("role-mm") else "bc-normal"),
                    values[key], draw, below_minimum=_below(key, human))
            )  # fmt: skip
    return out


NA = float("nan")
DESIGN_SWEEP: dict[tuple[int, int], tuple[float, ...]] = {
    # (human labels a role, 0: all; datasets): the corrected coverage of the KEYS rows in
    # their order (role gender, people, *; role-mm people, *; pooled people, *; the means
    # over two generators: role-mean people, *; role-mm-mean people, *; pooled-mean
    # people, *), NaN: not run;
    # role-mm with its interval "normal" (corrected_means.mm_interval; with bc-normal it had
    # 0.835 / 0.830 at 10, 0.700 / 0.710 at 20, 0.680 / 0.680 at 30, 0.705 / 0.715 with all,
    # 0.755 / 0.751 at 20 over 1,000 datasets)
    (10, 200): (0.920, 0.945, 0.895, NA, NA, 0.920, 0.920, *(NA,) * 6),
    (20, 200): (0.980, 0.940, 0.950, 0.930, 0.900, 0.945, 0.910)
    + (0.945, 0.945, 0.915, 0.885, 0.950, 0.945),
    (30, 200): (0.960, 0.950, 0.940, NA, NA, 0.915, 0.940, *(NA,) * 6),
    (0, 200): (0.965, 0.950, 0.955, 0.935, 0.960, 0.940, 0.955, *(NA,) * 6),
    (10, 1_000): (NA, NA, NA, NA, NA, 0.925, 0.941, *(NA,) * 6),
    (20, 1_000): (0.940, 0.946, 0.951, NA, NA, NA, NA, 0.942, 0.941, 0.912, 0.897, 0.937, 0.947),
}
"""The sweep behind contextbias.corrected_rule.AGGREGATE_MIN_LABELLED (:func:`simulate`;
bench/COVERAGE.md "ContextBias at the paper's design"; tests/test_coverage.py checks the
constants against it with :func:`design_minimum`)."""
METRIC_KEYS = {
    "bi_role": ("role gender", "role people", "role *"),
    "bi_role_mm": ("role-mm people", "role-mm *"),
    "bi_pooled": ("pooled people", "pooled *"),
    "bi_role_mean": ("role-mean people", "role-mean *"),
    "bi_role_mm_mean": ("role-mm-mean people", "role-mm-mean *"),
    "bi_pooled_mean": ("pooled-mean people", "pooled-mean *"),
}
"""The KEYS rows of each corrected.parquet metric."""


def design_minimum(sweep: dict, metric: str, nominal: float = 0.95) -> int | None:
    """The smallest human labels a role of ``sweep`` (DESIGN_SWEEP-like; "all" counts as
    the largest) from which every row of ``metric``, at that n and every larger one and at
    every dataset count, covers within two Monte Carlo errors of ``nominal``
    (reader._smallest_n); None where even every image labelled does not."""
    from cover.reader import _smallest_n

    at = [KEYS.index(k) for k in METRIC_KEYS[metric]]
    points = (
        (n or max(SIZES) + 1, coverage[i], datasets)
        for (n, datasets), coverage in sweep.items()
        for i in at
        if np.isfinite(coverage[i])
    )
    found = _smallest_n(points, nominal)
    return 0 if found == max(SIZES) + 1 else found
