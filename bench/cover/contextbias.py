"""ContextBias coverage rows (issue 20, item 1): pooled BI per condition (overall and per
cohort), the CA-U - CF shift of bootstrap.parquet and the generator-vs-generator differences
of comparisons.parquet, each dataset drawn from a world of known truth and run through the
metrics CLI's own code (contextbias.bootstrap.level_replicates, bootstrap_frame and
contextbias.comparisons.model_comparisons) on the long attributes table a real run writes.

Worlds: the planner's (stereolens.contextbias.design_worlds, tests/design_worlds.py). A
dataset draws the configured roles from the world's population of roles with replacement
and then images and labels (contextbias.design.draw_role_counts: what the role bootstrap
assumes: roles are a sample). Generator g2 is g1 with every label pulled towards each
dimension's most common label by ``G2_PULL`` (so that the generators differ and a
difference has a non-zero truth), and CA-U is CF pulled by ``PLANTED`` (a real shift).
Truth = the statistic at the world's population label shares (BI of the mean over the
population's roles, K = the labels the world has): the value the pooled BI estimates when
roles are a sample of a population of roles.

The comparisons (comparisons.parquet) are computed as the CLI does: on level replicates of
support "common" (K = the closed vocabulary's size, else the labels seen by either
generator; the world's labels are the schema's vocabulary), bias-corrected, Wald on t(R - 1)
with the role jackknife's standard error.
Their truth: the g2 - g1 difference of BI at the population label shares, K = the labels
the world has (for a closed dimension its vocabulary).

Below the minimum number of roles (contextbias.intervals.MIN_ROLES, config
contextbias.metrics.interval_min_roles) the tables print no interval: those rows report the
tables' interval_note (status "withheld"). ``python bench/cover/contextbias.py --sweep 5 10
20`` runs the paper world's rows with that many roles and every interval printed: the sweep
that sets the minimum (bench/COVERAGE.md).

All rows of one scale share their datasets (drawn once with a fixed seed, so the rows are the
same whichever runs first); each row reads its own statistic.
"""

from __future__ import annotations

import sys
import warnings
from functools import lru_cache
from pathlib import Path

import numpy as np

if __name__ == "__main__":  # python bench/cover/contextbias.py --sweep ...
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cover import Row  # noqa: E402

G2_PULL = 0.15
PLANTED = 0.10
SCALES = {
    # roles, seeds per prompt, role-bootstrap replicates (the CLI default is 1000)
    "test": {"roles": 30, "seeds": 4, "replicates": 200},
    "demo": {"roles": None, "seeds": 1, "replicates": 200},
    "paper": {"roles": None, "seeds": 10, "replicates": 200},
}
"""Replicates: 200 per dataset keep a percentile interval's own Monte Carlo error (about
0.7 points of coverage at 95%) small beside the 1.5-point error of 200 datasets."""


def _world(scale: str, roles: int | None = None):
    """The world of ``scale``: tests/design_worlds.small_world (4 dimensions in 2 cohorts,
    12 roles, 3 CF and 6 CA-U prompts) at "test"; the prior world of config/demo.yaml (its 2
    roles, its bank prompts) at "demo" and of config/config.yaml (92 roles, 30 dimensions)
    at "paper", with two generators."""
    from stereolens.contextbias import design_worlds as CW

    if scale == "test":
        root = Path(__file__).resolve().parents[2]
        sys.path.insert(0, str(root / "tests"))
        from design_worlds import small_world

        return small_world(SCALES["test"]["roles"], gens=("g1", "g2"), seed=0)
    from stereolens.config import load_config
    from stereolens.design.priors import load_priors

    config, _ = load_config("config/demo.yaml" if scale == "demo" else "config/config.yaml")
    config["contextbias"]["generators"] = ["g1", "g2"]
    world = CW.prior_world(config, load_priors(), seed=0)
    if roles is None:
        return world
    from dataclasses import replace

    # the sweep: ``roles`` configured roles with the bank's prompt counts, cycled
    prompts = np.resize(world.prompts, (roles, 2))
    return replace(world, prompts=prompts, role_names=[f"r{i}" for i in range(roles)])


def _pulled(world, w: float, g: int, cond: int | None = None) -> np.ndarray:
    """Role distributions of generator ``g`` (population roles, 2, labels), ``cond``'s
    pulled by w towards the default label of each dimension (None: both)."""
    p = np.array(world.roles[g], dtype=float)
    target = world.default_target()[g]
    sel = slice(None) if cond is None else cond
    p[:, sel] = (1 - w) * p[:, sel] + w * target
    return p


