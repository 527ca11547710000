"""BiasIG's power check: the planner's predicted power of S_imp, S_exp and eta against
compute_metrics on answers tables drawn from the planted world, and the report's tests."""

from __future__ import annotations

import math
from dataclasses import astuple

import numpy as np
import polars as pl
from scipy import stats

from stereolens.biasig import design as B
from stereolens.biasig import design_worlds as BW
from stereolens.design.check import CheckResult, CheckSize, check_result, predicted_power
from stereolens.design.sampling import multinomial


def difference_rejects(
    table: pl.DataFrame,
    model_a: str,
    model_b: str,
    level: float = 0.05,
    ci: float = 0.95,
    family: int = 1,
) -> bool:
    """The report's test of two models (metrics.compare.pairwise): a two-sided Wald test of
    b - a of score_bc, se = hypot(se_a, se_b) from the model rows' intervals, at level /
    ``family`` (Holm's first step; 1 = unadjusted)."""
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
    truth, simulated at the run's sizes). Its size is the level by construction."""
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
    of one model's simulated dataset: implicit counts (U, 2, 9) and explicit hits / usable
    answers (U, 2) spread over numbered images, every row ok. With ``rng`` each attribute's
    values are shuffled over the images."""
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


def power_check(
    design: B.BiasIGDesign, name: str, n: int, w: float, size: CheckSize
) -> CheckResult:
    """Predicted power of ``name`` (biasig.s_imp_diff, s_exp_diff, eta, eta_interval)
    against compute_metrics at ``replicates`` on answers tables drawn from the planted world
    (eta: :func:`eta_rejects` against ``sims`` null datasets of an independent seed)."""
    import copy

    from stereolens.biasig.metrics import compute_metrics

    datasets, sims, replicates, level, seed = astuple(size)
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
    return check_result(design, name, n, w, pred, sims, out)


def _unit_counts(design: B.BiasIGDesign, n: int, dist: np.ndarray, rng) -> np.ndarray:
    """(implicit units, 2, 9) counts of one dataset of ``n`` images per prompt."""
    from stereolens.biasig.truth import ATTRIBUTES, SLICES

    wr = design.world
    n_img = design.n_phr_imp * n
    ok = np.where(wr.used, rng.binomial(n_img, wr.ok_rate)[:, None], 0)  # persons share images
    return np.concatenate([multinomial(ok, dist[..., SLICES[a]], rng) for a in ATTRIBUTES], axis=-1)
