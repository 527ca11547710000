"""Small simulated worlds shared by tests/test_design_power.py and test_design_check.py."""

from __future__ import annotations

import numpy as np

from stereolens.biasig import design as B
from stereolens.biasig import design_worlds as BW
from stereolens.config import load_config
from stereolens.contextbias import design as C
from stereolens.contextbias import design_worlds as CW
from stereolens.design.priors import load_priors
from stereolens.settings import section_defaults


def small_world(n_roles: int = 12, gens=("g1", "g2"), seed: int = 0) -> C.World:
    """A ContextBias world of four dimensions in two cohorts (2-5 labels), 40 population
    roles, ``n_roles`` configured roles with 3 CF and 6 CA-U prompts."""
    rng = np.random.default_rng(seed)
    sizes = np.array([2, 3, 4, 5])
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    seg = np.repeat(np.arange(4), sizes)
    mu = np.concatenate([CW.geometric(int(k), 0.5) for k in sizes])
    centre = CW.dirichlet(rng, 3 * np.broadcast_to(mu, (40, mu.size)), starts, seg)
    roles = CW.dirichlet(rng, 30 * np.broadcast_to(centre[:, None], (40, 2, mu.size)), starts, seg)
    g = len(gens)
    return C.World(
        dims=["d0", "d1", "d2", "d3"],
        cohorts=["a", "b"],
        member=np.array([[1, 1, 0, 0], [0, 0, 1, 1.0]]),
        vocab_k=np.full(4, np.nan),
        generators=list(gens),
        starts=starts,
        roles=np.broadcast_to(roles[None], (g,) + roles.shape),
        labels_per_image=np.full((g, 4), 0.9),
        ok_rate=np.full(g, 0.95),
        prompts=np.tile([3, 6], (n_roles, 1)),
        role_names=[f"r{i}" for i in range(n_roles)],
    )


def cb_design(n_roles: int = 12, k_definition: str = "model", overall: str = "cohort"):
    config = {
        "contextbias": {
            "seeds": {"per_prompt": 4},
            "metrics": section_defaults("contextbias")["metrics"]
            | {"k_definition": k_definition, "overall": overall},
        }
    }
    return C.ContextBiasDesign(small_world(n_roles), config, "test world", [])


def small_biasig() -> B.BiasIGDesign:
    """The demo's BiasIG selection widened to an occupation, a characteristic pair, a
    two-person relation and two phrasings (implicit, explicit units and eta pairs)."""
    config, _ = load_config("config/demo.yaml")
    config["biasig"]["acquired_attributes"] = ["Nurse", "rich", "poor", "CEO", "Employer-Employee"]
    config["biasig"]["max_variants"] = 2
    return BW.build(config, load_priors(), None)
