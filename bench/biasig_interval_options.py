"""The interval options screened for BiasIG's corrected S_imp and S_exp (issue 21;
bench/COVERAGE.md, "BiasIG's corrected S_imp interval"): every option from the same replicates
of each dataset of bench/cover/reader.py's BiasIG worlds, through biasig.corrected.

The datasets are those of reader._biasig_simulate("paper", DATASETS, HUMAN, WORLD) (the same
seeds). corrected_scores runs as the pipeline runs it (bc-normal); a wrapper around the
reader_correction.corrected_metrics call it makes redraws that call's replicates from its seed
(checked against its estimate), adds a double bootstrap (INNER second-level replicates of
OUTER first-level ones, its own stream) and a jackknife over the items (each sample's items
left out one at a time: the labelled and the unlabelled of every unit x person, its attribute
cells together), and the options are computed from them: bc_normal (the pipeline's), normal
(plug-in +- z sd), percentile, basic, bc_pct (bias-corrected percentile), bca (acceleration
from the jackknife, Davison & Hinkley 1997 eq. 5.21 for several samples), logit_bc (bc-normal
on the logit scale), bc_jacksd (bc centre, the jackknife's sd), bc_double_se (bc centre, the
sd of 2 theta*_r - mean theta**_rj: reader_double's "once" centre), studentized
(bootstrap-t: t*_r = (theta*_r - point) / sd_j theta**_rj, the interval point - t* quantiles x
the sd of theta*, Davison & Hinkley 1997 eq. 5.7).

Usage: PYTHONPATH=src:bench python bench/biasig_interval_options.py WORLD HUMAN DATASETS
       [OUTER INNER]   (WORLD seven or many; OUTER 500, INNER 20 by default)
"""

import sys
import time

import numpy as np
from scipy import stats

sys.path.insert(0, "bench")

from cover import reader as R  # noqa: E402

from stereolens.metrics import reader_correction as rc  # noqa: E402
from stereolens.metrics import reader_double as rd  # noqa: E402
from stereolens.metrics.joint_bootstrap import bootstrap_joint, groups_of  # noqa: E402

Z = float(stats.norm.ppf(0.975))
ORDER = [(m, a) for m in ("s_imp", "s_exp") for a in ("*", "gender", "race", "age")]
RECORDS: list[dict] = []


def _loo_shares(cell) -> np.ndarray:
    """(N, K) corrected shares with item i left out (one stratum, lam 1, clip)."""
    if cell.cluster is not None or len(cell.strata) != 1:
        raise ValueError("the jackknife here takes one stratum and no clusters")
    n = cell.stratum.size
    mean_all = (cell.reader.sum(0)[None] - cell.reader) / (n - 1)
    r = cell.human - cell.reader[cell.labelled]
    w = cell.weight
    rect = np.tile((w @ r) / w.sum(), (n, 1))
    rect[cell.labelled] = ((w @ r)[None] - w[:, None] * r) / (w.sum() - w)[:, None]
    return rc.apply_off_simplex(mean_all + rect, "clip", cell.single_label)


def _recording(original, outer: int, inner: int):
    def wrapped(cells, functional, *, replicates=1000, seed=0, joint=None, **options):
        out = original(cells, functional, replicates=replicates, seed=seed, joint=joint, **options)
        points = [rc.cell_shares(c) for c in cells]
        lams = [p["lam"] for p in points]
        clip = [lambda s, c=c: rc.apply_off_simplex(s, "clip", c.single_label) for c in cells]
        boots = bootstrap_joint(cells, joint or [], replicates, np.random.default_rng(seed), lams)
        point = np.asarray(functional([p["corrected"][None] for p in points]))[0]
        reps = np.asarray(functional([f(b[1]) for f, b in zip(clip, boots, strict=True)]))
        rng = np.random.default_rng([seed, 7])
        double = bootstrap_joint(cells, joint or [], outer, rng, lams, False, inner)
        d_outer = np.asarray(functional([f(b[1]) for f, b in zip(clip, double, strict=True)]))
        second = [f(b[3]).reshape(-1, b[3].shape[-1]) for f, b in zip(clip, double, strict=True)]
        d_inner = np.asarray(functional(second)).reshape(outer, inner, -1)
        thetas, samples = [], []
        for g, group in enumerate(groups_of(len(cells), joint or [])):
            n = cells[group[0]].stratum.size
            shares = [np.broadcast_to(p["corrected"], (n, p["corrected"].size)) for p in points]
            for i in group:
                shares[i] = _loo_shares(cells[i])
            thetas.append(np.asarray(functional(shares)))
            labelled = np.zeros(n, bool)
            labelled[cells[group[0]].labelled] = True
            samples.append(2 * g + labelled)
        estimate = np.array([o["estimate_bc"] for o in out])
        assert np.allclose(estimate, 2 * point - np.nanmean(reps, 0), equal_nan=True)
        RECORDS.append(
            {"point": point, "reps": reps, "outer": d_outer, "inner": d_inner,
             "theta": np.concatenate(thetas), "sample": np.concatenate(samples)}
        )  # fmt: skip
        return out

    return wrapped


