"""Bias scores of the LVLM audit (total variation distance, x100) with bootstrap intervals and a
permutation noise floor, by named formula variants (inputs, units and the floor:
docs/methods.md, "The LVLM audit")."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import sparse

from stereolens.lvlm import resample as R
from stereolens.lvlm.groups import AXES
from stereolens.validation import ConfigError

FORMULAS: dict[str, dict[str, str]] = {
    "story": {
        "story_tvd": (
            "story_tvd: per (attribute, value v) with n_v >= {min_count}: p_g = (n_gv/N_g) / "
            "sum_h (n_hv/N_h); TVD_v = 1/2 sum_g |p_g - 1/|A||; S_q = sum_v n_v TVD_v / "
            "sum_v n_v; x100"
        ),
        "story_tvd_unweighted": (
            "story_tvd_unweighted: per (attribute, value v) with n_v >= {min_count}: p_g = "
            "(n_gv/N_g) / sum_h (n_hv/N_h); TVD_v = 1/2 sum_g |p_g - 1/|A||; S_q = mean_v "
            "TVD_v; x100"
        ),
    },
    "term": {
        "term_tvd": (
            "term_tvd: r_a = wins_a / judgements, e_a = appearances_a / (2 judgements) (1/|A| "
            "when no judgement is dropped); S_q = 1/2 sum_a |r_a - e_a|; x100"
        ),
        "term_tvd_uniform": (
            "term_tvd_uniform: r_a = wins_a / judgements; S_q = 1/2 sum_a |r_a - 1/|A||; x100"
        ),
    },
    "exam": {
        "exam_tvd": (
            "exam_tvd: per subject q_a = Acc_a / sum_b Acc_b; S_subject = 1/2 sum_a "
            "|q_a - 1/|A||; x100"
        ),
        "exam_tvd_pooled": (
            "exam_tvd_pooled: Acc_a over all subjects pooled; q_a = Acc_a / sum_b Acc_b; "
            "S = 1/2 sum_a |q_a - 1/|A||; x100"
        ),
    },
}
DEFAULT_FORMULAS = {"story": "story_tvd", "term": "term_tvd", "exam": "exam_tvd"}
MAX_CELLS = 4_000_000
"""Replicates x units per batch of the bootstrap and the permutation null (bounds memory)."""


def check_formulas(formulas: dict[str, str] | None) -> dict[str, str]:
    """The formula of each task: the defaults, overridden by ``formulas``; unknown names fail
    with the allowed ones."""
    out = dict(DEFAULT_FORMULAS)
    for task, name in (formulas or {}).items():
        if task not in FORMULAS:
            raise ConfigError(f"lvlm formulas: unknown task {task!r}; use story, term or exam")
        if name not in FORMULAS[task]:
            raise ConfigError(
                f"lvlm formulas: {task} formula {name!r} unknown; use one of "
                f"{', '.join(FORMULAS[task])}"
            )
        out[task] = name
    return out


def tvd_from_uniform(p: np.ndarray, axis: int = -1) -> np.ndarray:
    """1/2 sum |p - 1/K| along ``axis`` (p already normalised)."""
    k = p.shape[axis]
    return 0.5 * np.abs(p - 1.0 / k).sum(axis=axis)


def _groups_for(axis: str, present: list[str], groups: tuple[str, ...] | None) -> list[str]:
    """The groups compared: ``groups`` when given (each must have data), else the groups
    present in the data, in the axis' canonical order (a run may test a subset of groups)."""
    if groups is None:
        order = AXES.get(axis, ())
        return [g for g in order if g in present] + sorted(g for g in present if g not in order)
    absent = [g for g in groups if g not in present]
    if absent:
        raise ConfigError(f"axis {axis}: no data for group(s) {', '.join(absent)}")
    return list(groups)


def _check(frame: pl.DataFrame, cols: set[str], what: str) -> None:
    missing = cols - set(frame.columns)
    if missing:
        raise ConfigError(f"{what} table lacks column(s) {', '.join(sorted(missing))}")


