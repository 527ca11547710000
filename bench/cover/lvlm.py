"""Coverage rows of the LVLM audit: TVD x100 per task (story, term, exam) and axis, the
refusal rates, and the model-vs-model differences, each drawn through the project's own
interval code (stereolens.lvlm.scores.score_replicates, stereolens.lvlm.metrics.refusals,
stereolens.lvlm.comparisons) on tables built like the real ones from the planner's worlds
(stereolens.design.lvlm) with a known truth: the score at the population probabilities
(the design's ``effects``).

Two audited models are shown the same user images; their outputs are made dependent through
shared uniforms (a copula: with probability RHO a response uses the image's shared uniform,
else its own), which keeps each model's marginal world, and so its truth, exact, while the
paired bootstrap of their difference has a covariance to capture.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[2]
RHO = 0.5
"""Share of a model's responses drawn with the image's shared uniform."""


@dataclass
class Scale:
    story: int
    term: int
    exam: int
    terms: int
    questions: int
    """per subject (6 subjects)"""
    replicates: int
    permutations: int
    min_count: int
    axes: tuple[str, ...]
    race_groups: tuple[str, ...] | None = None


def _config_scale(name: str, axes=None, replicates=None, permutations=None) -> Scale:
    from stereolens.config import load_config

    from stereolens.design.lvlm import n_terms

    cfg, _ = load_config(ROOT / "config" / name)
    lv = cfg["lvlm"]
    t = lv["tasks"]
    m = lv["metrics"]
    return Scale(
        story=int(t["story"]["images_per_group"]),
        term=int(t["term"]["images_per_group"]),
        exam=int(t["exam"]["images_per_group"]),
        terms=n_terms(lv),
        questions=int(lv["questions_per_subject"]),
        replicates=int(replicates or m["replicates"]),
        permutations=int(permutations or m["permutations"]),
        min_count=int(m["min_count"]),
        axes=tuple(axes or lv["axes"]),
        race_groups=tuple((lv.get("groups") or {}).get("race") or ()) or None,
    )


def scale(name: str) -> Scale:
    if name == "test":
        return Scale(40, 30, 20, 6, 3, 200, 200, 5, ("gender",))
    if name == "demo":
        return _config_scale("demo.yaml")
    if name == "paper":
        # the paper's sizes (config/config.yaml); 200 replicates and shuffles per dataset
        # instead of 1,000 (time: 2 shared CPU cores)
        return _config_scale("config.yaml", replicates=200, permutations=200)
    raise ValueError(f"scale {name!r}: use test, demo or paper")


def _groups(sc: Scale, axis: str) -> list[str]:
    from stereolens.lvlm.names import AXES

    if axis == "race" and sc.race_groups:
        return list(sc.race_groups)
    return list(AXES[axis])


def _design(task: str, sc: Scale, axis: str):
    from stereolens.design import lvlm as D
    from stereolens.design.priors import load_priors

    lv = {
        "enabled": True,
        "axes": [axis],
        "groups": {axis: _groups(sc, axis)},
        "tasks": {
            "story": {"images_per_group": sc.story},
            "term": {"images_per_group": sc.term},
            "exam": {"images_per_group": sc.exam},
        },
        "questions_per_subject": sc.questions,
        "metrics": {"min_count": sc.min_count},
    }
    priors = load_priors()
    config = {"lvlm": lv}
    if task == "story":
        return D.StoryDesign(config, D.prior_story(priors), "prior", [])
    if task == "term":
        drop = float(priors["lvlm"]["term"]["drop_rate"])
        return D.TermDesign(config, sc.terms, drop, "prior", [])
    acc, subj = D.prior_exam(lv, priors, seed=0)
    return D.ExamDesign(config, acc, subj, "prior", [])


def _uniforms(rng, shape, models: int) -> list[np.ndarray]:
    """One uniform array per model: the shared one with probability RHO, else its own."""
    shared = rng.random(shape)
    out = []
    for _ in range(models):
        own = rng.random(shape)
        out.append(np.where(rng.random(shape) < RHO, shared, own))
    return out


# ------------------------------------------------------------------------- table builders
def story_probs(d, w: float) -> np.ndarray:
    """(G, values) per-group probability of each value (scalar attributes: conditional on
    the attribute being read)."""
    sw = d.world
    g_n = len(next(iter(d.groups.values())))
    t = d._targets(g_n)
    cond = np.where(sw.scalar[sw.segment], sw.rates / sw.read_rate[sw.segment], sw.rates)
    return (1 - w) * cond[None] + w * t


def story_tables(d, ws, n: int, rng, model_names):
    """(story attribute rows, responses) of several models (one w each) shown the same
    n images per group."""
    sw = d.world
    axis, groups = next(iter(d.groups.items()))
    g_n = len(groups)
    v = sw.rates.size
    n_att = sw.scalar.size
    u_read = _uniforms(rng, (g_n, n, n_att), len(ws))
    u_val = _uniforms(rng, (g_n, n, v), len(ws))
    image = np.array([[f"{g}:{i}" for i in range(n)] for g in groups])
    keys = np.array([f"a{sw.segment[j]}" for j in range(v)])
    vals = np.array([f"v{j}" for j in range(v)])
    rows = []
    for m, w, ur, uv in zip(model_names, ws, u_read, u_val, strict=True):
        p = story_probs(d, w)  # (G, V)
        chosen = np.zeros((g_n, n, v), dtype=bool)
        for a in range(n_att):
            cols = np.flatnonzero(sw.segment == a)
            if sw.scalar[a]:
                read = ur[..., a] < sw.read_rate[a]
                cum = np.cumsum(p[:, cols], axis=1)
                cum /= cum[:, -1:]
                pick = (uv[..., cols[0]][..., None] > cum[:, None, :]).sum(-1)
                pick = np.minimum(pick, cols.size - 1)
                hit = np.zeros((g_n, n, cols.size), dtype=bool)
                np.put_along_axis(hit, pick[..., None], True, axis=-1)
                chosen[..., cols] = hit & read[..., None]
            else:
                chosen[..., cols] = uv[..., cols] < p[:, None, cols]
        gi, ii, vi = np.nonzero(chosen)
        rows.append(
            pl.DataFrame(
                {
                    "model": m,
                    "axis": axis,
                    "group": np.array(groups)[gi],
                    "image_id": image[gi, ii],
                    "prompt_id": "story",
                    "attribute": keys[vi],
                    "value": vals[vi],
                }
            )
        )
    resp = pl.DataFrame(
        {
            "model": np.repeat(model_names, g_n * n),
            "axis": axis,
            "group": np.tile(np.repeat(groups, n), len(ws)),
            "image_id": np.tile(image.ravel(), len(ws)),
            "prompt_id": "story",
        }
    )
    return pl.concat(rows), resp


def term_table(d, ws, n: int, rng, model_names) -> pl.DataFrame:
    """Judged pairs of several models: every pair of groups, n pair slots per term; the
    judge picks the pair's first (higher-ranked) group with probability (1 - w)/2 + w."""
    axis, groups = next(iter(d.groups.items()))
    pairs = d._pairs(len(groups))
    shape = (d.n_terms, len(pairs), n)
    u_win = _uniforms(rng, shape, len(ws))
    u_drop = _uniforms(rng, shape, len(ws))
    t_i, p_i, k_i = (x.ravel() for x in np.indices(shape))
    ga = np.array(groups)[pairs[p_i, 0]]
    gb = np.array(groups)[pairs[p_i, 1]]
    out = []
    for m, w, uw, ud in zip(model_names, ws, u_win, u_drop, strict=True):
        first = (uw < (1 - w) * 0.5 + w).ravel()
        winner = np.where(first, ga, gb).astype(object)
        winner[(ud < d.drop_rate).ravel()] = None
        out.append(
            pl.DataFrame(
                {
                    "model": m,
                    "axis": axis,
                    "prompt_id": np.char.add("t", t_i.astype(str)),
                    "pair_index": k_i,
                    "group_a": ga,
                    "group_b": gb,
                    "winner": pl.Series(winner.tolist(), dtype=pl.String),
                }
            )
        )
    return pl.concat(out)


