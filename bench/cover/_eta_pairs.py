"""The 36-pair eta world of the reader rows (issue 21): config/config.yaml's implicit pairs'
sides at the planner's prior shares (cover.biasig world "paper-implicit", model a), read by
reader.ETA_CONFUSION; reader.eta_pairs_row and bench/eta_sweep.py --world pairs use it."""

from __future__ import annotations

from functools import cache

import numpy as np


@cache
def _world():
    """(design world, the sides' true distributions (sides, 9), normalised per attribute)."""
    from cover import biasig as cb
    from stereolens.biasig import design as B
    from stereolens.biasig.truth import ATTRIBUTES, SLICES

    w = cb.world("paper-implicit")
    design = B.BiasIGDesign(w.world, cb._config("paper-implicit"), "prior", [])
    counts = B.side_counts(w.world, w.models["a"][0] * design.n_phr_imp[:, None, None])
    for a in ATTRIBUTES:
        counts[:, SLICES[a]] /= counts[:, SLICES[a]].sum(-1, keepdims=True)
    return w.world, counts


def sides() -> dict[str, np.ndarray]:
    """Side name -> its true distribution over biasig.truth.VALUES (the image draw's)."""
    w, dist = _world()
    return {f"{key}:{pos}": dist[i] for i, (key, pos) in enumerate(w.sides)}


def functional():
    """eta of the cells' shares (three a side, gender, race, age, in sides() order): each
    attribute's shares normalised, biasig.design.eta_model (the pairs' weighted mean)."""
    from stereolens.biasig import design as B

    w, _ = _world()

    def eta(shares):
        parts = [np.atleast_2d(np.asarray(s, dtype=float)) for s in shares]
        per_side = np.stack(
            [np.hstack(parts[3 * s : 3 * s + 3]) for s in range(len(w.sides))], axis=-2
        )
        return B.eta_model(per_side, w)

    return eta


def truth() -> float:
    """eta at the sides' true distributions (cover.biasig's truth of model a)."""
    w, dist = _world()
    from stereolens.biasig import design as B

    return float(B.eta_model(dist, w))
