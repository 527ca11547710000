"""Comparisons between the audited LVLMs on each headline score (TVD x100 per task and axis; the
refusal rate per task), through stereolens.metrics.compare, with the TVD's bracket columns
(docs/statistics.md, "Model comparisons" and "LVLM intervals")."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from stereolens.lvlm import resample as R
from stereolens.metrics import compare as C

BENCHMARK = "lvlm"
TVD_RESAMPLING = (
    "paired bootstrap of the user images (term: image pairs), one resample per replicate "
    "for every model and setting"
)
REFUSAL_RESAMPLING = (
    "paired bootstrap of the user images within axis and group, one resample per replicate "
    "for every model and setting"
)
BASE_SETTING = "image"
COMPARISON_EXTRA = ["bracket_low", "bracket_high"]
"""The TVD rows' bound on the difference of the population scores (null for refusals and
for a withheld pair)."""
COLUMNS = [c for c in C.COMPARISON_COLUMNS if c != "interval_note"]
COLUMNS += [*COMPARISON_EXTRA, "interval_note"]
"""comparisons.parquet's columns: metrics.compare's, the bracket before ``interval_note``."""


def _label(model: str, setting: str) -> str:
    return f"{model} [{setting}]"


def _families(estimates: dict):
    """Per setting the models of that setting ({model: key}), and per model its settings
    against the image setting ({label: key}, variants {label: base label})."""
    settings = sorted({k[1] for k in estimates})
    for setting in settings:
        yield f"setting {setting}", {k[0]: k for k in estimates if k[1] == setting}, {}
    for model in sorted({k[0] for k in estimates}):
        keys = {_label(model, k[1]): k for k in estimates if k[0] == model}
        if len(keys) < 2 or (model, BASE_SETTING) not in estimates:
            continue
        base = _label(model, BASE_SETTING)
        yield (
            f"{model}: settings vs {BASE_SETTING}",
            keys,
            {lab: base for lab in keys if lab != base},
        )


def _bracket(frame: pl.DataFrame, keys: dict, reps: dict, nulls: dict, level: float):
    """bracket_low, bracket_high of each pair (see the module docstring); null for a withheld
    pair (its ``interval_note`` set)."""
    a = (1 - level) / 2
    lo, hi = [], []
    for r in frame.iter_rows(named=True):
        if r["interval_note"] is not None:
            lo.append(None)
            hi.append(None)
            continue
        ka, kb = keys[r["model_a"]], keys[r["model_b"]]
        d = np.asarray(reps[kb], float) - np.asarray(reps[ka], float)
        d = d[np.isfinite(d)]
        na, nb = nulls.get(ka, np.nan), nulls.get(kb, np.nan)
        if not d.size or not (np.isfinite(na) and np.isfinite(nb)):
            lo.append(np.nan)
            hi.append(np.nan)
            continue
        q_lo, q_hi = np.quantile(d, [a, 1 - a]) - d.mean()
        lo.append(r["difference"] - nb + q_lo)
        hi.append(r["difference"] + na + q_hi)
    return frame.with_columns(
        pl.Series("bracket_low", lo, dtype=pl.Float64),
        pl.Series("bracket_high", hi, dtype=pl.Float64),
    )


def _notes(rows, key, minimum: int) -> dict:
    """Per key the interval_note of its images per group (none without the column)."""
    return {
        key(r): R.withheld_note(int(r["images_per_group"]), minimum)
        for r in rows
        if r.get("images_per_group") is not None
    }


def _compare_groups(
    frame: pl.DataFrame,
    by: list[str],
    column: str,
    replicates: dict,
    *,
    describe: Callable[..., tuple[str, str]],
    min_images: int,
    level: float,
    resampling: str,
    bracket: bool = False,
) -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """Comparison and rank frames of ``column`` per ``by`` group of ``frame`` (``describe(*group)``:
    its metric and scope) in every family of (model, setting) cells with a finite value and
    replicates, better = lower; ``bracket``: the TVD rows' noise-floor bracket."""
    cmp, rk = [], []
    if frame.height == 0 or not replicates:
        return cmp, rk
    for group, sub in frame.group_by(*by, maintain_order=True):
        reps = {k[:2]: v for k, v in replicates.items() if k[2:] == group}
        rows = list(sub.iter_rows(named=True))
        est = {
            (r["model"], r["setting"]): r[column]
            for r in rows
            if (r["model"], r["setting"]) in reps and np.isfinite(r[column])
        }
        notes = _notes(rows, lambda r: (r["model"], r["setting"]), min_images)
        nulls = {(r["model"], r["setting"]): r["null_mean"] for r in rows} if bracket else {}
        metric, scope = describe(*group)
        for family, keys, variants in _families(est):
            if len(keys) < 2:
                continue
            c, r = C.compare(
                {lab: est[k] for lab, k in keys.items()},
                {lab: reps[k] for lab, k in keys.items()},
                withheld={lab: notes.get(k) for lab, k in keys.items()},
                benchmark=BENCHMARK,
                metric=metric,
                scope=f"{scope}, {family}",
                better="lower",
                paired=True,
                variants=variants,
                level=level,
                resampling=resampling,
            )
            cmp.append(_bracket(c, keys, reps, nulls, level) if bracket else c)
            rk.append(r)
    return cmp, rk


