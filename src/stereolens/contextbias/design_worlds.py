"""The ContextBias design's worlds: the simulated population from the prior or a pilot run
(``--pilot``), and the tables a world's draws make for the power check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from stereolens.contextbias.design import (
    CONDITIONS,
    ContextBiasDesign,
    World,
    draw_role_counts,
)
from stereolens.validation import ConfigError


def _schema_dims(schema=None):
    from stereolens.contextbias.schema import AttributeSchema

    schema = schema or AttributeSchema.load()
    dims = [(d.cohort, d.name, d.kind, d.vocabulary) for d in schema.counted_dimensions]
    vocab = schema.vocabulary()
    return dims, vocab


def _membership(dim_cohorts: list[str]) -> tuple[list[str], np.ndarray]:
    cohorts = sorted(set(dim_cohorts))
    member = np.zeros((len(cohorts), len(dim_cohorts)))
    for i, c in enumerate(dim_cohorts):
        member[cohorts.index(c), i] = 1.0
    return cohorts, member


def geometric(k: int, ratio: float) -> np.ndarray:
    p = ratio ** np.arange(k)
    return p / p.sum()


def _bi(p: np.ndarray) -> float:
    from stereolens.metrics.entropy import bias_intensity

    return bias_intensity(p * 1e9, len(p))


def _ratio_for(ks: list[int], target_bi: float) -> float:
    """The geometric ratio whose mean BI over dimensions of sizes ``ks`` is ``target_bi``."""
    from scipy.optimize import brentq

    def f(r: float) -> float:
        return float(np.mean([_bi(geometric(k, r)) if k > 1 else 0.0 for k in ks])) - target_bi

    lo, hi = 1e-4, 1.0 - 1e-9
    if f(lo) < 0:
        return lo
    if f(hi) > 0:
        return hi
    return float(brentq(f, lo, hi))


def config_prompts(config: dict[str, Any]) -> tuple[list[str], np.ndarray]:
    """(roles, prompts per role under CF and CA-U) of the config's prompt bank."""
    from stereolens.contextbias.prompts import bank_roles, build_prompts

    cb = config["contextbias"]
    roles = cb["roles"] or bank_roles(cb["prompt_bank"])
    prompts = build_prompts(
        models=["_"], seeds_per_prompt=1, default_bank_key=cb["seeds"]["default_bank_key"],
        roles=roles, bank_path=cb["prompt_bank"], fix_articles=cb["fix_articles"],
    )  # fmt: skip
    counts = prompts.group_by("role", "condition").agg(pl.len().alias("n"))
    table = np.zeros((len(roles), 2), dtype=np.int64)
    for role, cond, n in counts.iter_rows():
        if cond in CONDITIONS:
            table[roles.index(role), CONDITIONS.index(cond)] = n
    return list(roles), table


def prior_world(config: dict[str, Any], priors: dict[str, Any], seed: int = 0) -> World:
    """The documented prior world (resources/design/priors.v1.yaml, contextbias)."""
    pr = priors["contextbias"]
    dims, vocab = _schema_dims()
    names = [d[1] for d in dims]
    k_of = np.array(
        [len(vocab[n]) if vocab[n] else int(pr["open_vocabulary_labels"]) for n in names]
    )
    starts = np.concatenate([[0], np.cumsum(k_of)[:-1]]).astype(np.intp)
    segment = np.repeat(np.arange(len(names)), k_of)
    cohort_of = [d[0] for d in dims]
    cohorts, member = _membership(cohort_of)
    mu = np.zeros(int(k_of.sum()))
    for c in cohorts:
        idx = [i for i, x in enumerate(cohort_of) if x == c]
        if c not in pr["cohort_bi"]:
            raise ConfigError(f"priors: contextbias.cohort_bi lacks cohort {c!r}")
        r = _ratio_for([int(k_of[i]) for i in idx], float(pr["cohort_bi"][c]))
        for i in idx:
            mu[starts[i] : starts[i] + k_of[i]] = geometric(int(k_of[i]), r)
    rng = np.random.default_rng([seed, 7315])
    r_pop = int(pr["population_roles"])
    gens = list(config["contextbias"]["generators"])
    tau = float(pr["role_concentration"])
    col_cohort = np.array([cohorts.index(cohort_of[d]) for d in segment], dtype=np.intp)
    kappa = _per_cohort(pr, "condition_concentration", cohorts, None)[col_cohort]
    share = _per_cohort(pr, "generator_share", cohorts, 1.0)[col_cohort]
    k_shared, k_gen = split_concentration(kappa, share)
    centre = dirichlet(rng, tau * np.broadcast_to(mu, (r_pop, mu.size)), starts, segment)
    both = np.broadcast_to(centre[:, None], (r_pop, 2, mu.size))
    shared = dirichlet(rng, k_shared * both, starts, segment)  # (R, 2 conditions, L)
    own = dirichlet(
        rng, np.where(share < 1, k_gen, 1.0) * np.broadcast_to(shared, (len(gens),) + shared.shape),
        starts, segment,
    )  # fmt: skip
    roles = np.where(share < 1, own, shared[None])
    lam = np.array(
        [pr["labels_per_image"]["list" if d[2] == "list" else "scalar"] for d in dims], float
    )
    role_names, prompts = config_prompts(config)
    labels = [
        vocab[n][j] if vocab[n] else f"label{starts[i] + j}"
        for i, n in enumerate(names)
        for j in range(int(k_of[i]))
    ]
    return World(
        dims=names,
        cohorts=cohorts,
        member=member,
        vocab_k=np.array([len(vocab[n]) if vocab[n] else np.nan for n in names], float),
        generators=gens,
        starts=starts,
        roles=roles,
        labels_per_image=np.broadcast_to(lam, (len(gens), lam.size)),
        ok_rate=np.full(len(gens), 1.0 - float(pr["discard_rate"])),
        prompts=prompts,
        role_names=role_names,
        labels=labels,
    )


