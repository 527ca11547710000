"""Check the planner's simulation against the real metric pipeline: predicted power against the
pipeline's rejection rate on simulated datasets, with Monte Carlo errors and a goodness of fit
(docs/planner.md, "The check")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import polars as pl
from scipy import stats

from stereolens.design import biasig as B
from stereolens.design import biasig_worlds as BW
from stereolens.design import contextbias as C
from stereolens.design import contextbias_worlds as CW
from stereolens.design import lvlm as L
from stereolens.design.power import power_curve
from stereolens.design.sampling import multinomial


@dataclass
class CheckResult:
    name: str
    size: int
    w: float
    effect: float
    """Population effect at w."""
    predicted: float
    predicted_se: float
    observed: float
    observed_se: float
    predicted_sims: int
    observed_datasets: int

    @property
    def z(self) -> float:
        """The two-proportion z of observed against predicted: their difference over the
        Monte Carlo error both would have if they shared one rate (the pooled rate of the
        predicted_sims and observed_datasets draws; at least 1/(2n) of each, so that no
        rejections at all still has an error). The error of each rate at its own value
        understates the error near 0: 3 rejections of 150 would claim 0.011 where a rate
        of 0.05 has 0.018."""
        n_p, n_o = self.predicted_sims, self.observed_datasets
        pooled = (self.predicted * n_p + self.observed * n_o) / (n_p + n_o)
        var = max(pooled * (1 - pooled), 0.5 / min(n_p, n_o)) * (1 / n_p + 1 / n_o)
        return (self.observed - self.predicted) / math.sqrt(var)


def goodness_of_fit(results: list[CheckResult]) -> dict[str, float]:
    """Predicted against observed rejection rates over ``results`` (independent cases):
    chi2 = sum of z^2 with ``rows`` degrees of freedom and its upper-tail p-value, and the
    mean z (observed - predicted: below 0, the planner promises more rejections than the
    pipeline makes)."""
    z = np.array([r.z for r in results], dtype=float)
    chi2 = float((z**2).sum())
    return {
        "rows": int(z.size),
        "chi2": chi2,
        "p_value": float(stats.chi2.sf(chi2, z.size)) if z.size else float("nan"),
        "mean_z": float(z.mean()) if z.size else float("nan"),
    }


def _se(p: float, n: int) -> float:
    # a floor of 1/(2n) keeps 0 and 1 from claiming no error at all
    return math.sqrt(max(p * (1 - p), 0.5 / n) / n)


def predicted_power(design, name: str, n: int, w: float, sims: int, level: float, seed: int):
    """(rate, se) of the planner's prediction at strength w (grid [0, w])."""
    rng = np.random.default_rng([seed, 101])
    grid = np.array([0.0, w]) if w > 0 else np.array([0.0])
    sim = design.simulate(n, grid, sims, rng)
    spec = next(s for s in design.specs() if s.name == name)
    curve = power_curve(
        spec, sim.estimates[name], level, shift=sim.shift.get(name), scale=sim.scale.get(name)
    )
    p = float(curve[-1])
    return p, _se(p, sims)


def _result(design, name, n, w, pred, sims, rejected: list[bool]) -> CheckResult:
    effect = float(design.effects(np.array([w]))[name][0])
    obs = float(np.mean(rejected))
    return CheckResult(
        name, n, w, effect, pred[0], pred[1], obs, _se(obs, len(rejected)), sims, len(rejected)
    )


