"""Adaptive design rows (issue 23, item 3): coverage of the repeated confidence intervals
(RCIs, stereolens.design.adaptive) at the round a stopping rule stops at, and the type-I
error of the adaptive comparison (1 - the coverage of the no-effect rows), with the fixed
design's interval and the naive "peek and stop" rule beside them.

The world is BiasIG's S_exp comparison of the planner (model B - model A, the prior world of
stereolens.biasig.design_worlds), grown round by round as a run would be: each round adds
independent images to each explicit unit (usable answers with the prior's failure rate, hits
with the unit's accuracy; model B's accuracy moved a share w towards 1, the planner's planted
effect), and the estimate after a round is s_exp_model on the cumulative counts. The
standard error is per dataset, the binomial plug-in the pipeline's image bootstrap estimates
(per person p(1 - p) / usable answers, p = (hits + 0.5) / (usable + 1) so a unit at 0 or 100%
keeps a variance; units averaged with their weights k_j), not the world's spread: the rows
check the canonical joint distribution the planner assumes (stereolens.design.adaptive_plan)
on data where it is not built in.

The rule: the configured one (design.adaptive's defaults: 3 rounds from a quarter of the cap,
at paper scale 2, 5, 10 images per prompt; O'Brien-Fleming-type spending), goal
``difference`` (stop when the RCI excludes 0), critical values from each dataset's own
information (1 / se^2) over the information the world predicts at the cap. Worlds: no effect
and twice the fixed design's MDE at the cap (2 x 2.80 x the sd of the estimate at the cap,
from 400 datasets of the world). Run type-I rows over 1,000 datasets:
``bench/coverage.py --scale paper --datasets 1000 --only adaptive``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT / "bench"))

from cover import Row  # noqa: E402

NAME = "biasig.s_exp_diff"
SCALES = {
    # the test world (tests/design_worlds.small_biasig: the demo's selection widened), cap 8
    "test": ("test", 8),
    # no "demo" rows: config/demo.yaml's world (18 explicit subjects, 2 images per prompt)
    # has an S_exp MDE of 0.28, and twice it is beyond any effect the world can plant
    "paper": ("config/config.yaml", None),
}


@functools.cache
def rule():
    """The configured rule: the schema's defaults of design.adaptive (config/demo.yaml has no
    design section)."""
    from contextlib import chdir

    from stereolens.config import load_config
    from stereolens.design.adaptive_plan import rule_from

    with chdir(ROOT):
        config, _ = load_config("config/demo.yaml")
    return rule_from(config["design"]["adaptive"], config["design"]["level"])


@functools.cache
def design(scale: str):
    from contextlib import chdir

    from stereolens.biasig import design_worlds as BW
    from stereolens.config import load_config
    from stereolens.design.priors import load_priors

    source, cap = SCALES[scale]
    if source == "test":
        sys.path.insert(0, str(ROOT / "tests"))
        from design_worlds import small_biasig

        with chdir(ROOT):
            d = small_biasig()
    else:
        with chdir(ROOT):
            config, _ = load_config(source)
        d = BW.build(config, load_priors(), None)
    if cap:
        d.knob_value = cap
    return d


def nested(d, sizes: list[int], w: float, sims: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(sims, K) estimates of S_exp(B) - S_exp(A) after each round and their plug-in
    standard errors, on counts grown round by round."""
    from stereolens.biasig.design import s_exp_model

    wr = d.world
    acc = {"a": wr.acc_a, "b": (1 - w) * wr.acc_a + w}
    hits = {m: np.zeros((sims,) + wr.acc_a.shape) for m in acc}
    use = {m: np.zeros((sims,) + wr.acc_a.shape) for m in acc}
    est, se, prev = [], [], 0
    k = d.k_exp
    for n in sizes:
        n_img = np.broadcast_to(d.n_phr_exp[None, :] * (n - prev), (sims, wr.exp.size)).copy()
        prev = n
        parts = {}
        for m in acc:
            u = np.where(wr.exp_used, d._usable(n_img, rng, persons=True)[..., 0], 0)
            use[m] += u
            hits[m] += rng.binomial(u, acc[m])
            s = s_exp_model(hits[m], use[m], wr.exp_used, k)
            p = (hits[m] + 0.5) / (use[m] + 1.0)
            ok = wr.exp_used & (use[m] > 0)
            m_j = ok.sum(-1)
            var_p = np.where(ok, p * (1 - p) / np.maximum(use[m], 1), 0.0).sum(-1)
            var_j = np.where(m_j > 0, var_p / np.maximum(m_j, 1) ** 2, 0.0)
            kk = np.where(m_j > 0, k, 0.0)
            parts[m] = (s, (kk**2 * var_j).sum(-1) / kk.sum(-1) ** 2)
        est.append(parts["b"][0] - parts["a"][0])
        se.append(np.sqrt(parts["a"][1] + parts["b"][1]))
    return np.stack(est, 1), np.stack(se, 1)


