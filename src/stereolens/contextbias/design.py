"""Power of the ContextBias headline comparison: the pooled-BI shift CA-U - CF (overall and per
cohort) under the role-level bootstrap (world, effect and estimator: docs/planner.md,
"The worlds in detail")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import xlogy

from stereolens.contextbias.bootstrap import role_multiplicity
from stereolens.contextbias.metrics import bi_from_parts, nanmean
from stereolens.design.power import EffectSpec, Simulation, set_key
from stereolens.design.sampling import _steps, multinomial, segment_sum

CONDITIONS = ("CF", "CA-U")
CHUNK_CELLS = 3_000_000
"""Role x condition x dimension x label cells drawn per batch of datasets (bounds memory)."""
BIAS_DATASETS = 16
BIAS_REPLICATES = 64
BIAS_POINTS = 7
"""Datasets and bootstrap replicates that estimate the role bootstrap's shift (the centre of
its percentile interval relative to the estimate; Monte Carlo error about sd / 30)."""
FEW_ROLES = 30
"""Below this many roles the "bc-t" rows' standard error is the emulated role bootstrap's
(:meth:`ContextBiasDesign.bootstrap_scale`, ``bootstrap_moments`` up to 4 roles) in place of the
estimate's spread over the datasets, which it overstates with few roles (measured:
docs/planner.md)."""
SCALE_REPLICATES = 16
"""Role-bootstrap replicates per simulated dataset that emulate the pipeline's se from 5 roles
to FEW_ROLES - 1; their se^2 is unbiased for the bootstrap's variance."""
SCALE_SHARE = 0.5
"""The share of the simulated datasets (the first) on which the role bootstrap is emulated from
5 roles on, at every grid point (its error: docs/planner.md)."""
EXACT_RESAMPLES = 35
"""Up to this many distinct resamples (C(2R - 1, R): 4 roles) every one is enumerated with its
multinomial probability instead."""
GRID = np.concatenate([[0.0], np.geomspace(1e-3, 1.0, 30)])
"""Planted strengths w (share of CA-U labels moved to the default)."""