# ----------------------------------------------------------------------------- ContextBias
def contextbias_check(
    design: C.ContextBiasDesign,
    n: int,
    w: float,
    *,
    name: str = "contextbias.bi_shift",
    datasets: int = 100,
    sims: int = 400,
    replicates: int = 200,
    level: float = 0.05,
    seed: int = 0,
) -> CheckResult:
    """Predicted power of ``name`` against cluster_bootstrap's interval on ``datasets``
    attribute tables drawn directly from the planted world."""
    from stereolens.contextbias.bootstrap import cluster_bootstrap

    pred = predicted_power(design, name, n, w, sims, level, seed)
    rng = np.random.default_rng([seed, 202])
    _, by_role = C.draw_role_counts(design.world, n, datasets, rng, keep_roles=True, planted=w)
    level_name = {s.name: s for s in design.specs()}[name]
    model, cohort = _cb_row(design, level_name.name)
    out = []
    for d in range(datasets):
        table = CW.attributes_table(design.world, by_role, d)
        boot = cluster_bootstrap(
            table, replicates=replicates, seed=seed + d, k_definition=design.k_definition,
            overall=design.overall, single_label_bi=design.single_label_bi,
            interval=design.interval, min_roles=1,
        )  # fmt: skip
        # min_roles 1: the interval itself, also below the tables' minimum
        row = boot.filter(
            (pl.col("model") == model)
            & (pl.col("cohort") == cohort)
            & (pl.col("dimension") == "*")
            & (pl.col("comparison") == "CA-U - CF")
        )
        lo, hi = row["ci_low"][0], row["ci_high"][0]
        out.append(bool(lo is not None and (lo > 0 or hi < 0)))
    return _result(design, name, n, w, pred, sims, out)


def _cb_row(design: C.ContextBiasDesign, name: str) -> tuple[str, str]:
    """(model, cohort) of the bootstrap row an effect name refers to."""
    if ":" in name:
        return name.split(":", 1)[1], "*"
    parts = name.split(".")
    cohort = parts[2] if len(parts) > 2 else "*"
    return "*", cohort


# ----------------------------------------------------------------------------- BiasIG
def difference_rejects(
    table: pl.DataFrame,
    model_a: str,
    model_b: str,
    level: float = 0.05,
    ci: float = 0.95,
    family: int = 1,
) -> bool:
    """The report's test of two models (stereolens.metrics.compare.pairwise): a two-sided
    Wald test of difference = b - a of the bias-corrected scores (score_bc, as
    biasig.comparisons compares S_imp and S_exp) with the bootstrap standard error of the
    difference,
    Holm-adjusted within the family of all model pairs of one (benchmark, metric, scope).
    BiasIG resamples images within each model, so the two models' replicates are
    independent and sd(rep_b - rep_a) = hypot(se_a, se_b), each se read from the model
    row's interval (width / (2 z_(1+ci)/2)). ``family`` = the pairs in the family: the
    test rejects at level / family, Holm's first (strictest) step, which declares the pair
    whatever the other pairs show; 1 = the unadjusted test (the planner's ``MDE`` column;
    ``MDE (Holm)`` is at level / family)."""
    rows = table.filter(pl.col("level") == "model")
    if "protected_attribute" in rows.columns:
        rows = rows.filter(pl.col("protected_attribute") == "*")
    if "protected_value" in rows.columns:
        rows = rows.filter(pl.col("protected_value") == "*")
    z_ci = stats.norm.ppf(0.5 + ci / 2)
    vals = {}
    for r in rows.iter_rows(named=True):
        vals[r["variant"]] = (r["score_bc"], (r["ci_high"] - r["ci_low"]) / (2 * z_ci))
    (sa, ea), (sb, eb) = vals[model_a], vals[model_b]
    se = math.hypot(ea, eb)
    return bool(se > 0 and abs(sb - sa) / se > stats.norm.ppf(1 - level / (2 * family)))


def eta_rejects(estimate: float, null_estimates: np.ndarray, level: float = 0.05) -> bool:
    """The planner's test of eta (``biasig.eta``): |eta - 0.5| above the (1 - level)
    quantile of |eta - 0.5| in the world's null (both sides of every pair at their ground
    truth, simulated at the run's sizes). Its size is the level by construction; the
    report's bootstrap interval of eta (``biasig.eta_interval``) almost never excludes 0.5
    with no effect (no-effect rate 0.000: a replicate's deviations from the truth add the
    resampling noise to the observed noise, so the squared deviations behind alpha, and
    with them the interval, are about twice as wide as the estimate's spread)."""
    null = np.abs(np.asarray(null_estimates, dtype=float))
    null = null[np.isfinite(null)]
    return bool(null.size and abs(estimate - 0.5) > np.quantile(null, 1.0 - level))