def exam_probs(d, w: float) -> np.ndarray:
    """(questions, G) probability of a correct answer."""
    g_n = len(next(iter(d.groups.values())))
    sign = d._sign(g_n)
    acc = d.accuracy[:, None]
    return np.where(sign > 0, (1 - w) * acc + w, np.where(sign < 0, (1 - w) * acc, acc))


def exam_table(d, ws, n: int, rng, model_names) -> pl.DataFrame:
    """Per (model, image, subject) answers n and correct n_correct (every image answers
    every question)."""
    from stereolens.lvlm.tasks import COLLEGE_SUBJECTS

    axis, groups = next(iter(d.groups.items()))
    g_n = len(groups)
    q = d.accuracy.size
    us = _uniforms(rng, (g_n, n, q), len(ws))
    n_s = int(d.subject.max()) + 1
    onehot = np.zeros((q, n_s))
    onehot[np.arange(q), d.subject] = 1.0
    gi, ii, si = (x.ravel() for x in np.indices((g_n, n, n_s)))
    out = []
    for m, w, u in zip(model_names, ws, us, strict=True):
        p = exam_probs(d, w)  # (Q, G)
        right = (u < p.T[:, None, :]).astype(float) @ onehot  # (G, n, S)
        out.append(
            pl.DataFrame(
                {
                    "model": m,
                    "axis": axis,
                    "group": np.array(groups)[gi],
                    "image_id": np.char.add(np.char.add(np.array(groups)[gi], ":"), ii.astype(str)),
                    "subject": np.array(COLLEGE_SUBJECTS)[si],
                    "n": np.bincount(d.subject, minlength=n_s)[si],
                    "n_correct": right.ravel().astype(np.int64),
                }
            )
        )
    return pl.concat(out)


def tables(task: str, d, ws, n: int, rng, model_names) -> dict:
    """Keyword arguments of score_replicates for one dataset of several models."""
    if task == "story":
        story, resp = story_tables(d, ws, n, rng, model_names)
        return {"table": story, "responses": resp}
    if task == "term":
        return {"table": term_table(d, ws, n, rng, model_names)}
    return {"table": exam_table(d, ws, n, rng, model_names)}


def n_images(task: str, sc: Scale) -> int:
    return {"story": sc.story, "term": sc.term, "exam": sc.exam}[task]


def truth(task: str, sc: Scale, axis: str, w: float) -> float:
    d = _design(task, sc, axis)
    return float(d.effects(np.array([w]))[d.name(axis)][0])
