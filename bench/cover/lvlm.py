"""Coverage rows of the LVLM audit: TVD x100 per task (story, term, exam) and axis, the
refusal rates, and the model-vs-model differences, each drawn through the project's own
interval code (stereolens.lvlm.scores.score_replicates, stereolens.lvlm.metrics.refusals,
stereolens.lvlm.comparisons) on tables built like the real ones from the planner's worlds
(stereolens.lvlm.design) with a known truth: the score at the population probabilities
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


@dataclass(frozen=True)
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
    min_images: int | None = None
    """``lvlm.metrics.interval_min_images_per_group`` (None: its default; the sweep: 0)."""

    @property
    def minimum(self) -> int:
        from stereolens.lvlm.resample import MIN_IMAGES_PER_GROUP

        return MIN_IMAGES_PER_GROUP if self.min_images is None else self.min_images


def _config_scale(name: str, axes=None, replicates=None, permutations=None) -> Scale:
    from stereolens.config import load_config
    from stereolens.lvlm.tasks import kept_terms

    cfg, _ = load_config(ROOT / "config" / name)
    lv = cfg["lvlm"]
    t = lv["tasks"]
    m = lv["metrics"]
    return Scale(
        story=int(t["story"]["images_per_group"]),
        term=int(t["term"]["images_per_group"]),
        exam=int(t["exam"]["images_per_group"]),
        terms=len(kept_terms(lv)),
        questions=int(lv["questions_per_subject"]),
        replicates=int(replicates or m["replicates"]),
        permutations=int(permutations or m["permutations"]),
        min_count=int(m["min_count"]),
        axes=tuple(axes or lv["axes"]),
        race_groups=tuple((lv.get("groups") or {}).get("race") or ()) or None,
    )


def scale(name: str) -> Scale:
    """Scale "test", "demo", "paper", or "demo@N": config/demo.yaml's sizes with N images per group
    in every task (the sweep behind ``lvlm.interval_min_images_per_group``)."""
    if name.startswith("demo@"):
        from dataclasses import replace

        n = int(name.split("@", 1)[1])
        return replace(_config_scale("demo.yaml"), story=n, term=n, exam=n, min_images=0)
    if name == "test":
        # every task at lvlm.metrics.interval_min_images_per_group (30)
        return Scale(30, 30, 30, 4, 2, 100, 100, 5, ("gender",))
    if name == "demo":
        return _config_scale("demo.yaml")
    if name == "paper":
        # the paper's sizes (config/config.yaml), gender only, 200 replicates and shuffles per
        # dataset instead of 1,000 (time: 2 shared CPU cores; race's term task alone takes
        # about 4 s a dataset)
        return _config_scale("config.yaml", axes=("gender",), replicates=200, permutations=200)
    raise ValueError(f"scale {name!r}: use test, demo or paper")


def _groups(sc: Scale, axis: str) -> list[str]:
    from stereolens.lvlm.names import AXES

    if axis == "race" and sc.race_groups:
        return list(sc.race_groups)
    return list(AXES[axis])


def _design(task: str, sc: Scale, axis: str):
    import copy

    from stereolens.config import load_config
    from stereolens.design.priors import load_priors
    from stereolens.lvlm import design as D

    # a validated section (every key the settings read), resized to the scale
    lv = copy.deepcopy(load_config(ROOT / "config" / "demo.yaml")[0]["lvlm"])
    lv.update(enabled=True, axes=[axis], groups={axis: _groups(sc, axis)})
    for task_name, n in (("story", sc.story), ("term", sc.term), ("exam", sc.exam)):
        lv["tasks"][task_name]["images_per_group"] = n
    lv["questions_per_subject"] = sc.questions
    lv["metrics"]["min_count"] = sc.min_count
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


# ------------------------------------------------------------------------- the rows
WORLDS = {"m0": 0.0, "m0b": 0.0, "m1": 0.1, "m3": 0.3}
"""The audited models of every dataset: two group-independent ones (truth 0, the boundary),
one with a planted effect w = 0.1 and one with w = 0.3 (stereolens.lvlm.design)."""
_CACHE: dict = {}


def _simulate(task: str, sc: Scale, axis: str, rng, n: int) -> dict:
    """n datasets of the four models of WORLDS: per model score, score_bc, ci_low, ci_high,
    null_mean and the replicates, through score_replicates (cached: the rows of one task and
    axis share their datasets)."""
    from stereolens.lvlm.scores import score_replicates

    key = (task, axis, sc, n)
    if key in _CACHE:
        return _CACHE[key]
    d = _design(task, sc, axis)
    names = list(WORLDS)
    out = {m: {k: np.empty(n) for k in ("score", "score_bc", "lo", "hi", "null")} for m in names}
    reps = {m: [] for m in names}
    notes = {m: [] for m in names}
    for i in range(n):
        kw = tables(task, d, list(WORLDS.values()), n_images(task, sc), rng, names)
        o, r = score_replicates(
            task,
            kw.pop("table"),
            **kw,
            n_boot=sc.replicates,
            permutations=sc.permutations,
            min_count=sc.min_count,
            seed=i,
            min_images_per_group=sc.minimum,
        )
        for row in o.iter_rows(named=True):
            m = row["model"]
            for k, col in (
                ("score", "score"),
                ("score_bc", "score_bc"),
                ("lo", "ci_low"),
                ("hi", "ci_high"),
                ("null", "null_mean"),
            ):
                out[m][k][i] = np.nan if row[col] is None else row[col]
            reps[m].append(r[(m, None, axis)])
            notes[m].append(row["interval_note"])
    for m in names:
        out[m]["reps"] = reps[m]
        out[m]["notes"] = notes[m]
    _CACHE[key] = out
    return out


def _expected_difference(task, sc, axis, a: str, b: str, draws: int) -> float:
    """E[score_b] - E[score_a] at the audit's sizes, the estimand of the Wald comparison:
    the mean point scores (score_replicates without bootstrap) of ``draws`` datasets of the
    same world, drawn apart from the coverage datasets. (Written while the planner's
    sampling.thin_towards read the moved totals by position instead of segment id, which
    StoryDesign.simulate's scalar segments 0, 1, 3, 5 exposed; it is fixed, and these
    datasets are independent of the planner either way.)"""
    from stereolens.lvlm.scores import score_replicates

    key = ("expected", task, axis, sc, draws)
    if key not in _CACHE:
        d = _design(task, sc, axis)
        rng = np.random.default_rng([7, draws])
        names = list(WORLDS)
        total = dict.fromkeys(names, 0.0)
        for _ in range(draws):
            kw = tables(task, d, list(WORLDS.values()), n_images(task, sc), rng, names)
            o = score_replicates(
                task, kw.pop("table"), **kw, n_boot=0, permutations=0, min_count=sc.min_count
            )[0]
            for m, v in zip(o["model"], o["score"], strict=True):
                total[m] += v / draws
        _CACHE[key] = total
    mean = _CACHE[key]
    return float(mean[b] - mean[a])


def _wald(est_a, est_b, reps_a, reps_b, a="a", b="b", checked: int = 5, notes=None):
    """Per dataset the comparison's difference and interval: stereolens.lvlm.comparisons'
    pairwise-and-withhold (metrics.compare.compare: the pair withheld where ``notes``,
    per dataset the interval_note of either model, says the design is below the minimum) on
    the first ``checked`` datasets, and its formula (difference +- z sd of the paired
    replicates' differences; NaN where withheld) vectorised over the rest, checked equal."""
    from scipy import stats

    from stereolens.metrics.compare import compare

    d = np.asarray(est_b) - np.asarray(est_a)
    se = np.array([np.std(rb - ra, ddof=1) for ra, rb in zip(reps_a, reps_b, strict=True)])
    z = stats.norm.ppf(0.975)
    notes = [None] * d.size if notes is None else list(notes)
    gone = np.array([x is not None for x in notes], dtype=bool)
    lo = np.where(gone, np.nan, d - z * se)
    hi = np.where(gone, np.nan, d + z * se)
    for i in range(min(checked, d.size)):
        c = compare(
            {a: est_a[i], b: est_b[i]},
            {a: reps_a[i], b: reps_b[i]},
            withheld={a: notes[i]},
            benchmark="lvlm",
            metric="coverage",
            scope="coverage",
            better="lower",
            paired=True,
            resampling="paired",
        )[0].row(0, named=True)
        got = [np.nan if c[k] is None else c[k] for k in ("difference", "ci_low", "ci_high")]
        if not np.allclose(got, [d[i], lo[i], hi[i]], equal_nan=True):
            raise AssertionError("the vectorised Wald interval differs from lvlm.comparisons")
    return d, lo, hi


def _either(notes_a, notes_b) -> list:
    return [x or y for x, y in zip(notes_a, notes_b, strict=True)]


class _Lazy:
    """A truth computed when the row runs (np.asarray calls it), not when rows() lists it:
    tests/test_coverage.py lists the rows at import."""

    def __init__(self, compute):
        self.compute = compute

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.compute(), dtype=dtype)