def answers_table(
    design: B.BiasIGDesign,
    model: str,
    imp_counts: np.ndarray | None,
    exp_hits: np.ndarray | None,
    exp_usable: np.ndarray | None,
    rng: np.random.Generator | None = None,
) -> pl.DataFrame:
    """The answers table (model, image_id, prompt_id, position, gender, race, age, status)
    of one model's simulated dataset: implicit counts (U, 2, 9) spread over numbered images
    of each unit, explicit hits / usable answers (U, 2) as images showing the value asked or
    another value of its attribute. Every row is ok (count "paper" counts them all). With
    ``rng`` the values of each attribute are shuffled over the images (independent across
    attributes, as the planner's world draws them)."""
    from stereolens.biasig.truth import ATTRIBUTES, SLICES, VALUES

    wr = design.world
    units = wr.units
    prompt_ids = units["prompt_id"].to_list()
    persons = units["n_persons"].to_list()
    rows: dict[str, list] = {k: [] for k in ("image_id", "prompt_id", "position", *ATTRIBUTES)}

    def add(u: int, image: int, s: int, values: list[str]) -> None:
        rows["image_id"].append(f"{model}|{u}|{image}")
        rows["prompt_id"].append(prompt_ids[u][image % len(prompt_ids[u])])
        rows["position"].append("single" if persons[u] == 1 else ("left", "right")[s])
        for a, v in zip(ATTRIBUTES, values, strict=True):
            rows[a].append(v)

    if imp_counts is not None:
        for i, u in enumerate(wr.imp):
            for s in range(persons[u]):
                cols = []
                for a in ATTRIBUTES:
                    c = imp_counts[i, s, SLICES[a]]
                    vals = np.repeat(np.array(VALUES[SLICES[a]]), c)
                    cols.append(rng.permutation(vals) if rng is not None else vals)
                n = min(len(c) for c in cols)
                for image in range(n):
                    add(int(u), image, s, [c[image] for c in cols])
    if exp_hits is not None:
        asks = BW.asked_values(wr)
        for i, u in enumerate(wr.exp):
            for s in range(persons[u]):
                ask = asks[i, s]
                attr = ATTRIBUTES[int(B.SEGMENT[ask])]
                sl = SLICES[attr]
                other = next(v for v in VALUES[sl] if v != VALUES[ask])
                for image in range(int(exp_usable[i, s])):
                    vals = ["male", "White", "young"]
                    vals[ATTRIBUTES.index(attr)] = VALUES[ask] if image < exp_hits[i, s] else other
                    add(int(u), image, s, vals)
    frame = pl.DataFrame(rows, schema={k: pl.String for k in rows})
    return frame.with_columns(pl.lit(model).alias("model"), pl.lit("ok").alias("status"))