def _acceleration(theta: np.ndarray, sample: np.ndarray) -> float:
    """BCa's a from the jackknife of several samples (Davison & Hinkley 1997, eq. 5.21)."""
    num = den = 0.0
    for s in np.unique(sample):
        t = theta[sample == s]
        if t.size > 1:
            infl = (t.size - 1) * (t.mean() - t)
            num += (infl**3).sum() / t.size**3
            den += (infl**2).sum() / t.size**2
    return num / (6.0 * den**1.5) if den > 0 else 0.0, float(np.sqrt(den))


def _percentile_bc(point, reps, a):
    z0 = stats.norm.ppf(np.mean(reps < point) + 0.5 * np.mean(reps == point))
    za = stats.norm.ppf([0.025, 0.975])
    return tuple(np.quantile(reps, stats.norm.cdf(z0 + (z0 + za) / (1 - a * (z0 + za)))))


def options(point, reps, outer, inner, theta, sample) -> dict[str, tuple[float, float]]:
    """Every option's (low, high) of one row."""
    reps = reps[np.isfinite(reps)]
    sd, est = reps.std(ddof=1), 2 * point - reps.mean()
    a, sd_jack = _acceleration(theta, sample)
    lo, hi = np.quantile(reps, [0.025, 0.975])
    logit = np.log(np.clip(reps, 1e-9, 1 - 1e-9) / (1 - np.clip(reps, 1e-9, 1 - 1e-9)))
    lp = np.log(point / (1 - point))
    lc, ls = 2 * lp - logit.mean(), logit.std(ddof=1)
    t = (outer - point) / inner.std(1, ddof=1)
    t_lo, t_hi = np.quantile(t[np.isfinite(t)], [0.025, 0.975])
    return {
        "bc_normal": (est - Z * sd, est + Z * sd),
        "normal": (point - Z * sd, point + Z * sd),
        "percentile": (lo, hi),
        "basic": (2 * point - hi, 2 * point - lo),
        "bc_pct": _percentile_bc(point, reps, 0.0),
        "bca": _percentile_bc(point, reps, a),
        "logit_bc": tuple(1 / (1 + np.exp(-(lc + s * Z * ls))) for s in (-1, 1)),
        "bc_jacksd": (est - Z * sd_jack, est + Z * sd_jack),
        "bc_double_se": rd.double_bias_corrected(point, outer, inner, 0.95, None, "once")[1:],
        "studentized": (point - t_hi * outer.std(ddof=1), point - t_lo * outer.std(ddof=1)),
    }


def main(world: str, human: int, datasets: int, outer: int = 500, inner: int = 20) -> None:
    from stereolens.biasig import corrected

    start = time.process_time()
    corrected.rc.corrected_metrics = _recording(rc.corrected_metrics, outer, inner)
    prompts, truth, _, population = R._biasig_world(world)
    size = R.world_sizes(world)["paper"]
    rng = np.random.default_rng([21, R.WORLD_SEED[world], datasets, human])
    hits: dict = {}
    for _ in range(datasets):
        answers, hum = R._biasig_dataset(rng, size["items"], human, world)
        reader, prep = corrected.reader_table(answers, prompts)
        hum = hum.join(reader.select("item_id", "stratum").unique(), on="item_id", how="left")
        RECORDS.clear()
        table, _ = corrected.corrected_scores(
            reader, hum, prep, truth, replicates=size["replicates"], seed=int(rng.integers(2**31))
        )
        (rec,) = RECORDS
        keys = [(m, a) for m, a in table.select("metric", "protected_attribute").rows()]
        for j, key in enumerate(k for k in keys if k[0] != "eta"):
            row = [rec[f][..., j] if f != "sample" else rec[f] for f in
                   ("point", "reps", "outer", "inner", "theta", "sample")]  # fmt: skip
            for name, (lo, hi) in options(*row).items():
                lo, hi = max(lo, 0.0), min(hi, 1.0)
                hit = hits.setdefault(name, {}).setdefault(key, [])
                hit.append((lo <= population[key] <= hi, hi - lo))
    print(f"{world}, 200 images a unit, n {human}, {datasets} datasets; coverage (width)")
    print("| option | " + " | ".join(f"{m[2:].upper()} {a}" for m, a in ORDER) + " |")
    for name, by_key in hits.items():
        cells = [np.mean(by_key[k], 0) for k in ORDER]
        print(f"| {name} | " + " | ".join(f"{100 * c:.1f}% ({w:.4g})" for c, w in cells) + " |")
    print(f"CPU {time.process_time() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:]))