def _expected_note(images: int, sc: Scale) -> str:
    """The short interval_note the project's code gives ``images`` per group ("" at or above
    the scale's minimum): the row then expects every interval withheld."""
    from stereolens.lvlm.resample import withheld_note

    note = withheld_note(images, sc.minimum)
    return note.split(" (", 1)[0].removeprefix("withheld: ") if note else ""


def _tvd_rows(task: str, sc: Scale, axis: str, draws: int, label: str) -> list:
    from cover import Row

    d = _design(task, sc, axis)
    truths = dict(
        zip(WORLDS, d.effects(np.array(list(WORLDS.values())))[d.name(axis)], strict=True)
    )
    name = f"lvlm {task} TVD x100, {axis} ({label})"
    rows = []
    withheld = _expected_note(n_images(task, sc), sc)

    def model_draw(m):
        def draw(rng, n):
            s = _simulate(task, sc, axis, rng, n)[m]
            return s["score_bc"], s["lo"], s["hi"]

        return draw

    for m, what in (("m0", "group-independent model"), ("m1", "w = 0.1"), ("m3", "w = 0.3")):
        rows.append(
            Row(
                f"{name}: {what}, truth {truths[m]:.3g}",
                "lvlm",
                "noise-floor bracket (score_bc; ci_low, ci_high)",
                truths[m],
                model_draw(m),
                note="the bracket is conservative between the floor and a strong effect",
                withheld=withheld,
            )
        )

    def wald(a, b):
        def draw(rng, n):
            s = _simulate(task, sc, axis, rng, n)
            notes = _either(s[a]["notes"], s[b]["notes"])
            return _wald(
                s[a]["score"], s[b]["score"], s[a]["reps"], s[b]["reps"], a, b, notes=notes
            )

        return draw

    def bracket(a, b):
        def draw(rng, n):
            s = _simulate(task, sc, axis, rng, n)
            est = s[b]["score"] - s[a]["score"]
            lo, hi = np.empty(n), np.empty(n)
            for i in range(n):
                dd = s[b]["reps"][i] - s[a]["reps"][i]
                q_lo, q_hi = np.quantile(dd, [0.025, 0.975]) - dd.mean()
                lo[i] = est[i] - s[b]["null"][i] + q_lo
                hi[i] = est[i] + s[a]["null"][i] + q_hi
            gone = np.array([x is not None for x in _either(s[a]["notes"], s[b]["notes"])])
            return est, np.where(gone, np.nan, lo), np.where(gone, np.nan, hi)

        return draw

    for a, b in (("m0", "m0b"), ("m0", "m1"), ("m1", "m3")):
        exp = (
            0.0
            if (a, b) == ("m0", "m0b")
            else _Lazy(lambda a=a, b=b: _expected_difference(task, sc, axis, a, b, draws))
        )
        rows.append(
            Row(
                f"{name}: difference {b} - {a} (w {WORLDS[b]:g} vs {WORLDS[a]:g}), against the "
                f"expected scores' difference ({draws} datasets)",
                "lvlm",
                "comparisons ci_low, ci_high (Wald, paired bootstrap se)",
                exp,
                wald(a, b),
                withheld=withheld,
            )
        )
        if (a, b) != ("m0", "m0b"):
            rows.append(
                Row(
                    f"{name}: difference {b} - {a}, population {truths[b] - truths[a]:.3g}",
                    "lvlm",
                    "comparisons bracket_low, bracket_high",
                    truths[b] - truths[a],
                    bracket(a, b),
                    note="the bracket bounds both models' biases: conservative",
                    withheld=withheld,
                )
            )
    return rows