@dataclass
class World:
    """Everything a simulated ContextBias dataset is drawn from. Labels are stored flat: the
    labels of dimension d are the columns starts[d]:starts[d + 1] of the last axis."""

    dims: list[str]
    cohorts: list[str]
    member: np.ndarray
    """(cohorts, dims) 0/1."""
    vocab_k: np.ndarray
    """(dims,) closed-vocabulary size or NaN (k_definition vocabulary)."""
    generators: list[str]
    starts: np.ndarray
    """(dims,) first label column of each dimension."""
    roles: np.ndarray
    """(generators, population roles, 2 conditions, labels) label probabilities (each
    dimension's columns sum to 1, or 0 where the generator has no label there)."""
    labels_per_image: np.ndarray
    """(generators, dims) label mentions per extracted image."""
    ok_rate: np.ndarray
    """(generators,) share of generated images that are extracted."""
    prompts: np.ndarray
    """(configured roles, 2) prompts per role under CF and CA-U."""
    role_names: list[str]
    labels: list[str] | None = None
    """(labels,) the label of each column (the schema's vocabulary for a closed dimension);
    None: "label<column>"."""

    @property
    def n_columns(self) -> int:
        return self.roles.shape[-1]

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(np.append(self.starts, self.n_columns))

    @property
    def segment(self) -> np.ndarray:
        """(labels,) the dimension of each label column."""
        return np.repeat(np.arange(len(self.dims)), self.sizes)

    def population(self) -> np.ndarray:
        """(generators, labels) the pooled population distribution (both conditions)."""
        return self.roles.mean(axis=(1, 2))

    def default_target(self) -> np.ndarray:
        """(generators, labels) one-hot: each dimension's most common label."""
        pop = self.population()
        out = np.zeros_like(pop)
        for a, k in zip(self.starts, self.sizes, strict=True):
            if k:
                top = a + pop[:, a : a + k].argmax(-1)
                out[np.arange(pop.shape[0]), top] = 1.0
        return out

    def buckets(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Dimensions of equal label counts: (dims (D_b,), columns (D_b, K_b)) per size."""
        out = []
        for k in sorted(set(self.sizes.tolist()) - {0}):
            dims = np.flatnonzero(self.sizes == k)
            out.append((dims, self.starts[dims][:, None] + np.arange(k)[None, :]))
        return out


# ----------------------------------------------------------------------------- estimator
def level_values(bi: np.ndarray, member: np.ndarray, overall: str = "cohort") -> np.ndarray:
    """(..., dims) BI -> (..., 1 + cohorts): overall, then each cohort; empty (NaN)
    dimensions are left out of every mean, as in the pipeline."""
    ok = np.isfinite(bi)
    num = np.where(ok, bi, 0.0) @ member.T
    den = ok.astype(float) @ member.T
    with np.errstate(invalid="ignore", divide="ignore"):
        cohort = num / den
        if overall == "cohort":
            top = nanmean(cohort, axis=-1)
        else:
            top = np.where(ok, bi, 0.0).sum(-1) / ok.sum(-1)
    return np.concatenate([top[..., None], cohort], axis=-1)


def bi_levels(
    cf: np.ndarray,
    cau: np.ndarray,
    starts: np.ndarray,
    member: np.ndarray,
    *,
    k_definition: str = "model",
    vocab_k: np.ndarray | None = None,
    overall: str = "cohort",
    single_label_bi: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Pooled label counts (..., labels; dimension d = columns starts[d]:starts[d+1]) of CF
    and CA-U -> level values (..., 1 + cohorts) of each, through :func:`bi_from_parts` with
    K per ``k_definition``."""
    k_model = np.add.reduceat(((cf + cau) > 0).astype(float), starts, axis=-1)
    out = []
    for c in (cf, cau):
        c = c.astype(float)
        total = np.add.reduceat(c, starts, axis=-1)
        xlogx = np.add.reduceat(xlogy(c, c), starts, axis=-1)
        m = np.add.reduceat((c > 0).astype(float), starts, axis=-1)
        if k_definition == "cell":
            k = m
        elif k_definition == "vocabulary" and vocab_k is not None:
            k = np.where(np.isnan(vocab_k), k_model, vocab_k)
        else:
            k = k_model
        bi = bi_from_parts(total, xlogx, m, np.maximum(k, m), single_label_bi=single_label_bi)
        out.append(level_values(bi, member, overall))
    return out[0], out[1]


# ----------------------------------------------------------------------------- simulation
def thin_to_default(counts: np.ndarray, default: np.ndarray, segment: np.ndarray, w, rng):
    """Counts (..., labels) with each label mention moved, with probability w, to its
    dimension's default label (``default`` one-hot per dimension):
    :func:`stereolens.design.sampling.thin_towards` with a one-hot target, where the
    redistribution needs no draw. Yields (grid index, counts)."""
    is_default = np.broadcast_to(default, counts.shape) > 0
    kept = counts.astype(np.int64).copy()
    n_dims = int(segment.max()) + 1 if segment.size else 0
    for i, q in _steps(w):
        if q > 0:
            moved = np.where(is_default, 0, rng.binomial(kept, q))
            kept -= moved
            kept += np.where(is_default, segment_sum(moved, segment, n_dims)[..., segment], 0)
        yield i, kept


def draw_role_counts(
    world: World,
    seeds: int,
    sims: int,
    rng,
    *,
    keep_roles: bool = False,
    planted: float = 0.0,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``sims`` datasets of ``seeds`` seeds per prompt: pooled label counts (G, sims, 2,
    labels) and, with ``keep_roles``, per configured role (G, sims, R, 2, labels). With
    ``planted`` = w > 0 the CA-U labels are drawn directly from (1 - w) p + w default (the
    power check's independent datasets; the planner thins instead)."""
    g_n, r_pop, _, n_lab = world.roles.shape
    r_cfg = world.prompts.shape[0]
    chunk = max(1, CHUNK_CELLS // max(1, r_cfg * 2 * n_lab))
    pooled = np.zeros((g_n, sims, 2, n_lab), dtype=np.int64)
    by_role = np.zeros((g_n, sims, r_cfg, 2, n_lab), dtype=np.int64) if keep_roles else None
    lam = world.labels_per_image
    ceil = np.maximum(1.0, np.ceil(lam))
    buckets = world.buckets()
    done = 0
    while done < sims:
        s = min(chunk, sims - done)
        idx = rng.integers(0, r_pop, size=(s, r_cfg))
        swap = rng.random((s, r_cfg)) < 0.5
        for g in range(g_n):
            probs = world.roles[g][idx]  # (s, R, 2, L)
            probs = np.where(swap[:, :, None, None], probs[:, :, ::-1], probs)
            if planted > 0:
                target = world.default_target()[g]
                probs = probs.copy()
                probs[:, :, 1] = (1 - planted) * probs[:, :, 1] + planted * target
            images = rng.binomial(
                np.broadcast_to(world.prompts * seeds, (s, r_cfg, 2)), world.ok_rate[g]
            )
            mentions = rng.binomial(
                images[..., None] * ceil[g].astype(np.int64), lam[g] / ceil[g]
            )  # (s, R, 2, D)
            x = np.zeros((s, r_cfg, 2, n_lab), dtype=np.int64)
            for dims, cols in buckets:
                x[..., cols] = multinomial(mentions[..., dims], probs[..., cols], rng)
            pooled[g, done : done + s] = x.sum(1)
            if by_role is not None:
                by_role[g, done : done + s] = x
        done += s
    return pooled, by_role


def role_resamples(n_roles: int, replicates: int, datasets: int, rng):
    """The role bootstrap's resamples: (multiplicities (1 or datasets, B, R), weights (B,),
    exact). Every distinct resample with its multinomial probability where there are at most
    EXACT_RESAMPLES of them (exact), else ``replicates`` draws per dataset, each 1 / B."""
    from itertools import combinations_with_replacement
    from math import comb

    from scipy.stats import multinomial as mn

    if comb(2 * n_roles - 1, n_roles) <= EXACT_RESAMPLES:
        draws = np.array(list(combinations_with_replacement(range(n_roles), n_roles)))
        mult = role_multiplicity(draws, n_roles)
        return mult[None], mn.pmf(mult, n_roles, np.full(n_roles, 1.0 / n_roles)), True
    draws = rng.integers(0, n_roles, size=(datasets * replicates, n_roles))
    mult = role_multiplicity(draws, n_roles).reshape(datasets, replicates, n_roles)
    return mult, np.full(replicates, 1.0 / replicates), False


def weighted_moments(x: np.ndarray, weight: np.ndarray, exact: bool):
    """(mean, variance) over the last axis of replicate values (NaN left out) with the
    resamples' ``weight``: the bootstrap distribution's own variance where ``exact``, else
    the sample variance (ddof 1), as the pipeline's interval takes it."""
    ok = np.isfinite(x)
    wgt = np.where(ok, weight, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = wgt.sum(-1)
        mean = (np.where(ok, x, 0.0) * wgt).sum(-1) / total
        var = (np.where(ok, x - mean[..., None], 0.0) ** 2 * wgt).sum(-1) / total
        if not exact:
            n_ok = ok.sum(-1)
            var = var * n_ok / (n_ok - 1)
    return mean, var


class ContextBiasDesign:
    """:class:`stereolens.design.power.Design` of ContextBias (docs/planner.md)."""

    benchmark = "contextbias"
    knob = ("contextbias", "seeds", "per_prompt")
    knob_label = "seeds per prompt"
    search_limit = 5000

    def resized(self, config: dict[str, Any], value: int) -> dict[str, Any]:
        """``config`` with ``value`` seeds per prompt; one job per role x condition stays one
        job: a shard grows with the seeds (never shrinks: the validation prompts' shards use
        it too)."""
        seeds = config["contextbias"]["seeds"]
        new = set_key(config, self.knob, value)
        if seeds["per_shard"] >= seeds["per_prompt"]:
            shard = max(seeds["per_shard"], value)
            new = set_key(new, ("contextbias", "seeds", "per_shard"), shard)
        return new

    def __init__(self, world: World, config: dict[str, Any], basis: str, notes: list[str]):
        from stereolens.contextbias.settings import ContextBiasSettings

        st = ContextBiasSettings.from_config(config["contextbias"])
        self.world = world
        self.basis = basis
        self.notes = list(notes)
        self.knob_value = int(config["contextbias"]["seeds"]["per_prompt"])
        self.k_definition = st.k_definition
        self.overall = st.overall
        self.single_label_bi = st.single_label_bi
        # the basic and bc-t intervals are centred at the estimate minus the replicates'
        # shift (2 x estimate - their mean), the percentile interval at the estimate plus it
        kind = self.interval = st.bootstrap_interval
        self.shift_sign = -1.0 if kind in ("basic", "bc-t") else 1.0
        self.grid = GRID

    def _names(self) -> list[tuple[str, str, int | None, int]]:
        """(name, comparison, generator index or None for "*", level index): overall and
        cohorts for model "*", overall per generator."""
        w = self.world
        g_n = len(w.generators)
        star = f"mean of {g_n} generator{'s' if g_n > 1 else ''}"
        out = [("contextbias.bi_shift", f"CA-U - CF, overall, {star}", None, 0)]
        out += [
            (f"contextbias.bi_shift.{c}", f"CA-U - CF, {c}, {star}", None, 1 + i)
            for i, c in enumerate(w.cohorts)
        ]
        if g_n > 1:
            out += [
                (f"contextbias.bi_shift:{g}", f"CA-U - CF, overall, {g}", gi, 0)
                for gi, g in enumerate(w.generators)
            ]
        return out

    def specs(self) -> list[EffectSpec]:
        definition = (
            "population pooled BI under CA-U minus under CF; CA-U labels pulled towards each "
            "dimension's most common label"
        )
        df = max(1, self.world.prompts.shape[0] - 1)
        estimand = (
            f"a new draw of {self.world.prompts.shape[0]} roles (the role bootstrap's "
            "population), each with the config's prompts"
        )
        return [
            EffectSpec(
                name, self.benchmark, comp, "BI", "interval", 0.0, definition, df, estimand=estimand
            )  # fmt: skip
            for name, comp, _, _ in self._names()
        ]

    def levels(self, cf: np.ndarray, cau: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Level values of pooled counts through the configured BI options."""
        return bi_levels(
            cf, cau, self.world.starts, self.world.member, k_definition=self.k_definition,
            vocab_k=self.world.vocab_k, overall=self.overall,
            single_label_bi=self.single_label_bi,
        )  # fmt: skip

    def _collect(self, lv_cf: np.ndarray, lv_cau: np.ndarray) -> dict[str, np.ndarray]:
        """Level values (G, ..., L) -> CA-U - CF per name (...)."""
        star_cf, star_cau = nanmean(lv_cf, axis=0), nanmean(lv_cau, axis=0)
        out = {}
        for name, _, g, li in self._names():
            if g is None:
                out[name] = star_cau[..., li] - star_cf[..., li]
            else:
                out[name] = lv_cau[g, ..., li] - lv_cf[g, ..., li]
        return out

    def effects(self, w: np.ndarray) -> dict[str, np.ndarray]:
        w = np.asarray(w, dtype=float)[:, None]
        pop = self.world.population()[:, None]  # (G, 1, L)
        target = self.world.default_target()[:, None]
        cau = (1 - w) * pop + w * target  # (G, W, L)
        # counts proportional to the distributions: K = the labels the world has
        lv_cf, lv_cau = bi_levels(
            np.broadcast_to(pop, cau.shape) * 1e9, cau * 1e9, self.world.starts,
            self.world.member, k_definition="model", overall=self.overall,
            single_label_bi=self.single_label_bi,
        )  # fmt: skip
        return self._collect(lv_cf, lv_cau)

    @property
    def emulates_se(self) -> bool:
        """Whether the "bc-t" rows take the emulated role bootstrap's se (2 to FEW_ROLES - 1
        roles)."""
        return self.interval == "bc-t" and 2 <= self.world.prompts.shape[0] < FEW_ROLES

    def simulate(self, n: int, w: np.ndarray, sims: int, rng) -> Simulation:
        from math import comb

        emulate = self.emulates_se
        r_cfg = self.world.prompts.shape[0]
        if emulate and comb(2 * r_cfg - 1, r_cfg) <= EXACT_RESAMPLES:
            return self.bootstrap_moments(n, w, sims, rng)
        # keep_roles draws as without: the estimates are the same either way
        counts, by_role = draw_role_counts(self.world, n, sims, rng, keep_roles=emulate)
        target = self.world.default_target()[:, None]  # (G, 1, L)
        cf = counts[:, :, 0]
        out: dict[str, np.ndarray] = {}
        for i, cau in thin_to_default(counts[:, :, 1], target, self.world.segment, w, rng):
            for name, v in self._collect(*self.levels(cf, cau)).items():
                out.setdefault(name, np.empty((len(w),) + v.shape))[i] = v
        if by_role is not None:
            shift, scale = self.bootstrap_scale(by_role, w, rng)
            return Simulation(out, shift, scale, t_df=self.t_df(out))
        return Simulation(out, self.bootstrap_shift(n, w, rng), t_df=self.t_df(out))

    def bootstrap_scale(
        self, by_role: np.ndarray, w: np.ndarray, rng, replicates: int = SCALE_REPLICATES
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """name -> (W,) shift and scale of the "bc-t" rows from 5 to FEW_ROLES - 1 roles: the
        role bootstrap emulated at every grid point on the first SCALE_SHARE of the
        simulated datasets (per-role counts (G, sims, R, 2, labels); ``replicates`` draws
        each, paired across generators and conditions, as cluster_bootstrap). shift = the
        mean over datasets of the replicate mean minus the estimate (negated under bc-t),
        scale = sqrt(the mean over datasets of the replicates' variance x R / (R - 1)): the
        pipeline's se, which with few roles exceeds the estimate's spread."""
        by_role = by_role[:, : max(1, round(by_role.shape[1] * SCALE_SHARE))]
        g_n, sims, r_cfg, _, n_lab = by_role.shape
        mult, weight, exact = role_resamples(r_cfg, replicates, sims, rng)
        chunk = max(1, CHUNK_CELLS // max(1, g_n * len(weight) * n_lab))
        target = self.world.default_target()[:, None, None]  # (G, 1, 1, L)
        cf_role = by_role[:, :, :, 0].astype(float)
        cf = cf_role.sum(2)
        rep_bias: dict[str, np.ndarray] = {}
        rep_var: dict[str, np.ndarray] = {}
        for i, cau in thin_to_default(by_role[:, :, :, 1], target, self.world.segment, w, rng):
            cau = cau.astype(float)
            est = self._collect(*self.levels(cf, cau.sum(2)))
            for a in range(0, sims, chunk):
                sl = slice(a, a + chunk)
                moments = self.replicate_moments(
                    cf_role[:, sl], cau[:, sl], mult[sl], weight, exact
                )
                for name, (mean, var) in moments.items():
                    bias = rep_bias.setdefault(name, np.empty((len(w), sims)))
                    bias[i, sl] = mean - est[name][sl]
                    rep_var.setdefault(name, np.empty((len(w), sims)))[i, sl] = var
        shift, scale = {}, {}
        for name in rep_bias:
            b = nanmean(rep_bias[name], axis=1)
            shift[name] = self.shift_sign * np.where(np.isnan(b), 0.0, b)
            scale[name] = np.sqrt(nanmean(rep_var[name], axis=1) * r_cfg / (r_cfg - 1))
        return shift, scale

    def bootstrap_moments(
        self, n: int, w: np.ndarray, sims: int, rng, replicates: int = SCALE_REPLICATES
    ) -> Simulation:
        """:meth:`simulate` of the "bc-t" rows with 2 to 4 roles: the role bootstrap on each
        of the ``sims`` datasets at every grid point, all its resamples enumerated
        (:func:`role_resamples`, paired across generators and conditions, as
        cluster_bootstrap); shift (the replicate mean minus the estimate, negated under
        bc-t) and scale (sqrt(the replicates' variance x R / (R - 1)), the pipeline's se)
        are each dataset's own (W, sims), and power_curve applies each dataset's interval as
        it is: chi2(R - 1) misdescribes the se's spread over datasets there (3 roles, test
        world: the relative variance of se^2 0.49, chi2(2) / 2's 1.0)."""
        _, by_role = draw_role_counts(self.world, n, sims, rng, keep_roles=True)
        g_n, _, r_cfg, _, n_lab = by_role.shape
        mult, weight, exact = role_resamples(r_cfg, replicates, sims, rng)
        chunk = max(1, CHUNK_CELLS // max(1, g_n * len(weight) * n_lab))
        target = self.world.default_target()[:, None, None]  # (G, 1, 1, L)
        cf_role = by_role[:, :, :, 0].astype(float)
        cf = cf_role.sum(2)
        out: dict[str, np.ndarray] = {}
        rep_mean: dict[str, np.ndarray] = {}
        rep_var: dict[str, np.ndarray] = {}
        for i, cau in thin_to_default(by_role[:, :, :, 1], target, self.world.segment, w, rng):
            cau = cau.astype(float)
            for name, v in self._collect(*self.levels(cf, cau.sum(2))).items():
                out.setdefault(name, np.empty((len(w), sims)))[i] = v
            for a in range(0, sims, chunk):
                sl = slice(a, a + chunk)
                moments = self.replicate_moments(cf_role[:, sl], cau[:, sl], mult, weight, exact)
                for name, (mean, var) in moments.items():
                    rep_mean.setdefault(name, np.empty((len(w), sims)))[i, sl] = mean
                    rep_var.setdefault(name, np.empty((len(w), sims)))[i, sl] = var
        shift = {name: self.shift_sign * (rep_mean[name] - e) for name, e in out.items()}
        scale = {name: np.sqrt(v * r_cfg / (r_cfg - 1)) for name, v in rep_var.items()}
        return Simulation(out, shift, scale, t_df=self.t_df(out))

    def replicate_moments(
        self, cf_role: np.ndarray, cau_role: np.ndarray, mult: np.ndarray, weight: np.ndarray,
        exact: bool,
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:  # fmt: skip
        """name -> (mean, variance) (datasets,) of the role bootstrap's replicates of per-role
        counts (G, datasets, R, labels) under resamples ``mult`` (1 or datasets, B, R) with
        ``weight`` (:func:`role_resamples`, :func:`weighted_moments`)."""
        boot = self._collect(*self.levels(mult @ cf_role, mult @ cau_role))
        return {name: weighted_moments(b, weight, exact) for name, b in boot.items()}

    def t_df(self, estimates: dict[str, np.ndarray]) -> dict[str, int]:
        """name -> R - 1 (R = the roles) under the "bc-t" interval, whose half-width is
        t_(R - 1) x the replicates' sd x sqrt(R / (R - 1)) (contextbias.intervals.t_factor;
        the sqrt undoes the bootstrap sd's sqrt((R - 1) / R), so the sd is the estimate's
        spread over the simulated datasets from FEW_ROLES roles on, the emulated se below):
        power_curve then takes t(R - 1)'s quantile at the planner's level in place of z's;
        empty for the basic and percentile intervals (z x the sd)."""
        if self.interval != "bc-t":
            return {}
        df = max(1, self.world.prompts.shape[0] - 1)
        return dict.fromkeys(estimates, df)

    def bootstrap_shift(
        self, n: int, w: np.ndarray, rng, datasets: int = BIAS_DATASETS,
        replicates: int = BIAS_REPLICATES,
    ) -> dict[str, np.ndarray]:  # fmt: skip
        """name -> (W,) mean over ``datasets`` simulated datasets of the role bootstrap's
        replicate mean minus the estimate (paired draws, as cluster_bootstrap), negated under
        the basic and bc-t intervals (contextbias.metrics.bootstrap_interval): where the
        pipeline's interval is centred relative to the estimate. Vectorised: a (replicates x roles)
        multiplicity matrix times each dataset's per-role counts."""
        _, by_role = draw_role_counts(self.world, n, datasets, rng, keep_roles=True)
        r_cfg = by_role.shape[2]
        draws = rng.integers(0, r_cfg, size=(datasets, replicates, r_cfg))
        mult = np.zeros((datasets, replicates, r_cfg))
        for d in range(datasets):
            mult[d] = role_multiplicity(draws[d], r_cfg)
        target = self.world.default_target()[:, None, None]  # (G, 1, 1, L)
        cf_role = by_role[:, :, :, 0].astype(float)
        cf_est = cf_role.sum(2)
        cf_boot = np.einsum("dbr,gdrl->gdbl", mult, cf_role)
        w = np.asarray(w, dtype=float)
        # at most BIAS_POINTS grid points, linear in between (the shift varies slowly in w)
        at = set(
            np.unique(np.linspace(0, len(w) - 1, min(len(w), BIAS_POINTS)).round()).astype(int)
        )
        out: dict[str, np.ndarray] = {}
        for i, cau in thin_to_default(by_role[:, :, :, 1], target, self.world.segment, w, rng):
            if i not in at:
                continue
            cau = cau.astype(float)
            est = self._collect(*self.levels(cf_est, cau.sum(2)))  # name -> (datasets,)
            boot = self._collect(
                *self.levels(cf_boot, np.einsum("dbr,gdrl->gdbl", mult, cau))
            )  # name -> (datasets, replicates)
            for name, e in est.items():
                v = nanmean(nanmean(boot[name], axis=-1) - e)
                v = 0.0 if np.isnan(v) else self.shift_sign * v
                out.setdefault(name, np.full(len(w), np.nan))[i] = v
        for name, v in out.items():
            ok = np.isfinite(v)
            out[name] = np.interp(w, w[ok], v[ok])
        return out
