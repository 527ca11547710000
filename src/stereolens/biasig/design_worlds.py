"""The BiasIG design's worlds: the simulated population from the prior or a pilot run
(``--pilot``), and the tables a world's draws make for the power check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from stereolens.biasig.answers import scoring_table
from stereolens.biasig.design import SEGMENT, BiasIGDesign, World, normalise
from stereolens.biasig.formulas import ANSWER_ALIASES
from stereolens.biasig.pairs import resolve_pairs
from stereolens.biasig.truth import ATTRIBUTES, VALUE_INDEX, VALUES, positions
from stereolens.validation import ConfigError


def _selection(config: dict[str, Any]):
    from stereolens.biasig.prompts import load_prompts, select_prompts

    bg = config["biasig"]
    prompts = select_prompts(
        load_prompts(), bg["acquired_types"], bg["conditions"], bg["acquired_attributes"],
        bg["max_variants"],
    )  # fmt: skip
    return prompts


def unit_table(prompts: pl.DataFrame, scoring_unit: str) -> pl.DataFrame:
    """One row per scoring unit of ``prompts`` (the columns the estimators read)."""
    t = scoring_table(prompts, scoring_unit)
    cols = [
        "visibility", "attribute_key", "n_persons", "weight", "protected_attribute",
        "protected_value", "protected_value_left", "protected_value_right",
    ]  # fmt: skip
    units = t.group_by("unit", maintain_order=True).agg(
        *(pl.col(c).first() for c in cols),
        pl.len().cast(pl.Int64).alias("n_phrasings"),
        pl.col("prompt_id"),
    )
    return units


def _base_world(config: dict[str, Any], priors: dict[str, Any]) -> tuple[World, pl.DataFrame]:
    from stereolens.biasig.truth import load_truth

    bg = config["biasig"]
    truth = load_truth()
    prompts = _selection(config)
    units = unit_table(prompts, bg.get("scoring_unit", "subject"))
    vis = units["visibility"].to_numpy()
    imp = np.flatnonzero(vis == "implicit")
    exp = np.flatnonzero(vis == "explicit")
    persons = units["n_persons"].to_numpy()
    keys = units["attribute_key"].to_list()
    gt = np.zeros((imp.size, 2, 9))
    used = np.zeros((imp.size, 2), bool)
    for i, u in enumerate(imp):
        for s, pos in enumerate(positions(persons[u])):
            gt[i, s] = truth.distribution(keys[u], pos)
            used[i, s] = True
    exp_used = np.zeros((exp.size, 2), bool)
    for i, u in enumerate(exp):
        exp_used[i, 0] = True
        exp_used[i, 1] = persons[u] == 2
    pairs = resolve_pairs(prompts, truth, bg.get("eta_variant", "paper"))
    present = {(keys[u], p) for u in imp for p in positions(persons[u])}
    sides: list[tuple[str, str]] = []
    pair_idx, pair_w = [], []
    for row in pairs.iter_rows(named=True):
        a = (row["advantaged_key"], row["advantaged_position"])
        d = (row["disadvantaged_key"], row["disadvantaged_position"])
        if a[0] is None or d[0] is None or a not in present or d not in present:
            continue
        for s in (a, d):
            if s not in sides:
                sides.append(s)
        pair_idx.append((sides.index(a), sides.index(d)))
        pair_w.append(row["pair_weight"])
    side_of = np.full((imp.size, 2), -1, dtype=np.int64)
    for i, u in enumerate(imp):
        for s, pos in enumerate(positions(persons[u])):
            if (keys[u], pos) in sides:
                side_of[i, s] = sides.index((keys[u], pos))
    side_gt = np.array([truth.distribution(k, p) for k, p in sides]).reshape(len(sides), 9)
    pr = priors["biasig"]
    stereo = np.zeros(9)
    for a in ATTRIBUTES:
        stereo[VALUE_INDEX[pr["stereotype"][a]]] = 1.0
    world = World(
        units=units, imp=imp, exp=exp, gt=gt, used=used,
        dist_a=np.zeros_like(gt), acc_a=np.zeros((exp.size, 2)), exp_used=exp_used,
        k_i=truth.settings.k_implicit_vector(), k_eta=truth.settings.k_eta_vector(),
        sides=sides, side_of=side_of, side_gt=side_gt,
        pairs=np.array(pair_idx, dtype=np.int64).reshape(-1, 2),
        pair_weight=np.array(pair_w, dtype=float),
        ok_rate=float(pr["image_ok_rate"]),
        usable_rate=np.array([pr["usable_rate"][a] for a in ATTRIBUTES]),
        stereotype=stereo, eta_variant=bg.get("eta_variant", "paper"),
        models=list(bg["generators"]),
        prompts=prompts,
    )  # fmt: skip
    return world, prompts


def prior_world(config: dict[str, Any], priors: dict[str, Any], seed: int = 0) -> World:
    world, _ = _base_world(config, priors)
    pr = priors["biasig"]
    default = np.array([pr["default_person"][v] for v in VALUES], float)
    default = normalise(default)
    mix = float(pr["mix_truth"])
    gt = normalise(world.gt)
    world.dist_a = np.where(world.used[..., None], mix * gt + (1 - mix) * default, 0.0)
    rng = np.random.default_rng([seed, 4242])
    m, c = float(pr["explicit_accuracy"]["mean"]), float(pr["explicit_accuracy"]["concentration"])
    world.acc_a = np.where(
        world.exp_used, rng.beta(m * c, (1 - m) * c, size=world.acc_a.shape), 0.0
    )
    return world


def _codes(answers: pl.DataFrame) -> pl.DataFrame:
    """Answers with value codes (-1 = unknown or not a value) per attribute."""
    exprs = []
    for a in ATTRIBUTES:
        raw = pl.col(a).cast(pl.String).str.strip_chars().str.to_lowercase()
        index = {k: VALUE_INDEX[v] for k, v in ANSWER_ALIASES[a].items()}
        exprs.append(
            raw.replace_strict(index, default=-1, return_dtype=pl.Int64)
            .fill_null(-1)
            .alias(f"_{a}")
        )
    return answers.with_columns(exprs)


def pilot_world(
    config: dict[str, Any], priors: dict[str, Any], results: Path
) -> tuple[World, list[str]]:
    """The world with model A measured on a pilot run's answers.parquet: per implicit unit
    and person its answers, per explicit unit its accuracy (both smoothed towards the model's
    own by one image), the shares of images that count and of usable answers."""
    from stereolens.biasig.layout import LAYOUT

    path = LAYOUT.at(results, "answers")
    if not path.is_file():
        raise ConfigError(
            f"pilot: {path} is missing; --pilot takes the results folder of a finished run"
        )
    world, prompts = _base_world(config, priors)
    ans = pl.read_parquet(path)
    notes = []
    models = sorted(ans["model"].unique().to_list())
    configured = [m for m in config["biasig"]["generators"] if m in models]
    model = configured[0] if configured else models[0]
    if not configured:
        notes.append(f"BiasIG pilot: model {model} (the config's generators are not in the pilot)")
    if "variant" in ans.columns:
        ans = ans.filter((pl.col("variant") == model) | pl.col("variant").is_null())
    ans = ans.filter(pl.col("model") == model)
    bg = config["biasig"]
    t = scoring_table(prompts, bg.get("scoring_unit", "subject")).select("prompt_id", "unit")
    ans = _codes(ans.join(t, on="prompt_id", how="inner"))
    if ans.height == 0:
        raise ConfigError(f"pilot: {path} has no answers to the config's BiasIG prompts")
    status = pl.col("status").str.to_lowercase() if "status" in ans.columns else pl.lit("ok")
    ans = ans.with_columns((status == "ok").all().over("image_id").alias("_ok"))
    images = ans.group_by("image_id").agg(pl.col("_ok").first())
    world.ok_rate = float(images["_ok"].mean())
    usable = [float((ans[f"_{a}"] >= 0).mean()) for a in ATTRIBUTES]
    world.usable_rate = np.array(usable)
    counted = ans.filter(pl.col("_ok")) if bg.get("count", "paper") == "paper" else ans
    counted = counted.with_columns(
        pl.when(pl.col("position") == "right").then(1).otherwise(0).alias("_slot")
    )
    unit_ix = {u: i for i, u in enumerate(world.units["unit"].to_list())}
    pos_imp = {int(u): i for i, u in enumerate(world.imp)}
    pos_exp = {int(u): i for i, u in enumerate(world.exp)}
    cnt = np.zeros((world.imp.size, 2, 9))
    hits = np.zeros((world.exp.size, 2))
    tot = np.zeros((world.exp.size, 2))
    asks = asked_values(world)
    for row in counted.select("unit", "_slot", *[f"_{a}" for a in ATTRIBUTES]).iter_rows():
        u = unit_ix.get(row[0])
        if u is None:
            continue
        s = row[1]
        if u in pos_imp:
            for code in row[2:]:
                if code >= 0:
                    cnt[pos_imp[u], s, code] += 1
        elif u in pos_exp:
            i = pos_exp[u]
            ask = asks[i, s]
            if ask < 0:
                continue
            code = row[2 + int(SEGMENT[ask])]
            if code >= 0:
                tot[i, s] += 1
                hits[i, s] += code == ask
    model_dist = normalise(cnt.sum((0, 1)))
    world.dist_a = np.where(world.used[..., None], normalise(cnt + model_dist), 0.0)
    acc = (
        hits.sum() / tot.sum()
        if tot.sum()
        else float(priors["biasig"]["explicit_accuracy"]["mean"])
    )
    world.acc_a = np.where(world.exp_used, (hits + acc) / (tot + 1.0), 0.0)
    n_imp = int((cnt.sum((1, 2)) > 0).sum())
    if world.imp.size and n_imp < world.imp.size:
        notes.append(
            f"BiasIG pilot covers {n_imp} of {world.imp.size} implicit units: the others take "
            f"model {model}'s pooled distribution"
        )
    return world, notes


def asked_values(world: World) -> np.ndarray:
    """(explicit units, 2) value index asked of each person (-1 none)."""
    u = world.units
    out = np.full((world.exp.size, 2), -1, dtype=np.int64)
    single = u["protected_value"].to_list()
    left = u["protected_value_left"].to_list()
    right = u["protected_value_right"].to_list()
    persons = u["n_persons"].to_list()
    for i, j in enumerate(world.exp):
        if persons[j] == 2:
            out[i] = (VALUE_INDEX[left[j]], VALUE_INDEX[right[j]])
        else:
            out[i, 0] = VALUE_INDEX[single[j]]
    return out


def build(config: dict[str, Any], priors: dict[str, Any], pilot: Path | None, seed: int = 0):
    if not config["biasig"].get("enabled"):
        return None
    from stereolens.biasig.layout import LAYOUT

    if pilot is not None and LAYOUT.at(pilot, "answers").is_file():
        world, notes = pilot_world(config, priors, pilot)
        return BiasIGDesign(world, config, f"pilot {pilot}", notes)
    notes = []
    if pilot is not None:
        notes.append(f"BiasIG: no answers in pilot {pilot}; the prior is used")
    return BiasIGDesign(prior_world(config, priors, seed), config, "prior", notes)
