"""Coverage rows of the per-group reader audits (issue 20, item 4): the largest-gap interval
and the difference test of stereolens.metrics.group_audit, drawn through the audits' own
functions (contextbias.extraction_audit.audit_items, lvlm.story_reading.audit_readings) on
simulated item tables with a known truth.

Worlds (``truth`` = the population value: the largest difference between the groups'
expected error rates, computed by Gauss-Hermite quadrature over the random effects):

- independent: G groups x n items, each item right with its group's probability (the
  issue's measurement on main: 7 x 100, no effect);
- ContextBias validation: P prompts x S seeds; an item is right with probability
  expit(mu_g + u_prompt + v_image) (u sd 0.3, v sd 0.5: image-level heterogeneity). "stated":
  one item per image, the prompt's stated group; "shown": D dimension items per image, the
  group the image shows drawn per image (a prompt's images show different groups);
- story reading: T story templates x I items per story, every item read under every group
  (matched), right with probability expit(mu + a_story + b_item + c_story,group + gamma_g)
  (a sd 0.7, b sd 1.0, c sd 0.3: the group effect varies by story, so the templates are the
  sampling unit).

Test-size rows: ``estimate`` = the p-value, interval [0, p], truth = 0.05, so "coverage" =
the share of null datasets in which the test does not reject at 0.05 = 1 - its size.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from stereolens.metrics import group_audit as G

from . import Row

LEVEL = 0.95
ALPHA = 0.05
FP_RATE = 0.7  # a wrong item reads a contradicting label (a false positive) with this chance
GAP_NOTE = "simultaneous over all pairs: conservative when one pair stands out or clusters are few"
SIZE_NOTE = "a conservative test here: Fisher's exact at tiny counts, Rao-Scott F with few clusters"
_GH = np.polynomial.hermite_e.hermegauss(41)


def _expected_error(mu: np.ndarray, sd: float) -> np.ndarray:
    """E[1 - expit(mu + sd Z)], Z standard normal (probabilists' Gauss-Hermite)."""
    x, w = _GH
    w = w / w.sum()
    acc = 1 / (1 + np.exp(-(np.asarray(mu, dtype=float)[:, None] + sd * x[None, :])))
    return 1 - acc @ w


def _logit(p):
    p = np.asarray(p, dtype=float)
    return np.log(p / (1 - p))


# --------------------------------------------------------------------------- item tables
def independent_items(rng, errors: np.ndarray, n: int) -> pl.DataFrame:
    """G groups x n independent items with the given error rates (ContextBias item layout)."""
    g = np.repeat(np.arange(errors.size), n)
    correct = (rng.random(g.size) >= errors[g]).astype(np.int64)
    return _cb_frame("stated", g, correct, np.arange(g.size))


def contextbias_items(
    rng, grouping: str, mu: np.ndarray, prompts: int, seeds: int, dims: int,
    sd_prompt: float = 0.3, sd_image: float = 0.5,
) -> pl.DataFrame:  # fmt: skip
    """A simulated validation item table (module docstring), cluster = the prompt."""
    k = mu.size
    img_prompt = np.repeat(np.arange(prompts), seeds)
    u = rng.normal(0, sd_prompt, prompts)[img_prompt]
    v = rng.normal(0, sd_image, img_prompt.size)
    if grouping == "stated":
        img_group = (np.arange(prompts) % k)[img_prompt]
        per = 1
    else:
        img_group = rng.integers(0, k, img_prompt.size)
        per = dims
    eta = np.repeat(mu[img_group] + u + v, per)
    correct = (rng.random(eta.size) < 1 / (1 + np.exp(-eta))).astype(np.int64)
    groups = np.repeat(img_group, per)
    return _cb_frame(grouping, groups, correct, np.repeat(img_prompt, per), rng)


def _false_positives(rng, correct: np.ndarray) -> np.ndarray:
    return ((1 - correct) * (rng.random(correct.size) < FP_RATE)).astype(np.int64)


def _cb_frame(grouping, g, correct, cluster, rng=None) -> pl.DataFrame:
    fp = np.zeros(g.size, np.int64) if rng is None else _false_positives(rng, correct)
    return pl.DataFrame({
        "extractor": "x", "model": "m", "image_id": np.arange(g.size).astype(str),
        "dimension": "d", "correct": correct, "other_label": np.zeros(g.size, dtype=np.int64),
        "cluster": cluster.astype(str), "grouping": grouping, "group_dimension": "gd",
        "group": np.char.add("g", g.astype(str)), "false_positive": fp,
    })  # fmt: skip


STORY_SD = {"story": 0.7, "item": 1.0, "story_group": 0.3}


def story_items(rng, mu: np.ndarray, stories: int, per_story: int) -> pl.DataFrame:
    """A scored story-reading table (score_readings' columns), axis gender with
    ``mu.size`` groups: every item of every story read under every group (module docstring)."""
    k = mu.size
    a = rng.normal(0, STORY_SD["story"], stories)
    b = rng.normal(0, STORY_SD["item"], (stories, per_story))
    c = rng.normal(0, STORY_SD["story_group"], (stories, k))
    eta = a[:, None, None] + b[:, :, None] + c[:, None, :] + mu[None, None, :]
    correct = (rng.random(eta.shape) < 1 / (1 + np.exp(-eta))).astype(np.int64).ravel()
    s, i, g = np.meshgrid(np.arange(stories), np.arange(per_story), np.arange(k), indexing="ij")
    return pl.DataFrame({
        "assistant": "a", "story": np.char.add("s", s.ravel().astype(str)),
        "gender": np.char.add("g", g.ravel().astype(str)), "race": "r", "status": "ok",
        "attribute": np.char.add("att", i.ravel().astype(str)), "element": "e",
        "correct": correct, "false_positive": _false_positives(rng, correct),
    })  # fmt: skip


def story_truth(mu: np.ndarray) -> np.ndarray:
    sd = float(np.sqrt(sum(v**2 for v in STORY_SD.values())))
    return _expected_error(mu, sd)


# --------------------------------------------------------------------------- draws
REPLICATES = 200  # F1 bootstrap replicates in the per-group rows


def _first_group(rates: pl.DataFrame) -> dict:
    return rates.filter(pl.col("group") == "g0").row(0, named=True)


def _cb_audit(items: pl.DataFrame, what: str = "gap") -> dict:
    from stereolens.contextbias.extraction_audit import audit_items

    reps = REPLICATES if what == "f1" else 0
    rates, gaps = audit_items(items, None, level=LEVEL, replicates=reps)
    return (
        _first_group(rates) if what in ("accuracy", "precision", "f1") else gaps.row(0, named=True)
    )


def _story_audit(items: pl.DataFrame, what: str = "gap") -> dict:
    from stereolens.lvlm.story_reading import audit_readings

    reps = REPLICATES if what == "f1" else 0
    rates, gaps = audit_readings(items, ["gender"], None, level=LEVEL, replicates=reps)
    return (
        _first_group(rates) if what in ("accuracy", "precision", "f1") else gaps.row(0, named=True)
    )


COLUMNS = {
    "gap": ("error_gap", "gap_low", "gap_high"),
    "accuracy": ("accuracy", "accuracy_low", "accuracy_high"),
    "precision": ("precision", "precision_low", "precision_high"),
    "f1": ("f1", "f1_low", "f1_high"),
}


def _draw(make, audit, what: str):
    def draw(rng, n):
        out = np.full((n, 3), np.nan)
        for d in range(n):
            r = audit(make(rng), what)
            if what == "p":  # a withheld test (null p-value): no interval
                p = np.nan if r["p_value"] is None else r["p_value"]
                out[d] = p, 0.0 if np.isfinite(p) else np.nan, p
            else:
                out[d] = [np.nan if r[c] is None else r[c] for c in COLUMNS[what]]
        return out[:, 0], out[:, 1], out[:, 2]

    return draw


def _per_group_rows(label: str, make, audit, error0: float, withheld=("", "")) -> list[Row]:
    """Group g0's accuracy, precision (Wilson on effective counts) and F1 (logit-scale t
    interval from the bootstrap standard error over clusters) at the population accuracy a:
    a wrong item reads a false positive with chance r = FP_RATE, so precision =
    a / (a + r (1 - a)) and F1 = 2 TP / (2 TP + FP + FN) = 2 a / (2 a + (1 + r) (1 - a))."""
    a, r = 1 - error0, FP_RATE  # withheld: the rules of (accuracy and precision, F1)
    wilson = "Wilson on effective counts (counts / design effect)"
    return [
        Row(f"audits: {label} group accuracy", "reader audits", wilson, a,
            _draw(make, audit, "accuracy"), withheld=withheld[0]),
        Row(f"audits: {label} group precision", "reader audits", wilson, a / (a + r * (1 - a)),
            _draw(make, audit, "precision"), withheld=withheld[0]),
        Row(f"audits: {label} group F1", "reader audits",
            "logit(F1) +- t(C-1) x bootstrap se over clusters", 2 * a / (2 * a + (1 + r) * (1 - a)),
            _draw(make, audit, "f1"), withheld=withheld[1] or withheld[0]),
    ]  # fmt: skip


def _cb_withheld(grouping: str, prompts: int, seeds: int, k: int) -> tuple[str, str]:
    """The minimum-size rules that can withhold a ContextBias per-group row (accuracy and
    precision, F1): clustered groups need MIN_CLUSTERS prompts (shown: a group's prompts are
    those with an image of it, so a small design may fall short in some datasets), F1 of
    independent items MIN_F1_ITEMS items."""
    clustered = grouping == "shown" or seeds > 1
    # expected prompts holding a group: shown, any of a prompt's seeds' images shows it
    per_group = prompts * (1 - (1 - 1 / k) ** seeds) if grouping == "shown" else prompts // k
    rates = f"fewer than {G.MIN_CLUSTERS} prompts per group" if (
        clustered and per_group < 2 * G.MIN_CLUSTERS) else ""  # fmt: skip
    items = prompts // k * seeds
    f1 = f"F1: {items} independent items per group < {G.MIN_F1_ITEMS}" if (
        not clustered and items < G.MIN_F1_ITEMS) else ""  # fmt: skip
    return rates, f1


SIZES = {
    # independent: groups, items per group; ContextBias: prompts, seeds, dimension items per
    # image (shown), groups; story: stories, items per story, groups (gender 2, race 7)
    "test": {"ind": (7, 40), "cb": (40, 10, 3, 2), "story": (10, 9, 2)},
    "demo": {"ind": (2, 10), "cb": (12, 1, 5, 2), "story": (1, 9, 2)},
    "paper": {"ind": (7, 100), "cb": (220, 10, 8, 2), "story": (10, 9, 7)},
}


def rows(scale: str) -> list[Row]:
    s = SIZES[scale]
    out = []
    gi, ni = s["ind"]
    flat = np.full(gi, 0.2)
    spread = np.linspace(0.1, 0.3, gi)
    for tag, err in (("no effect", flat), ("effect", spread)):
        out.append(Row(
            f"audits: largest gap, {gi} independent groups x {ni}, {tag}", "reader audits",
            "simultaneous Bonferroni-t over pairs (Agresti-Caffo)",
            float(err.max() - err.min()),
            _draw(lambda rng, e=err: independent_items(rng, e, ni), _cb_audit, "gap"),
            note=GAP_NOTE,
        ))  # fmt: skip
    P, S, D, k = s["cb"]
    base = _logit(np.full(k, 0.85))
    eff = _logit(np.linspace(0.9, 0.8, k))
    for grouping in ("stated", "shown"):
        sd = float(np.hypot(0.3, 0.5))
        for tag, mu in (("no effect", base), ("effect", eff)):
            e = _expected_error(mu, sd)
            out.append(Row(
                f"audits: ContextBias {grouping} largest gap, {P} prompts x {S} seeds, {tag}",
                "reader audits", "simultaneous over pairs, clusters = prompts",
                float(e.max() - e.min()),
                _draw(lambda rng, m=mu, g=grouping: contextbias_items(rng, g, m, P, S, D),
                      _cb_audit, "gap"),
                note=GAP_NOTE,
            ))  # fmt: skip
        out += _per_group_rows(
            f"ContextBias {grouping}, {P} prompts x {S} seeds,",
            lambda rng, g=grouping: contextbias_items(rng, g, base, P, S, D), _cb_audit,
            float(_expected_error(base, sd)[0]), _cb_withheld(grouping, P, S, k),
        )  # fmt: skip
        clustered = grouping == "shown" or S > 1
        out.append(Row(
            f"audits: ContextBias {grouping} test size, {P} prompts x {S} seeds (1 - size)",
            "reader audits", "chi-squared / Rao-Scott F at 0.05: 'coverage' = 1 - rejection rate",
            ALPHA, _draw(lambda rng, g=grouping: contextbias_items(rng, g, base, P, S, D),
                         _cb_audit, "p"), note=SIZE_NOTE,
            withheld=f"test: {P} prompts < {G.MIN_TEST_CLUSTERS}"
            if clustered and P < G.MIN_TEST_CLUSTERS else "",
        ))  # fmt: skip
    T, n_it, gs = s["story"]
    flat = _logit(np.full(gs, 0.8))
    eff = _logit(np.linspace(0.85, 0.7, gs))
    for tag, mu in (("no effect", flat), ("effect", eff)):
        e = story_truth(mu)
        out.append(Row(
            f"audits: story reading largest gap, {T} stories x {n_it} items x {gs} groups, {tag}",
            "reader audits", "simultaneous over pairs, paired, clusters = stories",
            float(e.max() - e.min()),
            _draw(lambda rng, m=mu: story_items(rng, m, T, n_it), _story_audit, "gap"),
            note=GAP_NOTE,
        ))  # fmt: skip
    few = f"{T} {'story' if T == 1 else 'stories'} < {G.MIN_CLUSTERS}" if T < G.MIN_CLUSTERS else ""
    out += _per_group_rows(
        f"story reading, {T} stories x {n_it} items,",
        lambda rng: story_items(rng, flat, T, n_it), _story_audit, float(story_truth(flat)[0]),
        (few, ""),
    )  # fmt: skip
    out.append(Row(
        f"audits: story reading test size, {T} stories x {n_it} items x {gs} groups (1 - size)",
        "reader audits", "Rao-Scott F (Cochran's Q for one story) at 0.05: 1 - rejection rate",
        ALPHA, _draw(lambda rng: story_items(rng, flat, T, n_it), _story_audit, "p"),
        note=SIZE_NOTE, withheld=f"test: {few}" if few and T > 1 else "",
    ))  # fmt: skip
    return out