def _planted_world(world):
    """g2 = g1 pulled by G2_PULL (both conditions alike, so the dataset's random swap of a
    role's two conditions keeps it); CA-U's PLANTED pull is drawn after the swap
    (contextbias.design.draw_role_counts(planted=...))."""
    from dataclasses import replace

    g1 = np.array(world.roles[0], dtype=float)
    base = replace(world, roles=np.stack([g1, g1]))
    roles = np.stack([g1, _pulled(base, G2_PULL, 0)])
    return replace(world, roles=roles, labels_per_image=world.labels_per_image[:1].repeat(2, 0),
                   ok_rate=world.ok_rate[:1].repeat(2))  # fmt: skip


def _truth(world, vocabulary: bool = False) -> np.ndarray:
    """(G, 2 conditions, 1 + cohorts) population BI: overall, then each cohort. CF = the
    mean over the population's roles and both of their conditions (a dataset swaps them at
    random); CA-U = that pulled by PLANTED towards each dimension's most common label. K =
    the labels with a positive population share, or with ``vocabulary`` a closed
    dimension's vocabulary size (the comparisons' support "common"; labels the prior never
    draws still count)."""
    from stereolens.contextbias.design import bi_levels

    pop = world.population()  # (G, L)
    cau = (1 - PLANTED) * pop + PLANTED * world.default_target()
    kw = {"k_definition": "vocabulary", "vocab_k": world.vocab_k} if vocabulary else {}
    cf, cau = bi_levels(pop * 1e9, cau * 1e9, world.starts, world.member, **kw)
    return np.stack([cf, cau], axis=1)


@lru_cache(maxsize=8)
def _simulate(scale: str, n: int, roles: int | None = None, min_roles: int | None = None):
    """Per dataset: estimate, interval and interval_note of every statistic. Returns (names
    -> (est, lo, hi, notes) of length n) and the truth of each name. ``roles``: the paper
    world with that many roles (the sweep); ``min_roles``: the tables' minimum (None: the
    CLI's default)."""
    from stereolens.contextbias.intervals import MIN_ROLES

    world = _planted_world(_world(scale, roles))
    size = SCALES[scale]
    return _simulate_datasets(
        world, size, _truth(world), _truth(world, vocabulary=True), n, scale,
        MIN_ROLES if min_roles is None else min_roles,
    )  # fmt: skip


def _simulate_datasets(world, size, truth_lv, truth_common, n, scale, min_roles):
    import polars as pl

    from stereolens.contextbias.bootstrap import bootstrap_frame, level_replicates
    from stereolens.contextbias.comparisons import model_comparisons
    from stereolens.contextbias.design import draw_role_counts
    from stereolens.contextbias.design_worlds import attributes_table
    from stereolens.contextbias.intervals import withheld_note

    levels = ["overall"] + list(world.cohorts)
    rng = np.random.default_rng([20, n, len(scale)])
    _, by_role = draw_role_counts(world, size["seeds"], n, rng, keep_roles=True, planted=PLANTED)
    out: dict[str, list] = {}
    truth: dict[str, float] = {}
    for d in range(n):
        att = attributes_table(world, by_role, d)
        # CA-R is not simulated: the analyses need the three condition names only as names
        lv = level_replicates(att, replicates=size["replicates"], seed=d)
        note = withheld_note(lv.n_roles, min_roles)
        kinds = ("bc-t", "basic", "percentile")
        boot = pl.concat([bootstrap_frame(lv, i, min_roles) for i in kinds])
        cmp = None
        if len(world.generators) > 1:
            common = level_replicates(att, replicates=size["replicates"], seed=d, support="common")
            cmp, _ = model_comparisons(common, min_roles=min_roles)
        ix = {c: i for i, c in enumerate(("CF", "CA-R", "CA-U"))}
        for li, (cohort, dim) in enumerate(lv.levels):
            if dim != "*":
                continue
            name = "overall" if cohort == "*" else cohort
            tl = levels.index(name)
            for g, key in enumerate(lv.keys):
                for c, ci in (("CF", 0), ("CA-U", 1)):
                    reps = lv.replicates[g, :, li, ix[c]]
                    est = lv.estimate[g, li, ix[c]]
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)
                        lo, hi = np.nanpercentile(reps, [2.5, 97.5])
                    k = f"BI {c} {name} {key[-1]}"
                    if note is not None:  # no interval below the minimum (none printed)
                        lo = hi = np.nan
                    out.setdefault(k + " percentile", []).append((est, lo, hi, note))
                    out.setdefault(k + " basic", []).append(
                        (2 * est - np.nanmean(reps), 2 * est - hi, 2 * est - lo, note)
                    )
                    truth[k] = float(truth_lv[g, ci, tl])
        rows = boot.filter(
            (pl.col("dimension") == "*")
            & (pl.col("comparison") == "CA-U - CF")
            & (pl.col("model") != "*")
        )
        for r in rows.iter_rows(named=True):
            name = "overall" if r["cohort"] == "*" else r["cohort"]
            g = world.generators.index(r["model"])
            tl = levels.index(name)
            k = f"shift {name} {r['model']} {r['interval']}"
            est = r["estimate"] if r["interval"] == "percentile" else r["estimate_bc"]
            lo, hi = (np.nan if v is None else v for v in (r["ci_low"], r["ci_high"]))
            out.setdefault(k, []).append((est, lo, hi, r["interval_note"]))
            truth[k] = float(truth_lv[g, 1, tl] - truth_lv[g, 0, tl])
        if cmp is not None:
            for r in cmp.iter_rows(named=True):
                head, name = r["scope"].rsplit(" / ", 1)
                if head not in ("CF", "CA-U - CF"):
                    continue
                tl = levels.index(name)
                tc = truth_common
                if r["metric"] == "bi":
                    t = tc[1, 0, tl] - tc[0, 0, tl]
                else:
                    t = (tc[1, 1, tl] - tc[1, 0, tl]) - (tc[0, 1, tl] - tc[0, 0, tl])
                k = f"{r['metric']} g2 - g1 {head} {name}"
                lo, hi = (np.nan if v is None else v for v in (r["ci_low"], r["ci_high"]))
                out.setdefault(k, []).append((r["difference"], lo, hi, r["interval_note"]))
                truth[k] = float(t)
    arrays = {
        k: (*np.array([x[:3] for x in v], dtype=float).T, [x[3] for x in v]) for k, v in out.items()
    }
    return arrays, truth