def tvd_comparisons(
    scores: pl.DataFrame,
    replicates: dict,
    level: float = 0.95,
    min_images_per_group: int = R.MIN_IMAGES_PER_GROUP,
) -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """Comparison and rank frames of the TVD scores (metrics.scores' overall table and its
    replicates); a pair with a model below ``min_images_per_group`` is withheld."""
    return _compare_groups(
        scores, ["task", "axis"], "score", replicates,
        describe=lambda task, axis: (f"{task} TVD x100", axis), bracket=True,
        min_images=min_images_per_group, level=level, resampling=TVD_RESAMPLING,
    )  # fmt: skip


def refusal_replicates(images: pl.DataFrame, n_boot: int, seed: int) -> dict:
    """Per (model, setting, task) the paired bootstrap replicates of the refusal rate (%) from
    the per-image counts: a task's images resampled within axis and group, one draw per
    replicate for every model and setting."""
    out = {}
    if images is None or images.height == 0 or n_boot <= 0:
        return out
    images = images.with_columns(
        (pl.col("axis") + "\x1f" + pl.col("group") + "\x1f" + pl.col("image_id")).alias("_u"),
        (pl.col("axis") + "\x1f" + pl.col("group")).alias("_s"),
    )
    for (task,), sub in images.group_by("task", maintain_order=True):
        units = sub.select("_u", "_s").unique("_u").sort("_u")
        union = units["_u"].to_numpy().astype(str)
        codes = units["_s"].rank("dense").to_numpy().astype(np.int64)
        w = R.resample_weights(codes, union.size, n_boot, R.stream("lvlm-refusal", seed, task))
        for (model, setting), cell in sub.group_by("model", "setting", maintain_order=True):
            idx = np.searchsorted(union, cell["_u"].to_numpy().astype(str))
            ref = cell["n_refusal"].cast(pl.Float64).to_numpy()
            valid = (cell["n"] - cell["n_empty"]).cast(pl.Float64).to_numpy()
            with np.errstate(invalid="ignore", divide="ignore"):
                out[(model, setting, task)] = 100 * (w[:, idx] @ ref) / (w[:, idx] @ valid)
    return out


def refusal_comparisons(
    refusals: pl.DataFrame,
    replicates: dict,
    level: float = 0.95,
    min_images_per_group: int = R.MIN_IMAGES_PER_GROUP,
) -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """Comparison and rank frames of the refusal rates per task (metrics.refusals' group "*"
    rows), better = lower; a pair with a model below ``min_images_per_group`` is withheld."""
    if refusals.height == 0:
        return [], []
    return _compare_groups(
        refusals.filter((pl.col("axis") == "*") & (pl.col("group") == "*")), ["task"], "rate",
        replicates, describe=lambda task: ("refusal rate %", task), bracket=False,
        min_images=min_images_per_group, level=level, resampling=REFUSAL_RESAMPLING,
    )  # fmt: skip


def tables(cmp: list[pl.DataFrame], rk: list[pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """The comparisons (COLUMNS) and ranks (RANK_COLUMNS) tables, their columns also when empty."""
    frames = [f for f in cmp if f.height]
    empty = C.empty_frame(C.COMPARISON_COLUMNS).with_columns(
        pl.lit(None, pl.Float64).alias(c) for c in COMPARISON_EXTRA
    )
    comparisons = pl.concat([empty, *frames], how="diagonal_relaxed").select(COLUMNS)
    return {"comparisons": comparisons, "ranks": C.concat(rk, C.RANK_COLUMNS)}