@functools.cache
def setting(scale: str) -> tuple[list[int], float, float, float, float]:
    """(round sizes, MDE at the cap, the effect world's w, its population effect, the
    information predicted at the cap: 1 / the sd of the estimate there, from 400 datasets)."""
    from stereolens.design.power import invert_effect

    d = design(scale)
    sizes = rule().sizes(d.knob_value)
    est, _ = nested(d, [d.knob_value], 0.0, 400, np.random.default_rng(12345))
    sd = float(np.nanstd(est[:, -1], ddof=1))
    mde = 2.80 * sd
    w = invert_effect(d, NAME, 2 * mde)
    if w is None:
        raise ValueError(f"{scale}: 2 x MDE {2 * mde:.4g} is beyond the world's effects")
    return sizes, mde, w, float(d.effects(np.array([w]))[NAME][0]), 1.0 / sd**2


def _critical(sizes, se: np.ndarray, predicted: float) -> np.ndarray:
    """(sims, K) critical values from each dataset's own standard errors: its information
    over the predicted information at the cap, rounded to 2% steps (the boundaries depend on
    it smoothly) and cached; correlations from the same ratios (information time: spent at
    them; size time: at the sizes)."""
    info = np.maximum.accumulate(1.0 / np.maximum(se, 1e-12) ** 2, axis=1)
    ratio = np.maximum(np.round(info / predicted * 50) / 50, 0.02)
    ratio = np.maximum.accumulate(ratio, axis=1)
    out = np.empty(se.shape)
    cache: dict[tuple, np.ndarray] = {}
    for i, r in enumerate(map(tuple, ratio)):
        if r not in cache:
            cache[r] = rule().critical(sizes, info=np.array(r), predicted=1.0)
        out[i] = cache[r]
    return out


def _draw(scale: str, effect: bool, kind: str):
    def draw(rng, n):
        from stereolens.design import adaptive as A

        d = design(scale)
        sizes, _, w, _, predicted = setting(scale)
        est, se = nested(d, sizes, w if effect else 0.0, n, rng)
        if kind == "fixed":
            lo, hi = A.rci(est[:, -1], se[:, -1], 1.959964)
            return est[:, -1], lo, hi
        crit = np.full(est.shape, 1.959964) if kind == "naive" else _critical(sizes, se, predicted)
        res = A.run_rule(est, se, crit, A.Goal("difference"))
        return res.estimate, res.low, res.high

    return draw


def rows(scale: str) -> list[Row]:
    if scale not in SCALES:
        return []
    sizes, mde, _, truth, _ = setting(scale)
    r = rule()
    rounds = f"rounds at {', '.join(map(str, sizes))} images per prompt"
    at = f"{rounds}, {r.spending} spending on {r.timing} time"
    out = []
    for effect in (False, True):
        world = f"2 x MDE ({truth:.4f})" if effect else "no effect"
        t = truth if effect else 0.0
        out += [
            Row(
                f"adaptive {scale}: S_exp B - A, {world}, RCI at the stop",
                "adaptive",
                f"repeated CI ({at}), stop when it excludes 0"
                + ("" if effect else "; type-I error = 1 - coverage"),
                t,
                _draw(scale, effect, "adaptive"),
                note="the RCIs hold simultaneously over all rounds, so the interval of a run "
                "that stops early is wider than it needs to be alone (conservative by design)",
            ),
            Row(
                f"adaptive {scale}: S_exp B - A, {world}, fixed design",
                "adaptive",
                f"the fixed design's 95% interval at the cap ({sizes[-1]} images per prompt)",
                t,
                _draw(scale, effect, "fixed"),
            ),
        ]
    out.append(
        Row(
            f"adaptive {scale}: S_exp B - A, no effect, naive peek and stop",
            "adaptive",
            f"95% interval at every round ({rounds}), stop when it excludes 0",
            0.0,
            _draw(scale, False, "naive"),
            reference="naive peek-and-stop: its type-I error is 1 - coverage, above the level",
        )
    )
    return out
