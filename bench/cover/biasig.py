"""BiasIG coverage rows (issue 20, items 1-3): the model-level S_imp, S_exp and eta intervals
of the metrics tables (S_imp, S_exp: bias-corrected normal; eta: the double-bootstrap
bias-corrected normal) and the model-vs-model differences of the comparisons table
(bias-corrected difference +- z x bootstrap standard error; eta: the plug-in difference),
each over datasets drawn from the planner's prior world
(stereolens.biasig.design_worlds.prior_world) of known truth. Worlds below the config's
biasig.interval_min_images_per_subject (the demo's) print no interval: their rows expect
every interval null (status "withheld"); the "sweep" scale measures the intervals at 20
images a subject with the minimum off (with the test world's 40 and the demo's 2, the sweep
that set it).

A dataset is an answers table built like the pipeline's (one row per image and person, the
configured prompts, images_per_prompt images each, an image discarded with the prior's
failure rate) for two generators: "a" draws each person's attributes from the prior world's
distribution (mix_truth x ground truth + the rest a default person) and answers explicit
prompts with the prior's Beta accuracies; "b" is "a" moved a share ``EFFECT`` towards the
ground truth and towards the value asked (the planner's planted effects). The tables come
from stereolens.biasig.metrics.compute_metrics and the comparisons from
stereolens.biasig.comparisons.comparison_tables, as the CLI calls them. The population values
are the statistics at the world's true distributions (the planner's estimators, which
tests/test_design_power.py checks value for value against compute_metrics).

The rows of one world share their datasets (drawn once, from the first row's generator).
Run ``python bench/cover/biasig.py --scale test --before`` for the coverage of the
percentile interval (the one before issue 20) and of the basic interval on the same datasets.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT / "bench"))

from cover import Row  # noqa: E402

EFFECT = 0.3
"""Model b's share moved towards the ground truth / the value asked."""
WORLDS = {
    # the demo's selection widened (tests/design_worlds.small_biasig): 40 images a subject,
    # the smallest size at which the intervals are printed (interval_min_images_per_subject)
    "test": {
        "config": "config/demo.yaml",
        "acquired_attributes": ["Nurse", "rich", "poor", "CEO", "Employer-Employee"],
        "max_variants": 2,
        "images_per_prompt": 20,
        "replicates": 200,
    },
    "demo": {"config": "config/demo.yaml", "replicates": 200},
    # the minimum-size sweep (biasig.interval_min_images_per_subject): the test world at 10
    # images a prompt (20 images a subject, the test world before the minimum; it has 40)
    **{
        f"sweep-{2 * n}": {
            "config": "config/demo.yaml",
            "acquired_attributes": ["Nurse", "rich", "poor", "CEO", "Employer-Employee"],
            "max_variants": 2,
            "images_per_prompt": n,
            "replicates": 200,
            "interval_min_images_per_subject": 0,  # measure below the minimum too
        }
        for n in (10,)
    },
    # paper sizes (config/config.yaml: 20 phrasings x 10 images a subject), fewer
    # replicates than the paper's 1,000 to fit 200 datasets on two CPUs: every implicit
    # prompt (214 subjects, 36 eta pairs); the explicit prompts of 26 acquired attributes
    # (274 of the 2,138 subjects: S_exp is a weighted mean of shares, its interval's
    # coverage does not depend on the number of subjects, only its width does)
    "paper-implicit": {
        "config": "config/config.yaml",
        "conditions": ["implicit"],
        "replicates": 400,
    },
    "paper-explicit": {
        "config": "config/config.yaml",
        "conditions": ["explicit"],
        "acquired_attributes": None,  # filled by _paper_explicit
        "replicates": 400,
    },
}
SCALES = {
    "test": ["test"],
    "demo": ["demo"],
    "paper": ["paper-implicit", "paper-explicit"],
    "sweep": ["sweep-20"],
}
METRICS = ("S_imp", "S_exp", "eta")


@dataclass
class World:
    world: object
    prompts: pl.DataFrame
    images: int
    replicates: int
    truth: dict[str, dict[str, float]]
    models: dict[str, tuple[np.ndarray, np.ndarray]]
    ground_truth: object
    """The shipped BiasIG ground truth (loaded once)."""
    metrics: tuple[str, ...]
    """The metrics this world's prompts have (implicit units, explicit units, eta pairs)."""
    minimum: int
    """The config's biasig.interval_min_images_per_subject."""
    withheld: str
    """Why the tables print no interval at this world's size ("" when they print one):
    images per subject (phrasings x images_per_prompt) below the minimum."""