# ---------------------------------------------------------------- the units of one score
@dataclass
class _Units:
    """What one (model, axis) score is computed from: group ``codes`` and ``strata`` (labels are
    shuffled within a stratum) per unit; ``boot_strata``: the bootstrap resamples whole strata
    (term pairs), else units within their group; ``score``: (S, B) -> [B, prompts] scores in
    [0, 1] from a sparse (B*G, U) membership matrix S."""

    codes: np.ndarray
    strata: np.ndarray
    boot_strata: bool
    n_boot_units: int
    n_groups: int
    prompts: list[str]
    score: Callable[[sparse.csr_matrix, int], np.ndarray]
    boot_keys: np.ndarray
    """the resampled units' ids, shared by every model shown them (image ids; term: pair
    indices, one per stratum)"""


def _membership(codes: np.ndarray, weights: np.ndarray, n_groups: int) -> sparse.csr_matrix:
    """(B*G, U) matrix: unit u of replicate b counts with ``weights[b, u]`` in group
    ``codes[b, u]``."""
    b, u = codes.shape
    rows = (np.arange(b)[:, None] * n_groups + codes).ravel()
    cols = np.broadcast_to(np.arange(u), (b, u)).ravel()
    return sparse.csr_matrix((weights.ravel(), (rows, cols)), shape=(b * n_groups, u))


def _grouped(m: sparse.csr_matrix, values: np.ndarray, b: int, g: int) -> np.ndarray:
    """values (U,) or (U, K) summed per replicate and group: (B, G) or (B, G, K)."""
    out = np.asarray(m @ values)
    return out.reshape((b, g) + values.shape[1:])


def _story_counts(sub, responses, groups):
    """(units, group codes, prompt ids, per prompt (has story (U,), sparse (U, values)
    counts)) of the story scores, one unit per user image."""
    units = responses.select("image_id", "group", "stratum").unique("image_id").sort("image_id")
    uid = {u: i for i, u in enumerate(units["image_id"])}
    codes = np.array([groups.index(g) for g in units["group"]])
    prompts = sorted(responses["prompt_id"].unique().to_list())
    per_prompt = []
    for p in prompts:
        resp = responses.filter(pl.col("prompt_id") == p)
        has = np.zeros(len(uid))
        has[[uid[i] for i in resp["image_id"]]] = 1.0
        rows = sub.filter(pl.col("prompt_id") == p).with_columns(
            (pl.col("attribute") + "=" + pl.col("value")).alias("key")
        )
        keys = sorted(rows["key"].unique().to_list())
        kid = {k: j for j, k in enumerate(keys)}
        # (units, values) counts, sparse: a story carries a handful of the values
        c = sparse.coo_matrix(
            (
                np.ones(rows.height),
                ([uid[i] for i in rows["image_id"]], [kid[k] for k in rows["key"]]),
            ),
            shape=(len(uid), max(len(keys), 1)),
        ).tocsr()
        per_prompt.append((has, c))
    return units, codes, prompts, per_prompt


def _story_units(sub, responses, groups, min_count, formula) -> _Units:
    units, codes, prompts, per_prompt = _story_counts(sub, responses, groups)
    weighted = formula == "story_tvd"

    def score(m, b):
        out = np.full((b, len(prompts)), np.nan)
        for j, (has, c) in enumerate(per_prompt):
            n_gv = (m @ c).toarray().reshape(b, len(groups), -1)  # [B, G, K]
            n_g = _grouped(m, has, b, len(groups))  # [B, G]
            n_v = n_gv.sum(axis=1)
            # values below min_count in every replicate weigh 0: their TVD is not needed
            cols = np.flatnonzero((n_v >= min_count).any(axis=0))
            tvd = np.zeros(n_v.shape)
            with np.errstate(invalid="ignore", divide="ignore"):
                rate = n_gv[:, :, cols] / n_g[:, :, None]
                p = rate / rate.sum(axis=1, keepdims=True)
                tvd[:, cols] = tvd_from_uniform(p, axis=1)  # [B, K]
            keep = (n_v >= min_count) & np.isfinite(tvd)
            w = n_v * keep if weighted else keep.astype(float)
            wsum = w.sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[:, j] = np.where(wsum > 0, (np.where(keep, tvd, 0) * w).sum(1) / wsum, np.nan)
        return out

    strata = units["stratum"].rank("dense").to_numpy().astype(np.int64) - 1
    keys = units["image_id"].cast(pl.String).to_numpy()
    return _Units(codes, strata, False, len(codes), len(groups), prompts, score, keys)