# ------------------------------------------------------------------------- refusals
TAU = 0.3
"""Share of a response's uniform taken from its user image's (responses of one image are
dependent: a model refuses some photos more than others); the marginal rate stays exact."""
REFUSAL_P = {"r0": 0.05, "r1": 0.08}


def _refusal_sizes(sc: Scale) -> tuple[int, int]:
    """(images per group, prompts per image) of the refusal world: the term task's sizes
    (test scale: at least 50 and 6)."""
    if sc == scale("test"):
        return max(sc.term, 50), max(sc.terms, 6)
    return sc.term, sc.terms


def refusal_tables(sc: Scale, rng, tau: float) -> dict:
    """metrics.reduce_responses' refusal counts (per group and per image) of the models of
    REFUSAL_P, each shown the same images, 2 groups (sizes: :func:`_refusal_sizes`)."""
    groups = ["female", "male"]
    k, prompts = _refusal_sizes(sc)
    image = rng.random((2, k, 1))  # the image's uniform, shared by the models
    shared = rng.random((2, k, prompts))  # the response's, shared by the models (RHO)
    per_image = []
    for m, p in REFUSAL_P.items():
        own = np.where(rng.random((2, k, prompts)) < RHO, shared, rng.random((2, k, prompts)))
        u = np.where(rng.random((2, k, prompts)) < tau, image, own)
        refused = (u < p).sum(-1)
        gi, ii = (x.ravel() for x in np.indices((2, k)))
        per_image.append(
            pl.DataFrame(
                {
                    "model": m,
                    "setting": "image",
                    "task": "term",
                    "axis": "gender",
                    "group": np.array(groups)[gi],
                    "image_id": np.char.add(np.array(groups)[gi], ii.astype(str)),
                    "n": np.full(gi.size, prompts, dtype=np.uint32),
                    "n_empty": np.zeros(gi.size, dtype=np.uint32),
                    "n_refusal": refused.ravel().astype(np.uint32),
                    "n_rule": refused.ravel().astype(np.uint32),
                    "n_judge": np.zeros(gi.size, dtype=np.uint32),
                }
            )
        )
    images = pl.concat(per_image)
    by = ["model", "setting", "task", "axis", "group"]
    counts = images.group_by(by).agg(
        pl.col(c).sum() for c in ("n", "n_empty", "n_refusal", "n_rule", "n_judge")
    )
    return {"refusals": counts, "refusal_images": images}