def _row(
    scale: str, key: str, interval: str, note: str = "", roles: int | None = None,
    min_roles: int | None = None,
) -> Row:  # fmt: skip
    def draw(rng, n):
        return _simulate(scale, n, roles, min_roles)[0][key]

    truth = _truth_of(scale, key, roles)
    label = scale if roles is None else f"{scale}, {roles} roles"
    return Row(f"contextbias {label}: {key}", "contextbias", interval, truth, draw, note)


def _truth_of(scale: str, key: str, roles: int | None = None) -> float:
    world = _planted_world(_world(scale, roles))
    parts = key.split(" ")
    t = _truth(world, vocabulary=parts[0] in ("bi", "bi_shift"))
    levels = ["overall"] + list(world.cohorts)
    if parts[0] in ("BI", "shift"):
        parts = parts[:-1]  # the interval
    if parts[0] == "BI":
        return float(
            t[
                world.generators.index(parts[3]),
                ("CF", "CA-U").index(parts[1]),
                levels.index(parts[2]),
            ]
        )
    if parts[0] == "shift":
        g, tl = world.generators.index(parts[2]), levels.index(parts[1])
        return float(t[g, 1, tl] - t[g, 0, tl])
    tl = levels.index(parts[-1])
    if parts[0] == "bi":
        return float(t[1, 0, tl] - t[0, 0, tl])
    return float((t[1, 1, tl] - t[1, 0, tl]) - (t[0, 1, tl] - t[0, 0, tl]))


def rows(scale: str, roles: int | None = None, min_roles: int | None = None) -> list[Row]:
    """Per level (overall, then each cohort; at "test" overall only): BI under CF with the
    basic interval (a reference: the report prints no interval on BI itself), the CA-U - CF
    shift of bootstrap.parquet (bc-t, the default; basic and percentile, the released
    option, at "demo" and "paper"), and the g2 - g1 differences of comparisons.parquet (BI
    under CF, the shift). ``roles`` / ``min_roles``: the sweep (see the module docstring)."""
    world = _world(scale, roles)
    levels = ["overall"] + ([] if scale == "test" else list(world.cohorts))
    wald = "Wald t(R - 1), common K, bias-corrected, role jackknife se (comparisons.parquet)"
    kw = {"roles": roles, "min_roles": min_roles}
    out = []
    for lvl in levels:
        out.append(_row(scale, f"BI CF {lvl} g1 basic", "role bootstrap basic (reference)", **kw))
        out.append(
            _row(scale, f"shift {lvl} g1 bc-t", "role bootstrap bc-t (bootstrap.parquet)", **kw)
        )
        if scale != "test":
            out.append(_row(scale, f"shift {lvl} g1 basic", "role bootstrap basic (option)", **kw))
            out.append(
                _row(
                    scale, f"shift {lvl} g1 percentile", "role bootstrap percentile (released)",
                    **kw,
                )
            )  # fmt: skip
        out.append(_row(scale, f"bi g2 - g1 CF {lvl}", wald, **kw))
        out.append(_row(scale, f"bi_shift g2 - g1 CA-U - CF {lvl}", wald, **kw))
    return out


def main() -> int:
    """The sweep over the number of roles (bench/COVERAGE.md): paper-world rows with every
    interval printed, at each number of roles given."""
    import argparse
    import time

    from cover import run_row, table

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("--sweep", type=int, nargs="+", required=True, metavar="ROLES")
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for r in args.sweep:
        t0 = time.perf_counter()
        results = [run_row(row, args.datasets, args.seed) for row in rows("paper", r, 1)]
        print(f"\n{r} roles ({time.perf_counter() - t0:.0f} s)\n\n{table(results)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
