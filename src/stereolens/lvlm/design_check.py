"""LVLM's power check: the planner's predicted power of a TVD against overall_scores'
permutation test on tables drawn from the planted world."""

from __future__ import annotations

from dataclasses import astuple
from itertools import combinations

import numpy as np
import polars as pl

from stereolens.design.check import CheckResult, CheckSize, check_result, predicted_power
from stereolens.design.sampling import multinomial
from stereolens.lvlm import design as L


def power_check(design, name: str, n: int, w: float, size: CheckSize) -> CheckResult:
    """Predicted power of ``lvlm.tvd.<task>.<axis>`` against overall_scores' permutation test
    (p_perm <= level) on tables drawn directly from the planted world."""
    from stereolens.lvlm.scores import overall_scores

    datasets, sims, permutations, level, seed = astuple(size)
    axis = name.rsplit(".", 1)[-1]
    if design.name(axis) != name:
        raise ValueError(f"{name!r} is not an effect of the LVLM {design.task} design")
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
    return check_result(design, name, n, w, pred, sims, out)


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
