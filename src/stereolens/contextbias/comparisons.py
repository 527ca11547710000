"""ContextBias comparisons between models (issue 20, item 3): every pair of generators (and,
when several extractors read the same images, every pair of extractors) on the headline
metrics, pooled BI per condition overall and per cohort and the CA-U - CF shift, with intervals
from the role-level cluster bootstrap's replicates (stereolens.metrics.compare)."""

from __future__ import annotations

import numpy as np
import polars as pl

from stereolens.contextbias.bootstrap import LevelReplicates
from stereolens.contextbias.metrics import ALL, CONDITIONS
from stereolens.metrics.compare import COMPARISON_COLUMNS, RANK_COLUMNS, compare, concat

BENCHMARK = "contextbias"
SHIFT = ("CA-U", "CF")
"""The headline shift, BI(CA-U) - BI(CF) (paper Tables 8-9)."""
METRICS = {
    "bi": "pooled BI (1 - H/log K) of one condition; lower = labels spread more evenly",
    "bi_shift": "BI(CA-U) - BI(CF); lower = the unrelated context concentrates labels less",
}
"""The compared metrics; lower is less biased for both."""


def resampling(draws: str) -> str:
    """The ``resampling`` column: the role-level cluster bootstrap and its draws."""
    kind = "one role draw shared by all models" if draws == "paired" else "a draw per model"
    return f"role cluster bootstrap ({kind})"


def _headline(lv: LevelReplicates) -> list[tuple[int, str]]:
    """(level index, scope name) of the headline levels: overall, then each cohort."""
    out = [(i, "overall") for i, (c, d) in enumerate(lv.levels) if c == ALL and d == ALL]
    out += [(i, c) for i, (c, d) in enumerate(lv.levels) if c != ALL and d == ALL]
    return out


def _statistic(lv: LevelReplicates, metric: str, level: int, condition: str):
    """(estimate (G,), replicates (G, B)) of one metric at one level."""
    ci = {c: i for i, c in enumerate(CONDITIONS)}
    if metric == "bi":
        c = ci[condition]
        return lv.estimate[:, level, c], lv.replicates[:, :, level, c]
    a, b = ci[SHIFT[0]], ci[SHIFT[1]]
    est = lv.estimate[:, level, a] - lv.estimate[:, level, b]
    rep = lv.replicates[:, :, level, a] - lv.replicates[:, :, level, b]
    return est, rep


def _families(lv: LevelReplicates):
    """(metric, scope prefix, condition) of every family, conditions first then the shift."""
    for cond in CONDITIONS:
        yield "bi", cond, cond
    yield "bi_shift", f"{SHIFT[0]} - {SHIFT[1]}", None


def model_comparisons(
    lv: LevelReplicates, level: float = 0.95
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """comparisons.parquet and ranks.parquet of ContextBias from the bootstrap's level
    replicates.

    Families (one Holm family each): metric "bi" with scope "<condition> / <overall or
    cohort>", metric "bi_shift" with scope "CA-U - CF / <overall or cohort>"; models =
    the generators of one extractor (scope prefixed "<extractor> / " when the table has an
    extractor column). When there are several extractors, also metric "bi_extractor" /
    "bi_shift_extractor" families whose models are the extractors reading one generator's
    images (scope prefixed "<generator> / "). estimate = the statistic on the original data
    (equal to bootstrap.parquet's and bi.parquet's pooled values); the replicates are the
    cluster bootstrap's (paired across models under paired draws: each replicate's role
    draw is shared by every model, extractor and condition). Lower is less biased. Models
    whose estimate is undefined (a condition without data) are left out of the family."""
    cmp_frames: list[pl.DataFrame] = []
    rank_frames: list[pl.DataFrame] = []
    paired = lv.draws == "paired"
    how = resampling(lv.draws)
    by_extractor: dict[tuple, list[int]] = {}
    by_generator: dict[str, list[int]] = {}
    for g, key in enumerate(lv.keys):
        by_extractor.setdefault(key[:-1], []).append(g)
        by_generator.setdefault(key[-1], []).append(g)
    groupings = [("", by_extractor, -1)]
    if len(by_extractor) > 1:
        groupings.append(("_extractor", {(m,): gs for m, gs in by_generator.items()}, 0))
    for suffix, groups, name_at in groupings:
        for outer, members in sorted(groups.items()):
            prefix = "".join(f"{v} / " for v in outer)
            for metric, head, cond in _families(lv):
                for li, scope in _headline(lv):
                    est, rep = _statistic(lv, metric, li, cond)
                    ok = [g for g in members if np.isfinite(est[g])]
                    if not ok:
                        continue
                    names = {g: lv.keys[g][name_at] for g in ok}
                    cmp, rk = compare(
                        {names[g]: float(est[g]) for g in ok},
                        {names[g]: rep[g] for g in ok},
                        benchmark=BENCHMARK,
                        metric=metric + suffix,
                        scope=f"{prefix}{head} / {scope}",
                        better="lower",
                        paired=paired,
                        resampling=how,
                        level=level,
                    )
                    cmp_frames.append(cmp)
                    rank_frames.append(rk)
    return concat(cmp_frames, COMPARISON_COLUMNS), concat(rank_frames, RANK_COLUMNS)