def _per_cohort(pr: dict[str, Any], key: str, cohorts: list[str], default) -> np.ndarray:
    """(cohorts,) a prior value given once or per cohort (a mapping)."""
    value = pr.get(key, default)
    if value is None:
        raise ConfigError(f"priors: contextbias.{key} is missing")
    if isinstance(value, dict):
        missing = [c for c in cohorts if c not in value]
        if missing:
            raise ConfigError(f"priors: contextbias.{key} lacks cohort(s) {missing}")
        return np.array([float(value[c]) for c in cohorts])
    return np.full(len(cohorts), float(value))


def split_concentration(kappa, share) -> tuple[np.ndarray, np.ndarray]:
    """(k_shared, k_gen) of the two-level scatter of a role's condition distributions: shared
    ~ Dirichlet(k_shared x centre) across generators, each generator's ~ Dirichlet(k_gen x
    shared). A Dirichlet(k x p) deviates from p with variance p (1 - p) / (k + 1), so the two
    levels have the total variance factor v = 1 / (kappa + 1) of one Dirichlet(kappa x
    centre) when 1 / (k_shared + 1) = share x v and k_shared / (k_shared + 1) / (k_gen + 1) =
    (1 - share) x v; ``share`` is then the generators' common part of it (their correlation
    before image noise). share >= 1: one level (k_gen infinite, the generators' roles alike)."""
    kappa, share = np.asarray(kappa, float), np.minimum(np.asarray(share, float), 1.0)
    v = 1.0 / (kappa + 1.0)
    k_shared = 1.0 / (share * v) - 1.0
    with np.errstate(divide="ignore"):
        k_gen = np.where(
            share < 1, (1.0 - share * v) / np.maximum((1.0 - share) * v, 1e-12) - 1.0, np.inf
        )
    return k_shared, k_gen


# ----------------------------------------------------------------------------- calibration
PAPER_HALF_WIDTHS = {
    # cohort: (Table 8, mean of 4 generators; Table 9: SD 3.5, SDXL, FLUX.1, Qwen-Image),
    # half-widths (high - low) / 2 of the 95% intervals of CA-U - CF (paper 002, App. E.1)
    "people": (0.010, (0.0175, 0.014, 0.012, 0.0145)),
    "camera": (0.0255, (0.0425, 0.034, 0.0335, 0.032)),
    "objects": (0.0195, (0.0215, 0.0235, 0.019, 0.024)),
    "scene": (0.018, (0.0225, 0.0265, 0.0235, 0.028)),
}


def implied_correlation(mean_half_width: float, half_widths) -> float:
    """The correlation rho between generators that makes the interval of their mean as wide
    as given, with one rho for every pair: Var(mean) = (sum_g s_g^2 + rho sum_(g != h) s_g
    s_h) / G^2, so rho = (G^2 s_mean^2 - sum s_g^2) / ((sum s_g)^2 - sum s_g^2), with the
    half-widths standing for the s (one z for all). Paper 002 Tables 8 and 9 (CA-U - CF):
    People 0.30, Camera 0.35, Objects 0.71, Scene 0.35 (the prior's generator_share)."""
    s = np.asarray(half_widths, float)
    g = s.size
    return float((g**2 * mean_half_width**2 - (s**2).sum()) / (s.sum() ** 2 - (s**2).sum()))