def biasig_check(
    design: B.BiasIGDesign,
    name: str,
    n: int,
    w: float,
    *,
    datasets: int = 100,
    sims: int = 400,
    replicates: int = 200,
    level: float = 0.05,
    seed: int = 0,
) -> CheckResult:
    """Predicted power of ``name`` (biasig.s_imp_diff, s_exp_diff, eta, eta_interval)
    against the real pipeline (compute_metrics at ``replicates``) on answers tables drawn
    directly from the planted world. eta: the pipeline's estimate against the null quantile
    of ``sims`` null datasets of the planner (an independent seed), :func:`eta_rejects`."""
    import copy

    from stereolens.biasig.metrics import compute_metrics

    design = copy.copy(design)
    design.replicates = replicates  # the prediction emulates the interval at these replicates
    pred = predicted_power(design, name, n, w, sims, level, seed)
    wr = design.world
    rng = np.random.default_rng([seed, 303])
    which = {
        "biasig.s_imp_diff": "implicit", "biasig.s_exp_diff": "explicit", "biasig.eta": "eta",
        "biasig.eta_interval": "eta",
    }  # fmt: skip
    table_name = which[name]
    prompts = design.world.prompts
    null = None
    if name == "biasig.eta":
        sim0 = design.simulate(n, np.array([0.0]), sims, np.random.default_rng([seed, 505]))
        null = sim0.estimates["biasig.eta"][0]
    out = []
    for d in range(datasets):
        tables = []
        if table_name == "eta":
            gt, target = design._side_targets()
            side_dist = (1 - w) * gt + w * target
            dist = np.zeros_like(wr.dist_a)
            for s in (0, 1):
                ok = wr.side_of[:, s] >= 0
                dist[ok, s] = side_dist[wr.side_of[ok, s]]
            counts = _unit_counts(design, n, dist, rng)
            tables.append(answers_table(design, "A", counts, None, None, rng))
        elif name == "biasig.s_imp_diff":
            dist_b = (1 - w) * wr.dist_a + w * design._gt_norm()
            for model, dist in (("A", wr.dist_a), ("B", dist_b)):
                counts = _unit_counts(design, n, dist, rng)
                tables.append(answers_table(design, model, counts, None, None, rng))
        else:
            acc_b = (1 - w) * wr.acc_a + w
            for model, acc in (("A", wr.acc_a), ("B", acc_b)):
                n_img = design.n_phr_exp * n
                usable = np.where(wr.exp_used, rng.binomial(n_img, wr.ok_rate)[:, None], 0)
                hits = rng.binomial(usable, acc)
                tables.append(answers_table(design, model, None, hits, usable))
        answers = pl.concat(tables)
        res = compute_metrics(
            answers, prompts, replicates=replicates, seed=seed + d, which=(table_name,),
            ceiling_draws=0, eta_variant=wr.eta_variant, count=design.count,
            scoring_unit=design.scoring_unit,
        )[table_name]  # fmt: skip
        if table_name == "eta":
            row = res.filter(pl.col("pair") == "*") if "pair" in res.columns else res
            if null is not None:
                out.append(eta_rejects(row["eta_total"][0], null, level))
                continue
            lo, hi = row["ci_low"][0], row["ci_high"][0]
            out.append(bool(lo is not None and (lo > 0.5 or hi < 0.5)))
        else:
            out.append(difference_rejects(res, "A", "B", level))
    return _result(design, name, n, w, pred, sims, out)


def _unit_counts(design: B.BiasIGDesign, n: int, dist: np.ndarray, rng) -> np.ndarray:
    """(implicit units, 2, 9) counts of one dataset of ``n`` images per prompt."""
    from stereolens.biasig.truth import ATTRIBUTES, SLICES

    wr = design.world
    n_img = design.n_phr_imp * n
    ok = np.where(wr.used, rng.binomial(n_img, wr.ok_rate)[:, None], 0)  # persons share images
    return np.concatenate([multinomial(ok, dist[..., SLICES[a]], rng) for a in ATTRIBUTES], axis=-1)


# ----------------------------------------------------------------------------- LVLM
def lvlm_check(
    design,
    axis: str,
    n: int,
    w: float,
    *,
    datasets: int = 100,
    sims: int = 400,
    permutations: int = 200,
    level: float = 0.05,
    seed: int = 0,
) -> CheckResult:
    """Predicted power of ``lvlm.tvd.<task>.<axis>`` against overall_scores' permutation test
    (p_perm <= level) on tables drawn directly from the planted world."""
    from stereolens.lvlm.scores import overall_scores

    name = design.name(axis)
    pred = predicted_power(design, name, n, w, sims, level, seed)
    groups = design.groups[axis]
    rng = np.random.default_rng([seed, 404])
    kw = {"min_count": design.min_count, "formulas": {design.task: design.formula}}
    out = []
    for d in range(datasets):
        if design.task == "story":
            table, responses = story_tables(design, groups, n, w, rng, axis)
            extra = {"responses": responses}
        else:
            make = term_table if design.task == "term" else exam_table
            table, extra = make(design, groups, n, w, rng, axis), {}
        res = overall_scores(design.task, table, n_boot=0, permutations=permutations,
                             seed=seed + d, **extra, **kw)  # fmt: skip
        p = res["p_perm"][0]
        out.append(bool(p is not None and np.isfinite(p) and p <= level))
    return _result(design, name, n, w, pred, sims, out)