def _config(name: str) -> dict:
    from contextlib import chdir

    from stereolens.config import load_config

    spec = WORLDS[name]
    with chdir(ROOT):  # the config names its registry relative to the repository
        config, _ = load_config(spec["config"])
    bg = config["biasig"]
    for key in (
        "acquired_attributes", "max_variants", "images_per_prompt", "conditions",
        "interval_min_images_per_subject",
    ):  # fmt: skip
        if key in spec:
            bg[key] = spec[key]
    if name == "paper-explicit":
        bg["acquired_attributes"] = _paper_explicit()
    bg["generators"] = ["a", "b"]
    return config


def _paper_explicit() -> list[str]:
    """20 occupations, 4 characteristics and 2 social relations (alphabetically first)."""
    from stereolens.biasig.prompts import load_prompts

    names = load_prompts().group_by("acquired_type").agg(pl.col("acquired_attribute").unique())
    take = {"occupation": 20, "characteristic": 4, "social_relation": 2}
    return [a for t, attrs in names.iter_rows() for a in sorted(attrs)[: take[t]]]


def build(name: str, seed: int = 0) -> World:
    """The prior world ``name`` (of ``WORLDS``) with models a and b and their population
    values."""
    from stereolens.biasig import design as B
    from stereolens.biasig import design_worlds as BW
    from stereolens.biasig.truth import load_truth
    from stereolens.design.priors import load_priors

    config = _config(name)
    w = BW.prior_world(config, load_priors(), seed)
    design = B.BiasIGDesign(w, config, "prior", [])
    gt = design._gt_norm()
    dist_b = np.where(w.used[..., None], (1 - EFFECT) * w.dist_a + EFFECT * gt, 0.0)
    acc_b = np.where(w.exp_used, (1 - EFFECT) * w.acc_a + EFFECT, 0.0)
    models = {"a": (w.dist_a, w.acc_a), "b": (dist_b, acc_b)}
    big = 1e9
    truth = {}
    for model, (dist, acc) in models.items():
        side = B.side_counts(w, dist * design.n_phr_imp[:, None, None] * big)
        truth[model] = {
            "S_imp": float(B.s_imp_model(dist * big, w.gt, w.used, w.k_i, design.k_imp)),
            "S_exp": float(
                B.s_exp_model(acc * big, np.full(acc.shape, big), w.exp_used, design.k_exp)
            ),
            "eta": float(B.eta_model(side, w)) if len(w.pairs) else np.nan,
        }
    minimum = int(config["biasig"]["interval_min_images_per_subject"])
    per_subject = int(np.median(w.units["n_phrasings"].to_numpy())) * int(
        config["biasig"]["images_per_prompt"]
    )
    return World(
        w, w.prompts, int(config["biasig"]["images_per_prompt"]),
        WORLDS[name]["replicates"], truth, models, load_truth(),
        tuple(m for m, n in zip(METRICS, (w.imp.size, w.exp.size, len(w.pairs)), strict=True)
              if n),
        minimum,
        f"{per_subject} images per subject < {minimum}" if per_subject < minimum else "",
    )  # fmt: skip


def answers(world: World, rng: np.random.Generator) -> pl.DataFrame:
    """One dataset: the answers table of models a and b (one row per image and person)."""
    from stereolens.biasig.design import SEGMENT
    from stereolens.biasig.design_worlds import asked_values
    from stereolens.biasig.truth import SLICES, VALUES

    w = world.world
    units = w.units
    asks = asked_values(w)
    pos_imp = {int(u): i for i, u in enumerate(w.imp)}
    pos_exp = {int(u): i for i, u in enumerate(w.exp)}
    pid, img, slot, kind, index = [], [], [], [], []
    for u, (ids, persons) in enumerate(zip(units["prompt_id"], units["n_persons"], strict=True)):
        ids = list(ids)
        n_img = len(ids) * world.images
        image = np.arange(n_img)
        for s in range(int(persons)):
            pid.append(np.repeat(ids, world.images))
            img.append(image + u * 10**6)
            slot.append(np.full(n_img, s if persons == 2 else -1))
            kind.append(np.full(n_img, u in pos_exp))
            index.append(np.full(n_img, pos_exp.get(u, pos_imp.get(u, -1))))
    pid, img, slot = np.concatenate(pid), np.concatenate(img), np.concatenate(slot)
    img = np.unique(img, return_inverse=True)[1].ravel()
    kind, index = np.concatenate(kind), np.concatenate(index)
    s = np.maximum(slot, 0)
    position = np.array(["single", "left", "right"])[slot + 1]
    values = np.array(VALUES)
    frames = []
    for name, (dist, acc) in world.models.items():
        n = pid.size
        codes = np.empty((n, 3), dtype=np.int64)
        p = np.zeros((n, 9))
        imp = ~kind
        p[imp] = dist[index[imp], s[imp]]
        ask = (
            np.where(kind, asks[np.where(kind, index, 0), s], -1)
            if asks.size
            else np.full(n, -1, dtype=np.int64)
        )
        for a, (_attr, sl) in enumerate(SLICES.items()):
            width = sl.stop - sl.start
            pa = p[:, sl].copy()
            pa[kind] = 1.0 / width  # an attribute not asked of an explicit prompt: uniform
            asked_here = kind & (ask >= 0) & (SEGMENT[np.maximum(ask, 0)] == a)
            if asked_here.any():
                hit = acc[index[asked_here], s[asked_here]]
                local = ask[asked_here] - sl.start
                row = np.repeat(((1 - hit) / (width - 1))[:, None], width, axis=1)
                row[np.arange(local.size), local] = hit
                pa[asked_here] = row
            pa /= pa.sum(1, keepdims=True)
            u = rng.random(n)
            codes[:, a] = sl.start + np.minimum((u[:, None] > pa.cumsum(1)).sum(1), width - 1)
        ok = rng.random(int(img.max()) + 1) < w.ok_rate
        frames.append(
            pl.DataFrame(
                {
                    "model": name,
                    "variant": name,
                    "prompt_id": pid,
                    "image_id": pl.Series(img).cast(pl.String),
                    "position": position,
                    "gender": values[codes[:, 0]],
                    "race": values[codes[:, 1]],
                    "age": values[codes[:, 2]],
                    "status": np.where(ok[img], "ok", "discarded"),
                }
            )
        )
    return pl.concat(frames).with_columns(
        pl.concat_str("model", pl.lit("-"), "image_id").alias("image_id")
    )


