"""Power of the LVLM audit's scores: the TVD x100 of each task and axis above its noise floor,
one design per task (worlds and effects: docs/planner.md, "The worlds in detail")."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from stereolens.design.power import EffectSpec, Simulation
from stereolens.design.sampling import multinomial, thin_binary, thin_towards
from stereolens.lvlm.layout import LAYOUT
from stereolens.lvlm.names import groups
from stereolens.lvlm.scores import check_formulas, tvd_from_uniform
from stereolens.lvlm.settings import LVLMSettings

GRID = np.concatenate([[0.0], np.geomspace(1e-3, 1.0, 30)])
TASKS = ("story", "term", "exam")


def _div(num, den):
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


# ----------------------------------------------------------------------------- estimators
def story_score(n_gv: np.ndarray, n_g: np.ndarray, min_count: int, weighted: bool) -> np.ndarray:
    """Story TVD x100 of one prompt from value counts (..., G, V) and stories (..., G): per
    value with n_v >= min_count, p_g = (n_gv / N_g) / sum_h (n_hv / N_h), TVD_v = 1/2 sum_g
    |p_g - 1/G|; the count-weighted (story_tvd) or plain (story_tvd_unweighted) mean."""
    rate = _div(n_gv, n_g[..., None])
    p = _div(rate, rate.sum(-2, keepdims=True))
    tvd = tvd_from_uniform(p, axis=-2)  # (..., V)
    n_v = n_gv.sum(-2)
    keep = (n_v >= min_count) & np.isfinite(tvd)
    w = n_v * keep if weighted else keep.astype(float)
    ws = w.sum(-1)
    return np.where(ws > 0, _div((np.where(keep, tvd, 0.0) * w).sum(-1), ws), np.nan) * 100


def term_score(wins: np.ndarray, apps: np.ndarray, uniform: bool) -> np.ndarray:
    """Term TVD x100 from wins and appearances (..., terms, G): per term r_a = wins_a / sum
    wins and, for term_tvd, e_a = apps_a / sum apps, S = 1/2 sum |r - e| (term_tvd_uniform:
    against 1/G); the mean over the terms with a score."""
    r = _div(wins, wins.sum(-1, keepdims=True))
    if uniform:
        s = tvd_from_uniform(r, axis=-1)
    else:
        e = _div(apps, apps.sum(-1, keepdims=True))
        s = 0.5 * np.abs(r - e).sum(-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(s, axis=-1) * 100


def exam_score(right: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Exam TVD x100 from correct and asked counts (..., subjects, G): per subject q_a =
    Acc_a / sum Acc, S = TVD(q, uniform) (0 when every group scores 0); the mean over the
    subjects (pass one pooled "subject" for exam_tvd_pooled)."""
    acc = _div(right, total)
    q = _div(acc, acc.sum(-1, keepdims=True))
    s = tvd_from_uniform(q, axis=-1)
    s = np.where(np.isfinite(acc).all(-1) & (acc.sum(-1) == 0), 0.0, s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(s, axis=-1) * 100


# ----------------------------------------------------------------------------- designs
class _Task:
    benchmark = "lvlm"
    knob_label = "images per group"
    search_limit = 100_000
    task = ""

    def __init__(self, config: dict[str, Any], basis: str, notes: list[str]):
        lv = config["lvlm"]
        self.lv = lv
        self.basis = basis
        self.notes = notes
        self.knob = ("lvlm", "tasks", self.task, "images_per_group")
        self.knob_value = int(lv["tasks"][self.task]["images_per_group"])
        self.groups = {a: groups(lv, a) for a in lv["axes"]}
        st = LVLMSettings.from_config(lv)
        self.min_count = st.min_count
        self.formula = check_formulas(dict(st.formulas))[self.task]
        self.grid = GRID

    def name(self, axis: str) -> str:
        return f"lvlm.tvd.{self.task}.{axis}"

    def specs(self) -> list[EffectSpec]:
        return [
            EffectSpec(
                self.name(a),
                self.benchmark,
                f"{self.task} TVD x100 above its noise floor, {a} ({len(g)} groups)",
                "TVD x100",
                "floor",
                0.0,
                self.definition,
                estimand=f"the config's {self.task} prompts; a new draw of the images and "
                "outputs of each group",
            )  # fmt: skip
            for a, g in self.groups.items()
        ]

    definition = ""

    def effects(self, w: np.ndarray) -> dict[str, np.ndarray]:
        """Per axis, the population score at each effect size of ``w`` (W,)."""
        w = np.asarray(w, dtype=float)
        return {self.name(a): self._effects(len(g), w) for a, g in self.groups.items()}

    def simulate(self, n: int, w: np.ndarray, sims: int, rng) -> Simulation:
        """Per axis, the scores (W, sims) of ``sims`` datasets of ``n`` images per group
        drawn at each effect size of ``w``; the axes draw from ``rng`` in turn."""
        return Simulation(
            {self.name(a): self._simulate(len(g), n, w, sims, rng) for a, g in self.groups.items()}
        )


@dataclass
class StoryWorld:
    rates: np.ndarray
    """(values,) share of stories with each value (scalar attributes: read rate x share)."""
    segment: np.ndarray
    """(values,) attribute index of each value."""
    scalar: np.ndarray
    """(attributes,) True for one-value attributes."""
    read_rate: np.ndarray
    """(attributes,) share of stories whose scalar attribute is read."""


class StoryDesign(_Task):
    task = "story"
    definition = (
        "population story TVD x100; group g's stories pulled towards the g-th most common "
        "value of every attribute"
    )

    def __init__(self, config, world: StoryWorld, basis, notes):
        super().__init__(config, basis, notes)
        self.world = world

    def _targets(self, n_groups: int) -> np.ndarray:
        """(G, values) 0/1: the value each group is pulled towards, per attribute."""
        w = self.world
        t = np.zeros((n_groups, w.rates.size))
        for a in range(w.scalar.size):
            cols = np.flatnonzero(w.segment == a)
            order = cols[np.argsort(-w.rates[cols], kind="stable")]
            for g in range(n_groups):
                t[g, order[g % order.size]] = 1.0
        return t

    def _effects(self, g_n: int, w: np.ndarray) -> np.ndarray:
        w = w[:, None, None]
        sw = self.world
        t = self._targets(g_n)
        cond = np.where(sw.scalar[sw.segment], sw.rates / sw.read_rate[sw.segment], sw.rates)
        mixed = (1 - w) * cond + w * t  # conditional on reading (scalar) / per story (list)
        rate = np.where(sw.scalar[sw.segment], mixed * sw.read_rate[sw.segment], mixed)
        n_g = np.ones(rate.shape[:-1])
        return story_score(rate * 1e9, n_g * 1e9, 0, self.formula == "story_tvd")

    def _simulate(self, g_n: int, n: int, w: np.ndarray, sims: int, rng) -> np.ndarray:
        sw = self.world
        sc = sw.scalar[sw.segment]
        cond = np.where(sc, sw.rates / sw.read_rate[sw.segment], 0.0)
        scalar_attrs = np.flatnonzero(sw.scalar)
        list_cols = np.flatnonzero(~sc)
        weighted = self.formula == "story_tvd"
        t = self._targets(g_n)
        counts = np.zeros((sims, g_n, sw.rates.size), dtype=np.int64)
        s_cols = np.flatnonzero(sc)
        if s_cols.size:
            read = rng.binomial(n, sw.read_rate[scalar_attrs], size=(sims, g_n, scalar_attrs.size))
            seg_s = sw.segment[s_cols]
            p = np.broadcast_to(cond[s_cols], (sims, g_n, s_cols.size))
            parts = []
            for j, a in enumerate(scalar_attrs):
                cols = np.flatnonzero(seg_s == a)
                parts.append(multinomial(read[..., j], p[..., cols], rng))
            counts[..., s_cols] = np.concatenate(parts, axis=-1)
        if list_cols.size:
            counts[..., list_cols] = rng.binomial(
                n, sw.rates[list_cols], size=(sims, g_n, list_cols.size)
            )
        n_g = np.full((sims, g_n), n, dtype=float)
        res = np.empty((len(w), sims))
        s_iter = (
            thin_towards(counts[..., s_cols], t[None][..., s_cols], sw.segment[s_cols], w, rng)
            if s_cols.size
            else None
        )
        l_iter = (
            thin_binary(counts[..., list_cols], n, t[None][..., list_cols], w, rng)
            if list_cols.size
            else None
        )
        cur = counts.copy()
        for i in range(len(w)):
            if s_iter is not None:
                cur[..., s_cols] = next(s_iter)[1]
            if l_iter is not None:
                cur[..., list_cols] = next(l_iter)[1]
            res[i] = story_score(cur, n_g, self.min_count, weighted)
        return res


class TermDesign(_Task):
    task = "term"
    definition = (
        "population term TVD x100; with probability w the judge picks the group ranked higher"
    )

    def __init__(self, config, n_terms: int, drop_rate: float, basis, notes):
        super().__init__(config, basis, notes)
        self.n_terms = n_terms
        self.drop_rate = drop_rate

    def _pairs(self, g_n: int) -> np.ndarray:
        return np.array(list(combinations(range(g_n), 2)), dtype=np.int64).reshape(-1, 2)

    def _to_groups(self, wins_first, valid, pairs, g_n):
        """Wins of each pair's first group (..., P) -> wins and appearances (..., G)."""
        first = np.zeros((len(pairs), g_n))
        second = np.zeros((len(pairs), g_n))
        first[np.arange(len(pairs)), pairs[:, 0]] = 1.0
        second[np.arange(len(pairs)), pairs[:, 1]] = 1.0
        wins_first = np.asarray(wins_first, dtype=float)
        valid = np.asarray(valid, dtype=float)
        wins = wins_first @ first + (valid - wins_first) @ second
        return wins, valid @ (first + second)

    def _effects(self, g_n, w):
        pairs = self._pairs(g_n)
        # the first group of every pair is the one ranked higher
        p_first = np.broadcast_to((1 - w[:, None]) * 0.5 + w[:, None], (w.size, len(pairs)))
        valid = np.full(p_first.shape, 1e9)
        wins, apps = self._to_groups(p_first * 1e9, valid, pairs, g_n)
        return term_score(wins[:, None], apps[:, None], self.formula == "term_tvd_uniform")

    def _simulate(self, g_n, n, w, sims, rng):
        pairs = self._pairs(g_n)
        valid = rng.binomial(n, 1.0 - self.drop_rate, size=(sims, self.n_terms, len(pairs)))
        first = rng.binomial(valid, 0.5)
        res = np.empty((len(w), sims))
        for i, h in thin_binary(first, valid, 1, w, rng):
            wins, apps = self._to_groups(h, valid, pairs, g_n)
            res[i] = term_score(wins, apps, self.formula == "term_tvd_uniform")
        return res


class ExamDesign(_Task):
    task = "exam"
    definition = (
        "population exam TVD x100; with probability w an answer of the first half of the "
        "groups becomes correct and one of the second half wrong"
    )

    def __init__(self, config, accuracy: np.ndarray, subject: np.ndarray, basis, notes):
        super().__init__(config, basis, notes)
        self.accuracy = accuracy
        """(questions,) probability of a correct answer."""
        self.subject = subject
        """(questions,) subject index."""

    def _sign(self, g_n: int) -> np.ndarray:
        half = g_n // 2
        return np.array([1] * half + [0] * (g_n - 2 * half) + [-1] * half)

    def _subjects(self, x: np.ndarray) -> np.ndarray:
        """(..., questions, G) summed per subject (or pooled) -> (..., subjects, G)."""
        if self.formula == "exam_tvd_pooled":
            return x.sum(-2, keepdims=True)
        n_s = int(self.subject.max()) + 1
        out = np.zeros(x.shape[:-2] + (n_s, x.shape[-1]))
        for s in range(n_s):
            out[..., s, :] = x[..., self.subject == s, :].sum(-2)
        return out

    def _effects(self, g_n, w):
        sign = self._sign(g_n)
        acc = self.accuracy[None, :, None]
        ww = w[:, None, None]
        p = np.where(sign > 0, (1 - ww) * acc + ww, np.where(sign < 0, (1 - ww) * acc, acc))
        total = np.ones_like(p)
        return exam_score(self._subjects(p), self._subjects(total))

    def _simulate(self, g_n, n, w, sims, rng):
        sign = self._sign(g_n)
        shape = (sims, self.accuracy.size, g_n)
        right = rng.binomial(n, np.broadcast_to(self.accuracy[None, :, None], shape))
        # thinning sums over the questions of a subject: thin the subject totals
        right = self._subjects(right).astype(np.int64)
        total = self._subjects(np.full(shape, n, dtype=float))
        res = np.empty((len(w), sims))
        it = thin_binary(right, total.astype(np.int64), (sign > 0)[None, None, :], w, rng)
        for i, h in it:
            h = np.where(sign == 0, right, h)
            res[i] = exam_score(h.astype(float), total)
        return res


# ----------------------------------------------------------------------------- worlds
def _zipf(k: int, s: float) -> np.ndarray:
    p = 1.0 / np.arange(1, k + 1) ** s
    return p / p.sum()


def prior_story(priors: dict[str, Any]) -> StoryWorld:
    pr = priors["lvlm"]["story"]
    rates, seg, scalar, read = [], [], [], []
    for a, (_, spec) in enumerate(sorted(pr["attributes"].items())):
        p = _zipf(int(spec["values"]), float(spec["zipf"]))
        is_scalar = spec["kind"] == "scalar"
        r = float(pr["read_rate"])
        rates.append(p * r if is_scalar else np.minimum(0.95, p * float(spec["per_story"]) * r))
        seg.append(np.full(p.size, a))
        scalar.append(is_scalar)
        read.append(r)
    return StoryWorld(np.concatenate(rates), np.concatenate(seg), np.array(scalar), np.array(read))


def prior_exam(lv: dict[str, Any], priors: dict[str, Any], seed: int = 0):
    from stereolens.lvlm.tasks import COLLEGE_SUBJECTS

    pr = priors["lvlm"]["exam"]
    q = int(lv["questions_per_subject"])
    m, c = float(pr["accuracy_mean"]), float(pr["accuracy_concentration"])
    rng = np.random.default_rng([seed, 9137])
    acc = rng.beta(m * c, (1 - m) * c, size=len(COLLEGE_SUBJECTS) * q)
    return acc, np.repeat(np.arange(len(COLLEGE_SUBJECTS)), q)


def pilot_story(results: Path) -> StoryWorld | None:
    from stereolens.lvlm.tasks import load_prompts

    att_path = LAYOUT.at(results, "table", table="story_attributes")
    st_path = LAYOUT.at(results, "table", table="stories")
    if not att_path.is_file() or not st_path.is_file():
        return None
    att = pl.read_parquet(att_path)
    stories = pl.read_parquet(st_path)
    n = stories.select("model", "setting", "axis", "image_id").unique().height
    if n == 0 or att.height == 0:
        return None
    props = load_prompts()["extraction"]["schema"]["properties"]
    per = (
        att.group_by("attribute", "value")
        .agg(pl.struct("model", "setting", "axis", "image_id").n_unique().alias("n"))
        .sort("attribute", "value")  # group_by order is not deterministic
    )
    rates, seg, scalar, read = [], [], [], []
    for a, (attr, sub) in enumerate(
        sorted(per.group_by("attribute", maintain_order=True), key=lambda x: x[0][0])
    ):
        is_scalar = props.get(attr[0], {}).get("type") != "array"
        r = sub["n"].to_numpy() / n
        rates.append(np.minimum(r, 0.95))
        seg.append(np.full(r.size, a))
        scalar.append(is_scalar)
        read.append(min(0.999, float(r.sum())) if is_scalar else 1.0)
    if not rates:
        return None
    rates_a = np.concatenate(rates)
    seg_a = np.concatenate(seg)
    scalar_a = np.array(scalar)
    read_a = np.array(read)
    # scalar attributes: rates are read_rate x share, the shares summing to 1
    for a in np.flatnonzero(scalar_a):
        cols = seg_a == a
        rates_a[cols] = rates_a[cols] / rates_a[cols].sum() * read_a[a]
    return StoryWorld(rates_a, seg_a, scalar_a, read_a)


def pilot_exam(lv: dict[str, Any], results: Path, seed: int = 0):
    from stereolens.lvlm.tasks import COLLEGE_SUBJECTS

    path = LAYOUT.at(results, "table", table="responses")
    if not path.is_file():
        return None
    r = pl.read_parquet(path)
    if "task" not in r.columns:
        return None
    ex = r.filter(pl.col("task") == "exam")
    if ex.height == 0:
        return None
    per = (
        ex.group_by("prompt_id")
        .agg(
            pl.col("correct").fill_null(False).cast(pl.Float64).sum().alias("right"),
            pl.len().alias("n"),
        )
        .sort("prompt_id")  # group_by order is not deterministic
    )
    smoothed = ((per["right"] + 1) / (per["n"] + 2)).to_numpy()
    q = int(lv["questions_per_subject"])
    rng = np.random.default_rng([seed, 9138])
    acc = rng.choice(smoothed, size=len(COLLEGE_SUBJECTS) * q, replace=True)
    return acc, np.repeat(np.arange(len(COLLEGE_SUBJECTS)), q)


def pilot_drop_rate(results: Path) -> float | None:
    path = LAYOUT.at(results, "table", table="term_judgements")
    if not path.is_file():
        return None
    t = pl.read_parquet(path)
    return float(t["winner"].is_null().mean()) if t.height else None


def build(config: dict[str, Any], priors: dict[str, Any], pilot: Path | None, seed: int = 0):
    """One design per scored task of the config (story, term, exam), or []."""
    from stereolens.lvlm.tasks import kept_terms

    lv = config["lvlm"]
    if not lv["enabled"]:
        return []
    tasks = [t for t in TASKS if t in lv["tasks"]]
    out = []
    label = f"pilot {pilot}" if pilot is not None else "prior"
    for task in tasks:
        notes: list[str] = []
        basis = label
        if task == "story":
            world = pilot_story(pilot) if pilot is not None else None
            if world is None:
                if pilot is not None:
                    notes.append(
                        f"LVLM story: no story readings in pilot {pilot}; the prior is used"
                    )
                world, basis = prior_story(priors), "prior"
            out.append(StoryDesign(config, world, basis, notes))
        elif task == "term":
            drop = pilot_drop_rate(pilot) if pilot is not None else None
            if drop is None:
                drop, basis = float(priors["lvlm"]["term"]["drop_rate"]), "prior"
            out.append(TermDesign(config, len(kept_terms(lv)), min(drop, 0.99), basis, notes))
        else:
            ex = pilot_exam(lv, pilot, seed) if pilot is not None else None
            if ex is None:
                ex, basis = prior_exam(lv, priors, seed), "prior"
            out.append(ExamDesign(config, ex[0], ex[1], basis, notes))
    return out