def calibration(design: ContextBiasDesign, sims: int = 200, seed: int = 0) -> dict:
    """cohort -> (mean over generators of the 95% half-width 1.96 x sd of its CA-U - CF
    over ``sims`` simulated datasets with no effect, half-width of the mean of the
    generators, mean correlation over pairs of generators): what the prior's
    condition_concentration and generator_share are tuned against (PAPER_HALF_WIDTHS)."""
    w = design.world
    counts, _ = draw_role_counts(w, design.knob_value, sims, np.random.default_rng([seed, 99]))
    cf, cau = design.levels(counts[:, :, 0], counts[:, :, 1])  # (G, S, 1 + cohorts)
    diff = cau - cf
    out = {}
    for i, c in enumerate(w.cohorts):
        x = diff[:, :, 1 + i]  # (G, S)
        r = np.corrcoef(x)
        pairs = r[np.triu_indices(x.shape[0], 1)]
        out[c] = (
            float(1.96 * x.std(axis=1, ddof=1).mean()),
            float(1.96 * x.mean(axis=0).std(ddof=1)),
            float(pairs.mean()) if pairs.size else float("nan"),
        )
    return out


def dirichlet(rng, alpha: np.ndarray, starts: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Dirichlet draws per dimension (columns starts[d]:...) for an array of parameters."""
    g = np.where(alpha > 0, rng.standard_gamma(np.where(alpha > 0, alpha, 1.0)), 0.0)
    s = np.add.reduceat(g, starts, axis=-1)[..., segment]
    return np.where(s > 0, g / np.where(s > 0, s, 1.0), 0.0)


def pilot_world(
    config: dict[str, Any], results: Path, extractor: str | None = None, smoothing: float = 1.0
) -> tuple[World, list[str]]:
    """The world of a pilot run's tables (results/contextbias/attributes.parquet and
    images.parquet): per generator and pilot role, the label counts of each dimension under
    CF and CA-U, smoothed towards the generator's pooled distribution by ``smoothing``
    pseudo-images; labels per image and the extraction success rate measured. Returns the
    world and notes (warnings about a small pilot)."""
    from stereolens.contextbias.layout import LAYOUT
    from stereolens.contextbias.metrics import use_label_column

    att_path, img_path = LAYOUT.at(results, "attributes"), LAYOUT.at(results, "images")
    for p in (att_path, img_path):
        if not p.is_file():
            raise ConfigError(
                f"pilot: {p} is missing; --pilot takes the results folder of a finished run "
                "of the same config (make demo writes results/)"
            )
    att = use_label_column(pl.read_parquet(att_path), "auto")
    img = pl.read_parquet(img_path)
    notes: list[str] = []
    if "extractor" in att.columns:
        extractors = sorted(att["extractor"].unique().to_list())
        configured = [x for x in config["contextbias"]["extractors"] if x in extractors]
        chosen = extractor or (configured[0] if configured else extractors[0])
        if chosen not in extractors:
            raise ConfigError(f"pilot: no extractor {chosen!r} in {att_path}; it has {extractors}")
        att = att.filter(pl.col("extractor") == chosen)
        if "extractor" in img.columns:
            img = img.filter(pl.col("extractor") == chosen)
        if len(extractors) > 1:
            notes.append(f"ContextBias pilot: extractor {chosen} (of {', '.join(extractors)})")
    att = att.filter(pl.col("condition").is_in(CONDITIONS))
    img = img.filter(pl.col("condition").is_in(CONDITIONS))
    if att.height == 0:
        raise ConfigError(f"pilot: {att_path} has no CF or CA-U rows")
    gens = sorted(att["model"].unique().to_list())
    wanted = [g for g in config["contextbias"]["generators"] if g in gens]
    if wanted:
        gens = wanted
    else:
        notes.append(
            "ContextBias pilot: its generators (" + ", ".join(gens) + ") are not the config's; "
            "the pilot's are used with the config's sizes"
        )
    dim_rows = att.select("cohort", "dimension").unique().sort("cohort", "dimension")
    names = dim_rows["dimension"].to_list()
    cohorts, member = _membership(dim_rows["cohort"].to_list())
    labels = att.select("dimension", "label").unique()
    labels = labels.with_columns(
        pl.col("dimension").replace_strict({d: i for i, d in enumerate(names)}).alias("d")
    ).sort("d", "label")
    pairs = list(labels.select("dimension", "label").iter_rows())
    col = {(d, lab): i for i, (d, lab) in enumerate(pairs)}
    k_of = np.bincount(labels["d"].to_numpy(), minlength=len(names))
    starts = np.concatenate([[0], np.cumsum(k_of)[:-1]]).astype(np.intp)
    segment = np.repeat(np.arange(len(names)), k_of)
    roles = sorted(att["role"].unique().to_list())
    if len(roles) < 10:
        notes.append(
            f"ContextBias pilot has {len(roles)} role(s): the spread between roles, which sets "
            "the role bootstrap's interval, is poorly known below 10 roles"
        )
    d_ix = {d: i for i, d in enumerate(names)}
    r_ix = {r: i for i, r in enumerate(roles)}
    n_lab = int(k_of.sum())
    counts = np.zeros((len(gens), len(roles), 2, n_lab))
    lam = np.zeros((len(gens), len(names)))
    ok = np.zeros(len(gens))
    for gi, g in enumerate(gens):
        sub = att.filter(pl.col("model") == g)
        agg = sub.group_by("role", "condition", "dimension", "label").agg(pl.len().alias("n"))
        for role, cond, dim, lab, n in agg.iter_rows():
            counts[gi, r_ix[role], CONDITIONS.index(cond), col[(dim, lab)]] = n
        g_img = img.filter(pl.col("model") == g)
        if "status" in g_img.columns:
            n_ok = int((g_img["status"] == "ok").sum())
        else:
            n_ok = g_img.height
        ok[gi] = n_ok / g_img.height if g_img.height else 1.0
        for dim, n in sub.group_by("dimension").agg(pl.len().alias("n")).iter_rows():
            lam[gi, d_ix[dim]] = n / max(n_ok, 1)
    pooled = counts.sum(axis=(1, 2))  # (G, L)
    pooled_dim = np.add.reduceat(pooled, starts, axis=-1)[..., segment]
    share = np.where(pooled_dim > 0, pooled / np.where(pooled_dim > 0, pooled_dim, 1.0), 0.0)
    tot = np.add.reduceat(counts, starts, axis=-1)[..., segment]
    probs = (counts + smoothing * share[:, None, None]) / (tot + smoothing)
    role_names, prompts = config_prompts(config)
    return (
        World(
            dims=names,
            cohorts=cohorts,
            member=member,
            vocab_k=_vocab_sizes(names),
            generators=gens,
            starts=starts,
            roles=probs,
            labels_per_image=lam,
            ok_rate=np.clip(ok, 1e-6, 1.0),
            prompts=prompts,
            role_names=role_names,
            labels=[lab for _, lab in pairs],
        ),
        notes,
    )


def _vocab_sizes(names: list[str]) -> np.ndarray:
    _, vocab = _schema_dims()
    return np.array([len(vocab[n]) if vocab.get(n) else np.nan for n in names], float)


def build(config: dict[str, Any], priors: dict[str, Any], pilot: Path | None, seed: int = 0):
    """The ContextBias design of ``config``: from ``pilot`` (a results folder) or the prior."""
    if pilot is not None:
        world, notes = pilot_world(config, pilot)
        return ContextBiasDesign(world, config, f"pilot {pilot}", notes)
    return ContextBiasDesign(prior_world(config, priors, seed), config, "prior", [])


# ----------------------------------------------------------------------------- tables
def attributes_table(world: World, role_counts: np.ndarray, dataset: int) -> pl.DataFrame:
    """The long attributes table (model, role, condition, image_id, cohort, dimension,
    label) of one simulated dataset from its per-role counts (G, sims, R, 2, labels): the
    real pipeline's input. The k-th label mention of a role x condition x dimension goes to
    image k of that cell, so that a label counts once per image."""
    x = role_counts[:, dataset]
    g_i, r_i, c_i, l_i = np.nonzero(x)
    n = x[g_i, r_i, c_i, l_i]
    reps = np.repeat(np.arange(len(n)), n)
    seg = world.segment[l_i[reps]]
    cohort_of = [world.cohorts[int(np.argmax(world.member[:, d]))] for d in range(len(world.dims))]
    # integer codes first, strings from polars (numpy string ops cost 20 s a paper dataset)
    frame = pl.DataFrame(
        {
            "g": g_i[reps].astype(np.int64),
            "r": r_i[reps].astype(np.int64),
            "c": c_i[reps].astype(np.int64),
            "seg": seg.astype(np.int64),
            "l": l_i[reps].astype(np.int64),
        }
    )

    def names(col: str, values: list[str]) -> pl.Expr:
        return pl.col(col).replace_strict(dict(enumerate(values)), return_dtype=pl.String)

    frame = frame.select(
        names("g", list(world.generators)).alias("model"),
        pl.concat_str(pl.lit("role"), pl.col("r").cast(pl.String)).alias("role"),
        names("c", list(CONDITIONS)).alias("condition"),
        names("seg", cohort_of).alias("cohort"),
        names("seg", list(world.dims)).alias("dimension"),
        (
            names("l", list(world.labels))
            if world.labels is not None
            else pl.concat_str(pl.lit("label"), pl.col("l").cast(pl.String))
        ).alias("label"),
    )
    slot = pl.int_range(pl.len()).over("model", "role", "condition", "dimension")
    image = pl.concat_str(
        [pl.col("model"), pl.col("role"), pl.col("condition"), slot.cast(pl.String)],
        separator="|",
    )
    return frame.with_columns(image.alias("image_id")).select(
        "model", "role", "condition", "image_id", "cohort", "dimension", "label"
    )