def measure(world: World, dataset: pl.DataFrame, seed: int) -> dict[str, tuple]:
    """(estimate, ci_low, ci_high, percentile low, percentile high) per row name of one
    dataset, through compute_metrics and comparison_tables."""
    from stereolens.biasig.comparisons import comparison_tables, model_estimates
    from stereolens.biasig.groups import quantiles
    from stereolens.biasig.metrics import compute_metrics

    table_of = {"S_imp": "implicit", "S_exp": "explicit", "eta": "eta"}
    tables = compute_metrics(
        dataset, world.prompts, world.ground_truth, replicates=world.replicates, seed=seed,
        ceiling_draws=0, which=(*(table_of[m] for m in world.metrics), "replicates"),
        interval_min_images_per_subject=world.minimum,
    )  # fmt: skip
    est = model_estimates(tables).filter(pl.col("protected_attribute") == "*")
    model = (pl.col("level") == "model") & (pl.col("protected_attribute") == "*")
    lows = {
        "S_imp": lambda t: t.filter(model),
        "S_exp": lambda t: t.filter(model & (pl.col("protected_value") == "*")),
        "eta": lambda t: t.filter(pl.col("pair") == "*"),
    }
    reps = tables["replicates"].filter(pl.col("protected_attribute") == "*")
    cmp, _ = comparison_tables(tables, attributes=("*",))
    out = {}
    for metric in world.metrics:
        row = lows[metric](tables[table_of[metric]]).filter(pl.col("variant") == "a")
        row = row.row(0, named=True)
        value = row["score"] if metric != "eta" else row["eta_total"]
        r = reps.filter((pl.col("metric") == metric) & (pl.col("variant") == "a"))
        q_lo, q_hi = quantiles(r["value"].to_numpy(), 0.95)
        lo, hi = (np.nan if row[c] is None else row[c] for c in ("ci_low", "ci_high"))
        out[metric] = (value, lo, hi, float(q_lo), float(q_hi))
        d = cmp.filter((pl.col("metric") == metric) & (pl.col("scope") == "overall"))
        e = est.filter(pl.col("metric") == metric)
        plug = dict(zip(e["variant"], e["estimate"], strict=True))
        if not d.height:  # no comparison in this dataset (a model without a value)
            out[f"{metric} b - a"] = (np.nan,) * 5
        else:
            d = d.row(0, named=True)
            lo, hi = (np.nan if d[c] is None else d[c] for c in ("ci_low", "ci_high"))
            out[f"{metric} b - a"] = (
                d["difference"], lo, hi,
                plug["b"] - plug["a"] - (hi - lo) / 2, plug["b"] - plug["a"] + (hi - lo) / 2,
            )  # fmt: skip
    return out


_CACHE: dict[tuple[str, int], dict[str, np.ndarray]] = {}
LOG: Path | None = None
"""Where simulate appends each dataset's measures (JSON lines), when set (``--log``): a long
paper-scale run can be read while it runs, or after it stops (``--from-log``)."""


@functools.cache
def world(name: str) -> World:
    return build(name)