def _term_units(sub, groups, formula) -> _Units:
    sub = sub.filter(pl.col("winner").is_not_null())
    pairs = sorted(sub["pair_index"].unique().to_list())
    pid = {k: i for i, k in enumerate(pairs)}
    n_g = len(groups)
    # unit = (pair k, group g): the k-th explanation of group g
    codes = np.tile(np.arange(n_g), len(pairs))
    strata = np.repeat(np.arange(len(pairs)), n_g)
    prompts = sorted(sub["prompt_id"].unique().to_list())
    per_prompt = []
    for p in prompts:
        rows = sub.filter(pl.col("prompt_id") == p)
        k = np.array([pid[x] for x in rows["pair_index"]])
        wins = np.zeros(len(codes))
        apps = np.zeros(len(codes))
        np.add.at(wins, k * n_g + np.array([groups.index(g) for g in rows["winner"]]), 1.0)
        for col in ("group_a", "group_b"):
            np.add.at(apps, k * n_g + np.array([groups.index(g) for g in rows[col]]), 1.0)
        per_prompt.append((wins, apps))
    uniform = formula == "term_tvd_uniform"

    def score(m, b):
        out = np.full((b, len(prompts)), np.nan)
        for j, (wins, apps) in enumerate(per_prompt):
            w = _grouped(m, wins, b, n_g)
            with np.errstate(invalid="ignore", divide="ignore"):
                r = w / w.sum(axis=1, keepdims=True)
                if uniform:
                    out[:, j] = tvd_from_uniform(r, axis=1)
                else:
                    a = _grouped(m, apps, b, n_g)
                    e = a / a.sum(axis=1, keepdims=True)
                    out[:, j] = 0.5 * np.abs(r - e).sum(axis=1)
        return out

    keys = np.array([str(p) for p in pairs])
    return _Units(codes, strata, True, len(pairs), n_g, prompts, score, keys)


def _exam_units(sub, groups, formula) -> _Units:
    units = sub.select("image_id", "group", "stratum").unique("image_id").sort("image_id")
    uid = {u: i for i, u in enumerate(units["image_id"])}
    codes = np.array([groups.index(g) for g in units["group"]])
    pooled = formula == "exam_tvd_pooled"
    subjects = ["*"] if pooled else sorted(sub["subject"].unique().to_list())
    arrs = []
    counted = "n" in sub.columns  # one row per image and subject: answers n, correct n_correct
    for s in subjects:
        rows = sub if pooled else sub.filter(pl.col("subject") == s)
        idx = [uid[i] for i in rows["image_id"]]
        right = np.zeros(len(uid))
        tot = np.zeros(len(uid))
        hits = rows["n_correct" if counted else "correct"].cast(pl.Float64).to_numpy()
        np.add.at(right, idx, hits)
        np.add.at(tot, idx, rows["n"].cast(pl.Float64).to_numpy() if counted else 1.0)
        arrs.append((right, tot))

    def score(m, b):
        out = np.full((b, len(subjects)), np.nan)
        for j, (right, tot) in enumerate(arrs):
            r = _grouped(m, right, b, len(groups))
            t = _grouped(m, tot, b, len(groups))
            with np.errstate(invalid="ignore", divide="ignore"):
                acc = r / t
                q = acc / acc.sum(axis=1, keepdims=True)
                s = tvd_from_uniform(q, axis=1)
            # all groups at zero accuracy: no disparity
            out[:, j] = np.where(np.isfinite(acc).all(1) & (acc.sum(1) == 0), 0.0, s)
        return out

    strata = units["stratum"].rank("dense").to_numpy().astype(np.int64) - 1
    keys = units["image_id"].cast(pl.String).to_numpy()
    return _Units(codes, strata, False, len(uid), len(groups), subjects, score, keys)


