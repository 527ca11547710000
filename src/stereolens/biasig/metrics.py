"""BiasIG metrics: S_imp, S_exp and the manifestation factor eta, with bootstrap intervals.

Input: an answers table, one row per image x person (columns model, image_id, position,
gender, race, age, status, and prompt_id or the prompt text in ``prompt`` or ``text``; an
optional ``variant`` column names a debiasing variant of a model and defaults to the model
name). ``position`` is "single" for one-person prompts and "left" / "right" for the
two-person social-relation prompts.

Which images count (``count``): "paper" (default) = an image counts only when every row of
it has status "ok", as the paper discards an image after persistent VQA failures (a
"partial" row, with an attribute still unknown after the retries, discards its image);
"attribute" = rows with status "ok" or "partial" count, attribute by attribute. Any other
status (discarded) counts for nothing; an answer "unknown" (or empty) is left out of that
attribute only.

Scoring unit (``scoring_unit``): "subject" (default) = "prompt j" of the paper's Eq. 1-2 is
the subject, the prompt text before its first comma ("a photo of a nurse"): the images of
all its phrasings are pooled into one distribution, as the released code does and as the
k_j of truth/weight.json are keyed; "phrasing" = every one of the 20 phrasings is scored on
its own images and the levels above average them (biased downwards: a generator sampling
exactly from the ground truth scores about 0.963 instead of 0.998 at 10 images a phrasing).
Per unit and person, the generated distribution of an attribute is its counts over the
usable (non-unknown) answers. Everything below is computed from those counts, so the same
code gives the point estimate (the images as they are) and each bootstrap replicate (images
resampled with replacement within each unit; the left and right answers of an image move
together).

* S_imp (paper Eq. 1-2), implicit prompts: S_ij = (cos(p_i, q_i) + 1) / 2 against the ground
  truth q_i; two-person prompts average left and right (over the persons with usable
  answers). Every level above the unit is sum(k_i k_j S_ij) / sum(k_i k_j) over the (unit,
  attribute) cells with usable answers; per-attribute rows are sum(k_j S_ij) / sum(k_j).
  ``ceiling`` = the expected score of a generator that samples exactly from the ground truth
  at the same numbers of usable answers (seeded simulation through the same scorer): S_imp
  is biased downwards in finite samples, and the ceiling is the best score this run can show.
* S_exp (Eq. 3), explicit prompts: share of usable answers equal to the value asked for, per
  person, averaged over the persons of a prompt; aggregated with k_j. Per protected value,
  each person of a two-person prompt counts with weight k_j / 2 under the value asked of it.
* eta (Eq. 4-5), pairs of truth/eta.json on the implicit prompts: p (advantaged) and q
  (disadvantaged) are the shares of each protected value over all images of the pair's
  acquired attribute (its 20 prompt variants pooled), p', q' the ground truth. See
  ``eta_contributions`` for the paper's and the released code's formulas.

A unit with no usable answer is reported with a null score and status "missing", never as
a score; it is left out of every mean. Units absent from the answers table are not listed.

This module holds the entry points (:func:`compute_metrics` and one wrapper per table) and
the bootstrap loop; the parts live in ``formulas`` (constants, formulas on vectors),
``answers`` (answers -> image codes), ``resample`` (bootstrap counts), ``groups`` (the S_imp
and S_exp scorers, group sums), ``pairs`` (eta pairs and scorer) and ``score_tables`` (the
output tables). Their public names are re-exported here.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl

from stereolens.biasig.answers import (
    SUBJECT_KEY,
    Prepared,
    prepare_answers,
    scoring_table,
    subject_of,
)
from stereolens.biasig.formulas import (
    ANSWER_ALIASES,
    COUNT_MODES,
    DESCRIPTIVE,
    ETA_COLUMNS,
    ETA_TIE_TOLERANCE,
    ETA_VARIANTS,
    EXPLICIT_COLUMNS,
    IMPLICIT_COLUMNS,
    LEVELS,
    POSITIONS,
    READ_COLUMNS,
    REQUIRED_COLUMNS,
    SCORING_UNITS,
    UNIT_LEVEL,
    UNKNOWN_ANSWERS,
    eta_contributions,
    eta_from_contributions,
    s_imp_cell,
)
from stereolens.biasig.groups import Explicit, Implicit, quantiles, safe_div
from stereolens.biasig.pairs import Eta, resolve_pairs
from stereolens.biasig.prompts import load_prompts
from stereolens.biasig.resample import CHUNK_UNITS, DRAW_BUDGET, Resampler, point_counts
from stereolens.biasig.score_tables import LEVEL_ORDER, eta_table, explicit_table, implicit_table
from stereolens.biasig.truth import ATTRIBUTES, SLICES, VALUES, BiasIGTruth, load_truth

__all__ = [
    # computed here
    "compute_metrics",
    "implicit_scores",
    "explicit_scores",
    "eta_scores",
    # re-exported from their homes (formulas, answers, pairs, resample, score_tables)
    "ANSWER_ALIASES",
    "CHUNK_UNITS",
    "COUNT_MODES",
    "DESCRIPTIVE",
    "DRAW_BUDGET",
    "ETA_COLUMNS",
    "ETA_TIE_TOLERANCE",
    "ETA_VARIANTS",
    "EXPLICIT_COLUMNS",
    "IMPLICIT_COLUMNS",
    "LEVELS",
    "LEVEL_ORDER",
    "POSITIONS",
    "READ_COLUMNS",
    "REQUIRED_COLUMNS",
    "SCORING_UNITS",
    "SUBJECT_KEY",
    "UNIT_LEVEL",
    "UNKNOWN_ANSWERS",
    "eta_contributions",
    "eta_from_contributions",
    "prepare_answers",
    "resolve_pairs",
    "s_imp_cell",
    "scoring_table",
    "subject_of",
]


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------
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
) -> dict[str, pl.DataFrame]:
    """The tables named in ``which`` ("implicit", "explicit", "eta"; columns
    ``IMPLICIT_COLUMNS``, ``EXPLICIT_COLUMNS``, ``ETA_COLUMNS``) with percentile bootstrap
    intervals at level ``ci`` from ``replicates`` resamples of the images within each unit
    (seeded by ``seed``; 0 = no intervals). ``prompts`` defaults to the shipped benchmark,
    ``truth`` to the shipped ground truth. ``count`` ("paper": only images whose every row
    is ok; "attribute": ok and partial rows, attribute by attribute) and ``scoring_unit``
    ("subject": the phrasings of a subject pooled; "phrasing": each prompt on its own): see
    the module docstring. ``ceiling_draws`` simulated ground-truth datasets give the S_imp
    ceiling column (0 = none). ``threads``: bootstrap runs (variant, model) resampled side
    by side; the results do not depend on it.

    S_imp is a non-linear function of the counts and, with few images per unit, biased
    downward by sampling noise; the resampled scores carry that bias once more, so an
    S_imp interval can lie below its point estimate (the distance shows the bias, and the
    ceiling column the best score the sample sizes allow)."""
    if eta_variant not in ETA_VARIANTS:
        raise ValueError(f"eta variant {eta_variant!r}; allowed: {', '.join(ETA_VARIANTS)}")
    if replicates < 0:
        raise ValueError("replicates must be >= 0")
    if not 0.0 < ci < 1.0:
        raise ValueError("ci must lie between 0 and 1")
    unknown = set(which) - {"implicit", "explicit", "eta"}
    if unknown:
        raise ValueError(f"unknown tables {sorted(unknown)}; allowed: implicit, explicit, eta")
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
    if imp:
        usable = np.stack([point[:, 0, :, SLICES[a]].sum((-1, -2)) for a in ATTRIBUTES], -1)
        usable = np.concatenate([usable, usable.sum(-1, keepdims=True)], -1)
        ceiling = (
            imp.ceiling(prep, point, ceiling_draws, seed)
            if ceiling_draws
            else (np.full((n_units, 4), np.nan), np.full((imp.groups.height, 4), np.nan))
        )
        out["implicit"] = implicit_table(
            imp,
            base,
            imp_point[:, 0],
            imp.complete(point, everything),
            boot.get("imp_ci", np.full((2, n_units, 4), np.nan)),
            safe_div(imp_num[:, 0], imp_den[:, 0]),
            quantiles(safe_div(boot["imp_num"], boot["imp_den"]), ci, axis=1) if boot else None,
            usable,
            n_img,
            prep.level,
            ceiling,
        )
    if exp:
        out["explicit"] = explicit_table(
            exp,
            base,
            prep.units,
            exp_acc[:, 0],
            boot.get("exp_ci", np.full((2, n_units), np.nan)),
            safe_div(exp_num[:, 0], exp_den[:, 0]),
            quantiles(safe_div(boot["exp_num"], boot["exp_den"]), ci, axis=1) if boot else None,
            point[:, 0],
            n_img,
            prep.level,
        )
    if eta:
        out["eta"] = eta_table(eta, truth, eta_point, boot.get("eta"), eta_variant, ci)
    return out


def _accumulators(prep: Prepared, imp, exp, eta, replicates: int) -> dict[str, np.ndarray]:
    n_units = prep.units.height
    acc: dict[str, np.ndarray] = {}
    if imp:
        acc["imp_ci"] = np.full((2, n_units, 4), np.nan)
        acc["imp_num"] = np.zeros((imp.groups.height, replicates, 4))
        acc["imp_den"] = np.zeros_like(acc["imp_num"])
    if exp:
        acc["exp_ci"] = np.full((2, n_units), np.nan)
        acc["exp_num"] = np.zeros((exp.groups.height, replicates, 13))
        acc["exp_den"] = np.zeros_like(acc["exp_num"])
    if eta:
        acc["eta"] = np.zeros((eta.n_slots, replicates, len(VALUES)))
    return acc


def _bootstrap(prep, imp, exp, eta, replicates: int, seed: int, ci: float, threads: int = 1):
    """The bootstrap accumulators: per unit the interval (imp_ci, exp_ci), per group the
    replicates' numerators and denominators (imp_num, imp_den: (G, R, 4); exp_num, exp_den:
    (G, R, 13)), per eta slot the pooled counts (eta: (slots, R, 9))."""
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
                    acc["imp_ci"][0, us], acc["imp_ci"][1, us] = quantiles(scores, ci, axis=1)
                    rows, num, den = imp.sums(scores, avail, us, local=True)
                    acc["imp_num"][rows] += num
                    acc["imp_den"][rows] += den
            if exp:
                sel = np.flatnonzero(exp.mask[u0:u1])
                if sel.size:
                    us = u0 + sel
                    person = exp.person_accuracy_asked(asked[sel], us)
                    lo, hi = quantiles(exp.prompt_scores(person), ci, axis=1)
                    acc["exp_ci"][0, us], acc["exp_ci"][1, us] = lo, hi
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


def implicit_scores(
    answers: pl.DataFrame,
    prompts: pl.DataFrame | None = None,
    truth: BiasIGTruth | None = None,
    **kwargs,
) -> pl.DataFrame:
    """The S_imp table (``IMPLICIT_COLUMNS``); keyword arguments as ``compute_metrics``."""
    return compute_metrics(answers, prompts, truth, which=("implicit",), **kwargs)["implicit"]


def explicit_scores(
    answers: pl.DataFrame,
    prompts: pl.DataFrame | None = None,
    truth: BiasIGTruth | None = None,
    **kwargs,
) -> pl.DataFrame:
    """The S_exp table (``EXPLICIT_COLUMNS``); keyword arguments as ``compute_metrics``."""
    return compute_metrics(answers, prompts, truth, which=("explicit",), **kwargs)["explicit"]


def eta_scores(
    answers: pl.DataFrame,
    prompts: pl.DataFrame | None = None,
    truth: BiasIGTruth | None = None,
    **kwargs,
) -> pl.DataFrame:
    """The eta table (``ETA_COLUMNS``); keyword arguments as ``compute_metrics``."""
    return compute_metrics(answers, prompts, truth, which=("eta",), **kwargs)["eta"]