def simulate(name: str, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Per row name, the (n, 5) array of :func:`measure` over ``n`` datasets of world
    ``name`` (cached: the rows of a world share their datasets)."""
    key = (name, n)
    if key not in _CACHE:
        w = world(name)
        results: dict[str, list] = {}
        for i in range(n):
            if i % 20 == 0:
                print(f"{name}: dataset {i} of {n}", file=sys.stderr, flush=True)
            got = measure(w, answers(w, rng), seed=int(rng.integers(2**31)))
            if LOG is not None:
                import json

                with LOG.open("a") as fh:
                    fh.write(json.dumps({"world": name, **got}) + "\n")
            for row, v in got.items():
                results.setdefault(row, []).append(v)
        _CACHE[key] = {k: np.array(v, dtype=float) for k, v in results.items()}
    return _CACHE[key]


def _truth(w: World, name: str) -> float:
    if name.endswith(" b - a"):
        m = name.split()[0]
        return w.truth["b"][m] - w.truth["a"][m]
    return w.truth["a"][name]


BEFORE = ("percentile", "basic")
"""The other intervals measured on the same datasets (``rows(..., before=...)``)."""


def rows(scale: str, before: str = "", worlds: list[str] | None = None) -> list[Row]:
    """S_imp, S_exp and eta of model a (model level) and their b - a differences, in the
    worlds of ``scale``, with the interval the tables print. ``before`` = "percentile": the
    interval before issue 20 (the plug-in's percentile interval; for a difference, the
    plug-in difference with the same half-width); "basic": 2 x plug-in - the replicates'
    quantiles (differences as "percentile")."""
    out = []
    for name in worlds or SCALES[scale]:
        w = world(name)
        for row in [*w.metrics, *(f"{m} b - a" for m in w.metrics)]:
            diff = row.endswith(" b - a")

            def draw(rng, n, name=name, row=row, diff=diff):
                r = simulate(name, rng, n)[row]
                est = r[:, 0]
                if not before:
                    return est, r[:, 1], r[:, 2]
                if before == "basic" and not diff:
                    return est, 2 * est - r[:, 4], 2 * est - r[:, 3]
                return est, r[:, 3], r[:, 4]

            if diff:
                # the comparisons take eta's plug-ins (biasig.comparisons.ESTIMATE)
                interval = (
                    "plug-in difference +- z se"
                    if before or row.startswith("eta")
                    else "bias-corrected difference +- z bootstrap se (unpaired)"
                )
            elif row == "eta" and not before:
                interval = (
                    "double-bootstrap bias-corrected normal (eta_total_bc +- z sd of the "
                    "once-corrected replicates)"
                )
            else:
                interval = {
                    "": "bias-corrected normal (score_bc +- z bootstrap sd)",
                    "percentile": "percentile bootstrap",
                    "basic": "basic bootstrap",
                }[before]
            if diff and before == "basic":
                continue
            label = f"biasig {name} {row}" + ("" if diff else " (model level)")
            extra = {}
            if w.withheld and not before and "withheld" in Row.__dataclass_fields__:
                extra["withheld"] = w.withheld  # the harness of the minimum-size contract
            out.append(
                Row(
                    label + (f" [{before}]" if before else ""),
                    "biasig",
                    interval,
                    _truth(w, row),
                    draw,
                    note=NOTES.get(row.split()[0], "") if not before else "",
                    **extra,
                )
            )
    return out


NOTES = {
    "eta": "eta's statistic is not smooth (a sign flips where a share crosses its ground "
    "truth): at 40 images a subject the spread of its bias-corrected replicates overstates "
    "its sampling spread (conservative)",
}


if __name__ == "__main__":
    import argparse

    import cover

    ap = argparse.ArgumentParser(description="BiasIG coverage rows")
    ap.add_argument("--scale", choices=list(SCALES), default="test")
    ap.add_argument("--world", nargs="*", help=f"worlds of the scale (of {list(WORLDS)})")
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--before", action="store_true", help="also the percentile and basic rows")
    ap.add_argument("--log", type=Path, help="append each dataset's measures to this file")
    ap.add_argument(
        "--from-log", type=Path, help="the rows from a --log file's datasets (no simulation)"
    )
    args = ap.parse_args()
    LOG = args.log
    if args.from_log:
        import json

        logged: dict[str, dict[str, list]] = {}
        for line in args.from_log.read_text().splitlines():
            entry = json.loads(line)
            for row, v in entry.items():
                if row != "world":
                    logged.setdefault(entry["world"], {}).setdefault(row, []).append(v)
        for name, got in logged.items():
            n = len(next(iter(got.values())))
            _CACHE[(name, n)] = {k: np.array(v, dtype=float) for k, v in got.items()}
        args.datasets = n
    chosen = rows(args.scale, worlds=args.world)
    if args.before:
        for kind in BEFORE:
            chosen += rows(args.scale, before=kind, worlds=args.world)
    results = []
    for r in chosen:
        results.append(cover.run_row(r, args.datasets))
        print(r.name, f"{results[-1].coverage:.1%}", flush=True)
    print(cover.table(results))