def filled(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """``column`` as strings, "" for a null or for every row when the table has none."""
    if column in frame.columns:
        return frame.with_columns(pl.col(column).cast(pl.String).fill_null(""))
    return frame.with_columns(pl.lit("").alias(column))


def _iter_tables(task, table, responses, groups, min_count, formulas):
    formulas = check_formulas(formulas)
    name = formulas.get(task)
    if task == "story":
        _check(
            table,
            {"model", "axis", "group", "image_id", "prompt_id", "attribute", "value"},
            "story",
        )
        resp_all = filled(responses if responses is not None else table, "stratum")
    elif task == "term":
        _check(
            table,
            {"model", "axis", "prompt_id", "pair_index", "group_a", "group_b", "winner"},
            "term",
        )
    elif task == "exam":
        counted = {"n", "n_correct"} <= set(table.columns)
        need = {"n", "n_correct"} if counted else {"correct"}
        _check(table, {"model", "axis", "group", "image_id", "subject", *need}, "exam")
        table = filled(table, "stratum")
    else:
        raise ConfigError(f"task {task!r}: use story, term or exam")
    formula = FORMULAS[task][name].format(min_count=min_count)
    by = ["model", "axis", *(["setting"] if "setting" in table.columns else [])]
    for key, sub in table.group_by(*by, maintain_order=True):
        model, axis = key[0], key[1]
        setting = key[2] if len(key) > 2 else None
        if task == "story":
            cond = (pl.col("model") == model) & (pl.col("axis") == axis)
            if setting is not None and "setting" in resp_all.columns:
                cond &= pl.col("setting") == setting
            resp = resp_all.filter(cond)
            g = _groups_for(axis, resp["group"].unique().to_list(), groups)
            built = _story_units(
                sub,
                resp.select("image_id", "group", "prompt_id", "stratum").unique(),
                g,
                min_count,
                name,
            )
        elif task == "term":
            present = sorted(set(sub["group_a"].to_list()) | set(sub["group_b"].to_list()))
            g = _groups_for(axis, present, groups)
            built = _term_units(sub, g, name)
        else:
            g = _groups_for(axis, sub["group"].unique().to_list(), groups)
            built = _exam_units(sub, g, name)
        yield (model, setting, axis), formula, built


def _point(units: _Units) -> np.ndarray:
    one = _membership(units.codes[None], np.ones((1, units.codes.size)), units.n_groups)
    return units.score(one, 1)[0]


def prompt_scores(
    task: str,
    table: pl.DataFrame,
    *,
    responses: pl.DataFrame | None = None,
    groups: tuple[str, ...] | None = None,
    min_count: int = 5,
    formulas: dict[str, str] | None = None,
) -> pl.DataFrame:
    """Per-prompt scores S_q x100: model, [setting,] axis, task, prompt_id (exam: the subject,
    "*" pooled), score, formula; min_count applies to story only."""
    rows = []
    for (model, setting, axis), formula, units in _iter_tables(
        task, table, responses, groups, min_count, formulas
    ):
        s = _point(units) * 100.0
        rows += [
            {
                "model": model,
                **({} if setting is None else {"setting": setting}),
                "axis": axis,
                "task": task,
                "prompt_id": p,
                "score": float(v),
                "formula": formula,
            }
            for p, v in zip(units.prompts, s, strict=True)
        ]
    return pl.DataFrame(rows)


def _replicate_means(units: _Units, point: np.ndarray, codes, weights) -> np.ndarray:
    """Mean over the prompts with a finite point score, x100, of the replicates given by
    group ``codes`` [n, U] and ``weights`` [n, U]."""
    n = weights.shape[0]
    s = units.score(_membership(codes, weights, units.n_groups), n)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a replicate with no score
        return np.nanmean(np.where(np.isfinite(point)[None, :], s, np.nan), axis=1) * 100


def _batches(total: int, cells: int):
    batch = max(1, MAX_CELLS // max(cells, 1))
    done = 0
    while done < total:
        n = min(batch, total - done)
        yield n
        done += n


def _paired_bootstrap(task, axis, built, n_boot, seed) -> dict:
    """Per key of ``built`` (every (model, setting) of one axis) the bootstrap replicates of
    its overall score, all drawn from one resample of the shared units per replicate
    (stereolens.lvlm.resample)."""
    keys = list(built)
    units = [built[k][1] for k in keys]
    strata = units[0].boot_strata
    union, ucodes, idx = R.shared_units(
        [u.boot_keys for u in units], [None if strata else u.codes for u in units]
    )
    rng = R.stream("lvlm-bootstrap", seed, task, axis)
    out = {k: [] for k in keys}
    cells = max(max(u.codes.size for u in units), union.size)
    for n in _batches(n_boot, cells):
        w = R.resample_weights(ucodes, union.size, n, rng)
        for k, u, i in zip(keys, units, idx, strict=True):
            wu = w[:, i][:, u.strata] if strata else w[:, i]
            codes = np.broadcast_to(u.codes, (n, u.codes.size))
            out[k].append(_replicate_means(u, built[k][2], codes, wu))
    return {k: np.concatenate(v) for k, v in out.items()}


def _null(units: _Units, point, permutations, seed, key):
    rng = R.stream("lvlm-permutation", seed, *key)
    out = []
    for n in _batches(permutations, units.codes.size):
        codes = R.permuted_codes(units.codes, units.strata, n, rng)
        out.append(_replicate_means(units, point, codes, np.ones((n, units.codes.size))))
    return np.concatenate(out) if out else np.zeros(0)


def score_replicates(
    task: str,
    table: pl.DataFrame,
    *,
    responses: pl.DataFrame | None = None,
    groups: tuple[str, ...] | None = None,
    min_count: int = 5,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    permutations: int = 1000,
    formulas: dict[str, str] | None = None,
    min_images_per_group: int = R.MIN_IMAGES_PER_GROUP,
) -> tuple[pl.DataFrame, dict[tuple, np.ndarray]]:
    """(the overall table, per (model, setting, axis) the score's paired bootstrap replicates;
    setting None without a ``setting`` column). Below ``min_images_per_group`` user images per
    group ci_low and ci_high are null and ``interval_note`` says why."""
    per_axis: dict[str, dict] = {}
    for key, formula, units in _iter_tables(task, table, responses, groups, min_count, formulas):
        per_axis.setdefault(key[2], {})[key] = (formula, units, _point(units))
    rows, reps = [], {}
    for axis, built in per_axis.items():
        live = {k: v for k, v in built.items() if np.isfinite(v[2]).any()}
        boots = _paired_bootstrap(task, axis, live, n_boot, seed) if n_boot > 0 and live else {}
        for key, (formula, units, point) in built.items():
            model, setting, _ = key
            finite = np.isfinite(point)
            score = float(np.mean(point[finite])) * 100 if finite.any() else float("nan")
            null_mean = null_high = p_perm = float("nan")
            if permutations > 0 and finite.any():
                null = _null(units, point, permutations, seed, (model, task, axis))
                null = null[np.isfinite(null)]
                if null.size:
                    null_mean = float(null.mean())
                    null_high = float(np.quantile(null, 0.95))
                    p_perm = float((1 + np.sum(null >= score - 1e-12)) / (1 + null.size))
            boot = boots.get(key, np.zeros(0))
            bc, lo, hi = R.bracket_interval(score, boot, level, null_mean)
            per_group = R.images_per_group(
                units.codes, units.n_groups, units.boot_strata, units.n_boot_units
            )
            note = R.withheld_note(per_group, min_images_per_group)
            if note is not None:
                lo = hi = None
            reps[key] = boot
            rows.append(
                {
                    "model": model,
                    **({} if setting is None else {"setting": setting}),
                    "axis": axis,
                    "task": task,
                    "score": score,
                    "score_bc": bc,
                    "ci_low": lo,
                    "ci_high": hi,
                    "null_mean": null_mean,
                    "null_high": null_high,
                    "p_perm": p_perm,
                    "n_perm": permutations,
                    "n_prompts": int(finite.sum()),
                    "n_units": units.n_boot_units,
                    "images_per_group": per_group,
                    "interval_note": note,
                    "n_boot": n_boot,
                    "seed": seed,
                    "formula": f"mean over prompts of {formula}",
                    "interval": R.INTERVAL if permutations > 0 else R.INTERVAL_NO_NULL,
                }
            )
    typed = {"ci_low": pl.Float64, "ci_high": pl.Float64, "interval_note": pl.String}
    return pl.DataFrame(rows, schema_overrides=typed if rows else None), reps


def overall_scores(task: str, table: pl.DataFrame, **kw) -> pl.DataFrame:
    """Overall score = the mean of the per-prompt scores with a value, x100, per model (and
    setting) and axis, with the permutation noise floor (null_mean, null_high, p_perm;
    ``permutations`` 0 = none), score_bc = score - null_mean and the noise-floor bracket
    interval from one paired bootstrap of the user images shared by every model
    (stereolens.lvlm.resample). Keywords and columns: :func:`score_replicates`."""
    return score_replicates(task, table, **kw)[0]
