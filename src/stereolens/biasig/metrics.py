"""BiasIG metrics: S_imp, S_exp and eta with bootstrap intervals (:func:`compute_metrics`;
the definitions: docs/methods.md, "BiasIG")."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl

from stereolens.biasig.answers import Prepared, prepare_answers
from stereolens.biasig.formulas import (
    DESCRIPTIVE,
    ETA_VARIANTS,
    INTERVAL_CI_COLUMNS,
    INTERVAL_MIN_WHY,
)
from stereolens.biasig.groups import (
    Explicit,
    Implicit,
    bias_corrected,
    replicate_moments,
    safe_div,
)
from stereolens.biasig.pairs import INNER_REPLICATES, Eta, resolve_pairs
from stereolens.biasig.prompts import load_prompts
from stereolens.biasig.resample import Resampler, point_counts
from stereolens.biasig.score_tables import eta_table, explicit_table, implicit_table
from stereolens.biasig.truth import ATTRIBUTES, SLICES, VALUES, BiasIGTruth, load_truth
from stereolens.metrics.withheld import withheld_note


def compute_metrics(
    answers: pl.DataFrame,
    prompts: pl.DataFrame | None = None,
    truth: BiasIGTruth | None = None,
    *,
    eta_variant: str = "paper",
    replicates: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
    which: tuple[str, ...] = ("implicit", "explicit", "eta"),
    count: str = "paper",
    scoring_unit: str = "subject",
    ceiling_draws: int = 200,
    threads: int = 1,
    interval_min_images_per_subject: int = 0,
) -> dict[str, pl.DataFrame]:
    """The tables named in ``which`` ("implicit", "explicit", "eta": columns
    ``IMPLICIT_COLUMNS``, ``EXPLICIT_COLUMNS``, ``ETA_COLUMNS``; "replicates":
    :func:`replicate_table`), each with the plug-in score, its bootstrap bias-corrected
    estimate and interval at level ``ci`` from ``replicates`` resamples of the images within
    each unit (seeded by ``seed``; 0 = none; docs/statistics.md). ``prompts`` and ``truth``
    default to the shipped benchmark; ``count``, ``scoring_unit``: docs/methods.md.
    ``ceiling_draws``: S_imp's ceiling column (0 = none). ``threads``: runs resampled side by
    side (no effect on results). ``interval_min_images_per_subject``: :func:`interval_notes`.
    """
    if eta_variant not in ETA_VARIANTS:
        raise ValueError(f"eta variant {eta_variant!r}; allowed: {', '.join(ETA_VARIANTS)}")
    if replicates < 0:
        raise ValueError("replicates must be >= 0")
    if not 0.0 < ci < 1.0:
        raise ValueError("ci must lie between 0 and 1")
    unknown = set(which) - {"implicit", "explicit", "eta", "replicates"}
    if unknown:
        raise ValueError(
            f"unknown tables {sorted(unknown)}; allowed: implicit, explicit, eta, replicates"
        )
    if truth is None:
        truth = load_truth()
        prompts = prompts if prompts is not None else load_prompts()
    elif prompts is None:
        prompts = load_prompts(truth=truth)
    if ceiling_draws < 0:
        raise ValueError("ceiling_draws must be >= 0")
    prep = prepare_answers(answers, prompts, count=count, scoring_unit=scoring_unit)
    point = point_counts(prep)
    n_units = prep.units.height
    everything = np.arange(n_units)
    imp = Implicit(prep, truth) if "implicit" in which else None
    exp = Explicit(prep) if "explicit" in which else None
    eta = Eta(prep, truth, resolve_pairs(prompts, truth, eta_variant)) if "eta" in which else None

    if imp:
        imp_point, imp_avail = imp.prompt_scores(point, everything)
        imp_num, imp_den = imp.sums(imp_point, imp_avail, everything)
    if exp:
        exp_acc = exp.person_accuracy(point, everything)
        exp_num, exp_den = exp.sums(exp_acc, everything)
    if eta:
        eta_point = eta.sums(point, everything)
    boot = _bootstrap(prep, imp, exp, eta, replicates, seed, ci, threads) if replicates else {}

    base = prep.units.select("variant", "model", *DESCRIPTIVE)
    n_img = prep.units["n_images"].to_numpy().astype(float)
    out: dict[str, pl.DataFrame] = {}
    reps: dict[str, np.ndarray] = {}
    if imp:
        usable = np.stack([point[:, 0, :, SLICES[a]].sum((-1, -2)) for a in ATTRIBUTES], -1)
        usable = np.concatenate([usable, usable.sum(-1, keepdims=True)], -1)
        ceiling = (
            imp.ceiling(prep, point, ceiling_draws, seed)
            if ceiling_draws
            else (np.full((n_units, 4), np.nan), np.full((imp.groups.height, 4), np.nan))
        )
        group_score = safe_div(imp_num[:, 0], imp_den[:, 0])
        unit_ci, group_ci, bc = _intervals(
            imp_point[:, 0], group_score, boot, "imp", ci, (n_units, 4)
        )
        reps["S_imp"] = safe_div(boot["imp_num"], boot["imp_den"]) if boot else None
        out["implicit"] = implicit_table(
            imp,
            base,
            imp_point[:, 0],
            imp.complete(point, everything),
            unit_ci,
            group_score,
            group_ci,
            usable,
            n_img,
            prep.level,
            ceiling,
            bc,
        )
    if exp:
        group_score = safe_div(exp_num[:, 0], exp_den[:, 0])
        unit_score = exp.prompt_scores(exp_acc)[:, 0]
        unit_ci, group_ci, bc = _intervals(unit_score, group_score, boot, "exp", ci, (n_units,))
        reps["S_exp"] = safe_div(boot["exp_num"], boot["exp_den"]) if boot else None
        out["explicit"] = explicit_table(
            exp,
            base,
            prep.units,
            exp_acc[:, 0],
            unit_ci,
            group_score,
            group_ci,
            point[:, 0],
            n_img,
            prep.level,
            bc,
        )
    if eta:
        boot_eta = eta.etas(boot["eta"], truth, eta_variant)[:2] if boot else None
        inner = eta.inner(boot["eta"], truth, eta_variant, seed) if boot else None
        reps["eta"] = boot_eta[1] if boot else None
        out["eta"] = eta_table(
            eta, truth, eta_point, boot_eta, eta_variant, ci, inner, INNER_REPLICATES
        )
    if "replicates" in which:
        out["replicates"] = replicate_table(imp, exp, eta, reps)
    notes = interval_notes(prep, interval_min_images_per_subject) if replicates else {}
    for name in ("implicit", "explicit", "eta"):
        if name in out:
            out[name] = withhold(out[name], notes)
    return out


def interval_notes(prep: Prepared, minimum: int) -> dict[tuple[str, str], str]:
    """(variant, model) -> the ``interval_note`` of each run below ``minimum`` images/subject."""
    if minimum <= 0:
        return {}
    per_subject = (
        prep.units.group_by("variant", "model", "subject")
        .agg(pl.col("n_images").sum())
        .group_by("variant", "model")
        .agg(pl.col("n_images").median())
    )
    notes = {
        (v, m): withheld_note(n, minimum, "images per subject", INTERVAL_MIN_WHY)
        for v, m, n in per_subject.iter_rows()
    }
    return {key: note for key, note in notes.items() if note is not None}


def withhold(table: pl.DataFrame, notes: dict[tuple[str, str], str]) -> pl.DataFrame:
    """``table`` with its ci columns null and ``interval_note`` set on the rows of the runs
    in ``notes`` (:func:`interval_notes`); ``interval_note`` null elsewhere."""
    note = pl.lit(None, dtype=pl.String)
    for (variant, model), text in notes.items():
        hit = (pl.col("variant") == variant) & (pl.col("model") == model)
        note = pl.when(hit).then(pl.lit(text)).otherwise(note)
    table = table.with_columns(note.alias("interval_note"))
    cis = [c for c in INTERVAL_CI_COLUMNS if c in table.columns]
    return table.with_columns(
        pl.when(pl.col("interval_note").is_null()).then(pl.col(c)).otherwise(None).alias(c)
        for c in cis
    )


def _intervals(unit_score, group_score, boot, key: str, ci: float, unit_shape):
    """Bias-corrected scores and their normal intervals (:func:`bias_corrected`) of the
    units and the groups, NaN without a bootstrap: (unit (2, units, ...), group
    ((groups, ...) x 2) or None, bias-corrected (units, groups))."""
    if not boot:
        nan = np.full(unit_shape, np.nan)
        return np.stack([nan, nan]), None, (nan, np.full(group_score.shape, np.nan))
    unit_bc, *unit_ci = bias_corrected(unit_score, *boot[f"{key}_moments"], ci)
    group_reps = safe_div(boot[f"{key}_num"], boot[f"{key}_den"])
    group_bc, *group_ci = bias_corrected(group_score, *replicate_moments(group_reps, 1), ci)
    return np.stack(unit_ci), tuple(group_ci), (unit_bc, group_bc)


REPLICATE_COLUMNS = ("variant", "model", "metric", "protected_attribute", "replicate", "value")
"""The long table of the model-level bootstrap replicates (``which`` "replicates")."""
_REPLICATE_SCOPES = {
    "S_imp": (("gender", 0), ("race", 1), ("age", 2), ("*", 3)),
    "S_exp": (("gender", 9), ("race", 10), ("age", 11), ("*", 12)),
    "eta": (("*", 0), ("gender", 1), ("race", 2), ("age", 3)),
}


def replicate_table(imp, exp, eta, reps: dict[str, np.ndarray | None]) -> pl.DataFrame:
    """The bootstrap replicates of the model-level S_imp, S_exp and eta, per protected
    attribute and overall ("*"): one row per (variant, model, metric, attribute, replicate),
    columns ``REPLICATE_COLUMNS``; replicate r of one (variant, model) is one resample of
    its images for every metric."""
    parts = []
    for metric, scorer in (("S_imp", imp), ("S_exp", exp), ("eta", eta)):
        values = reps.get(metric)
        if scorer is None or values is None:
            continue
        if metric == "eta":
            runs = scorer.runs  # values: (runs, R, 4)
            rows = np.arange(len(runs))
        else:
            groups = scorer.groups
            rows = np.flatnonzero((groups["level"] == "model").to_numpy())
            runs = list(zip(groups["variant"].to_list(), groups["model"].to_list(), strict=True))
            runs = [runs[g] for g in rows]
        n_rep = values.shape[1]
        for (variant, model), g in zip(runs, rows, strict=True):
            for attr, col in _REPLICATE_SCOPES[metric]:
                parts.append(
                    pl.DataFrame(
                        {
                            "variant": [variant] * n_rep,
                            "model": [model] * n_rep,
                            "metric": [metric] * n_rep,
                            "protected_attribute": [attr] * n_rep,
                            "replicate": np.arange(n_rep, dtype=np.int64),
                            "value": values[g, :, col].astype(float),
                        }
                    )
                )
    schema = dict.fromkeys(REPLICATE_COLUMNS[:4], pl.String)
    schema |= {"replicate": pl.Int64, "value": pl.Float64}
    if not parts:
        return pl.DataFrame(schema=schema)
    return pl.concat(parts).cast(schema).select(REPLICATE_COLUMNS)


def _accumulators(prep: Prepared, imp, exp, eta, replicates: int) -> dict[str, np.ndarray]:
    n_units = prep.units.height
    acc: dict[str, np.ndarray] = {}
    if imp:
        acc["imp_moments"] = np.full((2, n_units, 4), np.nan)
        acc["imp_num"] = np.zeros((imp.groups.height, replicates, 4))
        acc["imp_den"] = np.zeros_like(acc["imp_num"])
    if exp:
        acc["exp_moments"] = np.full((2, n_units), np.nan)
        acc["exp_num"] = np.zeros((exp.groups.height, replicates, 13))
        acc["exp_den"] = np.zeros_like(acc["exp_num"])
    if eta:
        acc["eta"] = np.zeros((eta.n_slots, replicates, len(VALUES)))
    return acc


def _bootstrap(prep, imp, exp, eta, replicates: int, seed: int, ci: float, threads: int = 1):
    """The bootstrap accumulators: per unit the replicates' mean and sd (imp_moments,
    exp_moments: (2, units, ...)), per group the replicates' numerators and denominators
    (imp_num, imp_den: (G, R, 4); exp_num, exp_den: (G, R, 13)), per eta slot the pooled
    counts (eta: (slots, R, 9))."""
    acc = _accumulators(prep, imp, exp, eta, replicates)
    if exp:  # summed with the replicates last, handed back as (G, R, 13) views
        acc["exp_num"] = np.zeros((exp.groups.height, 13, replicates))
        acc["exp_den"] = np.zeros_like(acc["exp_num"])
    resampler = Resampler(prep, replicates, exp)

    def run(index: int) -> None:
        # a run's units, groups and eta slots are its own: runs write disjoint rows
        for u0, u1, counts, asked in resampler.chunks(seed, run=index):
            if imp:
                sel = np.flatnonzero(imp.mask[u0:u1])
                if sel.size:
                    us = u0 + sel
                    scores, avail = imp.prompt_scores(counts[sel], us)
                    acc["imp_moments"][:, us] = replicate_moments(scores, axis=1)
                    rows, num, den = imp.sums(scores, avail, us, local=True)
                    acc["imp_num"][rows] += num
                    acc["imp_den"][rows] += den
            if exp:
                sel = np.flatnonzero(exp.mask[u0:u1])
                if sel.size:
                    us = u0 + sel
                    person = exp.person_accuracy_asked(asked[sel], us)
                    acc["exp_moments"][:, us] = replicate_moments(exp.prompt_scores(person), 1)
                    rows, num, den = exp.group_sums(person, us)
                    acc["exp_num"][rows] += num
                    acc["exp_den"][rows] += den
            if eta:
                sel = np.flatnonzero(eta.mask[u0:u1])
                if sel.size:
                    rows, pooled = eta.sums(counts[sel], u0 + sel, local=True)
                    acc["eta"][rows] += pooled

    # numpy releases the GIL in the heavy steps: runs (variant, model) side by side
    workers = max(1, min(int(threads or 1), len(prep.runs)))
    if workers == 1:
        for index in range(len(prep.runs)):
            run(index)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(run, range(len(prep.runs))))
    if exp:
        acc["exp_num"] = np.moveaxis(acc["exp_num"], 2, 1)
        acc["exp_den"] = np.moveaxis(acc["exp_den"], 2, 1)
    return acc