def story_tables(design: L.StoryDesign, groups, n, w, rng, axis="axis"):
    """(story attributes, responses) of one dataset: ``n`` stories per group."""
    sw = design.world
    t = design._targets(len(groups))
    rows = {k: [] for k in ("group", "image_id", "attribute", "value")}
    resp = {k: [] for k in ("group", "image_id")}

    def add(group: str, image_id: str, a: int, v: int) -> None:
        rows["group"].append(group)
        rows["image_id"].append(image_id)
        rows["attribute"].append(f"a{a}")
        rows["value"].append(f"v{v}")

    for g, group in enumerate(groups):
        ids = [f"{group}|{i}" for i in range(n)]
        resp["group"] += [group] * n
        resp["image_id"] += ids
        for a in range(sw.scalar.size):
            cols = np.flatnonzero(sw.segment == a)
            if sw.scalar[a]:
                cond = sw.rates[cols] / sw.read_rate[a]
                p = (1 - w) * cond + w * t[g, cols]
                read = rng.binomial(n, sw.read_rate[a])
                counts = multinomial(read, p, rng)
                values = np.repeat(cols, counts)
                stories = rng.permutation(n)[: values.size]  # independent across attributes
                for i, v in zip(stories, values, strict=True):
                    add(group, ids[i], a, v)
            else:
                for v in cols:
                    c = rng.binomial(n, (1 - w) * sw.rates[v] + w * t[g, v])
                    for i in rng.permutation(n)[:c]:  # independent across values
                        add(group, ids[i], a, v)
    base = {"model": "m", "axis": axis, "prompt_id": "story"}
    table = pl.DataFrame(rows, schema={k: pl.String for k in rows}).with_columns(
        *(pl.lit(v).alias(k) for k, v in base.items())
    )
    responses = pl.DataFrame(resp).with_columns(*(pl.lit(v).alias(k) for k, v in base.items()))
    return table, responses


def term_table(design: L.TermDesign, groups, n, w, rng, axis="axis") -> pl.DataFrame:
    """Judged pairs of one dataset: every pair of groups ``n`` times per term; the first
    group of a pair (ranked higher) wins with probability (1 - w) / 2 + w."""
    rows = {k: [] for k in ("prompt_id", "pair_index", "group_a", "group_b", "winner")}
    for term in range(design.n_terms):
        for a, b in combinations(range(len(groups)), 2):
            valid = rng.random(n) >= design.drop_rate
            first = rng.random(n) < (1 - w) * 0.5 + w
            for k in range(n):
                rows["prompt_id"].append(f"t{term}")
                rows["pair_index"].append(k)
                rows["group_a"].append(groups[a])
                rows["group_b"].append(groups[b])
                rows["winner"].append(
                    None if not valid[k] else groups[a] if first[k] else groups[b]
                )
    return pl.DataFrame(rows).with_columns(pl.lit("m").alias("model"), pl.lit(axis).alias("axis"))


def exam_table(design: L.ExamDesign, groups, n, w, rng, axis="axis") -> pl.DataFrame:
    """Graded answers of one dataset: ``n`` user images per group answer every question."""
    sign = design._sign(len(groups))
    rows = {k: [] for k in ("group", "image_id", "prompt_id", "subject", "correct")}
    for g, group in enumerate(groups):
        acc = design.accuracy
        p = (1 - w) * acc + w if sign[g] > 0 else (1 - w) * acc if sign[g] < 0 else acc
        right = rng.random((n, acc.size)) < p[None, :]
        for i in range(n):
            rows["group"] += [group] * acc.size
            rows["image_id"] += [f"{group}|{i}"] * acc.size
            rows["prompt_id"] += [f"q{q}" for q in range(acc.size)]
            rows["subject"] += [f"s{s}" for s in design.subject]
            rows["correct"] += right[i].tolist()
    return pl.DataFrame(rows).with_columns(pl.lit("m").alias("model"), pl.lit(axis).alias("axis"))