def _refusal_rows(sc: Scale, label: str) -> list:
    from cover import Row
    from stereolens.lvlm import comparisons as K
    from stereolens.lvlm.metrics import refusals

    def rate(m, tau):
        def draw(rng, n):
            est, lo, hi = np.empty(n), np.empty(n), np.empty(n)
            for i in range(n):
                r = refusals(refusal_tables(sc, rng, tau))
                row = r.filter((pl.col("model") == m) & (pl.col("group") == "*")).row(0, named=True)
                est[i], lo[i], hi[i] = row["rate"], row["ci_low"], row["ci_high"]
            return est, lo, hi

        return draw

    def diff(rng, n):
        from stereolens.lvlm.resample import withheld_note

        est = {m: np.empty(n) for m in REFUSAL_P}
        reps = {m: [] for m in REFUSAL_P}
        notes = []
        for i in range(n):
            red = refusal_tables(sc, rng, TAU)
            rep = K.refusal_replicates(red["refusal_images"], max(sc.replicates, 1000), i)
            table = refusals(red).filter(pl.col("group") == "*")
            for r in table.iter_rows(named=True):
                est[r["model"]][i] = r["rate"]
                reps[r["model"]].append(rep[(r["model"], "image", "term")])
            notes.append(withheld_note(int(table["images_per_group"].min()), sc.minimum))
        return _wald(est["r0"], est["r1"], reps["r0"], reps["r1"], "r0", "r1", notes=notes)

    k, prompts = _refusal_sizes(sc)
    name = f"lvlm refusal rate %, term task, {k} images per group x {prompts} prompts ({label})"
    return [
        Row(
            f"{name}: rate 5%, independent responses",
            "lvlm",
            "refusals ci_low, ci_high",
            100 * REFUSAL_P["r0"],
            rate("r0", 0.0),
        ),
        Row(
            f"{name}: rate 5%, responses dependent within image (tau {TAU})",
            "lvlm",
            "refusals ci_low, ci_high",
            100 * REFUSAL_P["r0"],
            rate("r0", TAU),
        ),
        Row(
            f"{name}: difference 8% - 5%, dependent within image, paired",
            "lvlm",
            "comparisons ci_low, ci_high (Wald, paired bootstrap se)",
            100 * (REFUSAL_P["r1"] - REFUSAL_P["r0"]),
            diff,
            withheld=_expected_note(k, sc),
        ),
    ]


def rows(scale_name: str) -> list:
    """The LVLM rows at ``scale_name`` (test, demo, paper)."""
    sc = scale(scale_name)
    draws = 200 if scale_name == "paper" else 400
    label = {
        "test": "test world",
        "demo": "config/demo.yaml sizes",
        "paper": "config/config.yaml sizes, 200 replicates",
    }.get(scale_name) or f"config/demo.yaml sizes, {sc.story} images per group"
    out = []
    for axis in sc.axes:
        for task in ("story", "term", "exam"):
            out += _tvd_rows(task, sc, axis, draws, label)
    return out + _refusal_rows(sc, label)
