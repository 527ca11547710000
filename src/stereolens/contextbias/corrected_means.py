"""ContextBias's corrected means over roles (``bi_role``, ``bi_role_mm``) and over generators
(the model "*" rows ``bi_pooled_mean``, ``bi_role_mean``, ``bi_role_mm_mean``), for
contextbias.corrected."""

from __future__ import annotations

import numpy as np
import polars as pl

from stereolens.contextbias.corrected_functionals import (
    miller_madow_functional,
    role_mean_functional,
    summary_functional,
)
from stereolens.contextbias.corrected_rule import AGGREGATE_MIN_LABELLED, apply_rule
from stereolens.contextbias.metrics import ALL, nanmean
from stereolens.metrics import corrected_tables as ct
from stereolens.metrics import reader_correction as rc

TABLE_KEYS = ("model", "role", "condition", "cohort", "dimension", "label")
"""The key columns of corrected.parquet's rows of every metric (``extractor`` first when the
attributes table has one; ``label``: the CCS row's label, null on the BI rows). ``bi``: role x
condition x dimension, label null (dimension "*" = the role's cohort mean, cohort "*" = its
overall value); ``bi_pooled``: role "*" (the counts pooled over roles,
contextbias.metrics.pooled_bi; dimension "*" = the cohort's mean, cohort "*" = the overall
value, as bi.parquet's); ``bi_role`` and ``bi_role_mm``: role "*" (bi.parquet's aggregations
"role" and "role_miller_madow": the mean over roles; dimension "*" and cohort "*" as
bi_pooled's); ``bi_pooled_mean``, ``bi_role_mean``, ``bi_role_mm_mean``: model "*" and role "*"
(their mean over generators, bi.parquet's model "*" rows); ``ccs``: condition "*" (CCS spans
the three), the ccs table's keys (model, role, cohort, dimension, label); ``ccs_mean``: model
"*" and condition "*", the ccs_mean table's keys (role, cohort, dimension, label)."""
GENERATOR_MEANS = {"bi_role": "bi_role_mean", "bi_role_mm": "bi_role_mm_mean"}
"""The metric of each role mean's model "*" rows (bi.parquet's model "*" rows of the
aggregations "role" and "role_miller_madow")."""


def mm_interval(options: dict) -> str:
    """The interval of the Miller-Madow rows: ``normal`` (the plug-in point +- z sd) where
    ``options`` ask ``bc_normal``: its term removes the plug-in's bias, which the bootstrap's
    2 x point - mean would remove again (bench/COVERAGE.md "ContextBias at the paper's
    design"); otherwise ``options``' own."""
    kind = options.get("interval", "bc_normal")
    return "normal" if kind == "bc_normal" else kind


def model_part(dims: list) -> dict:
    """One model x condition's rows (key, cells, functional), sorted by cohort and
    dimension, as the summary functional takes them: the cells in order, each dimension's
    span, its functional, the cohorts (names; the dimensions of each) and the joint groups
    (a role's cells: the same images, Cell.items)."""
    dims = sorted(dims, key=lambda d: (d[0]["cohort"], d[0]["dimension"]))
    cells, spans, by_role = [], [], {}
    for _key, part, _fn in dims:
        spans.append(slice(len(cells), len(cells) + len(part)))
        for cell in part:
            by_role.setdefault(cell.items, []).append(len(cells))  # a role's images
            cells.append(cell)
    names = sorted({d[0]["cohort"] for d in dims})
    cohorts = [[i for i, d in enumerate(dims) if d[0]["cohort"] == c] for c in names]
    return {
        "cells": cells, "spans": spans, "pooled": [d[2] for d in dims], "names": names,
        "cohorts": cohorts, "joint": list(by_role.values()),
        "dims": [(d[0]["cohort"], d[0]["dimension"]) for d in dims],
    }  # fmt: skip


def role_parts(rows: list, single_label_bi: float) -> dict[tuple, dict]:
    """(model, condition) -> the :func:`model_part` of its mean over roles per metric
    (``bi_role``: role_mean_functional of the roles' BI; ``bi_role_mm``: of their
    Miller-Madow BI) and ``k`` ((cohort, dimension) -> K where the roles agree, else None).
    ``rows``: the ``bi`` rows (key, [cell], functional, bounds)."""
    groups: dict[tuple, dict] = {}
    for key, part, fn, _ in rows:
        dims = groups.setdefault((key["model"], key["condition"]), {})
        dims.setdefault((key["cohort"], key["dimension"]), []).append((key, part[0], fn))
    out = {}
    for (model, condition), by_dim in sorted(groups.items()):
        dims, mm, ks = [], {}, {}
        for (cohort, dim), members in sorted(by_dim.items()):
            members.sort(key=lambda m: m[0]["role"])
            fns = [m[2] for m in members]
            cells = [m[1] for m in members]
            dims.append(({"cohort": cohort, "dimension": dim}, cells, role_mean_functional(fns)))
            mm[(cohort, dim)] = role_mean_functional(
                [miller_madow_functional(c.stratum.size, m[0]["k"], single_label_bi)
                 for m, c in zip(members, cells, strict=True)]
            )  # fmt: skip
            k = {m[0]["k"] for m in members}
            ks[(cohort, dim)] = k.pop() if len(k) == 1 else None
        m = model_part(dims)
        out[(model, condition)] = {
            "bi_role": m,
            "bi_role_mm": {**m, "pooled": [mm[d] for d in m["dims"]]},
            "k": ks,
        }
    return out


def role_mean_table(rows: list, overall: str, single_label_bi: float, options: dict):
    """The ``bi_role`` and ``bi_role_mm`` rows (role "*"): bi.parquet's "role" and
    "role_miller_madow" aggregations, per model x condition the mean over roles of each
    dimension's role-level BI (plug-in; Miller-Madow: miller_madow_functional), then the
    cohort rows (dimension "*") and the overall row (cohort "*") as summary_functional
    forms them, all of them, both metrics, from one bootstrap per model x condition in
    which a role's dimensions (the same images) share one draw and the roles are drawn
    independently; k the dimension's K where its roles agree, else null (null on the
    summary rows); interval_reliable of ``bi_role`` by corrected_rule (its aggregate rule,
    withheld_reason where it fails), of ``bi_role_mm`` per cell; ``bi_role_mm``'s interval
    :func:`mm_interval`. ``rows``: the ``bi`` rows
    (key, [cell], functional, bounds)."""
    records = {"bi_role": [], "bi_role_mm": []}
    for (model, condition), p in role_parts(rows, single_label_bi).items():
        m = p["bi_role"]
        fns = [
            summary_functional(p[metric]["pooled"], m["spans"], m["cohorts"], overall,
                               with_dims=True)
            for metric in records
        ]  # fmt: skip
        spans = [list(range(s.start, s.stop)) for s in m["spans"]]
        parts = [*([s] for s in spans), *([spans[d] for d in idx] for idx in m["cohorts"])]
        parts.append(spans)
        kinds = (options.get("interval", "bc_normal"), mm_interval(options))  # bi_role, _mm
        results = rc.corrected_metrics(
            m["cells"], lambda shares, fns=fns: np.concatenate([f(shares) for f in fns], -1),
            column_cells=[[j for p in ps for j in p] for ps in parts] * 2, joint=m["joint"],
            bounds=(0.0, 1.0), column_interval=[k for k in kinds for _ in parts], **options,
        )  # fmt: skip
        apply_rule(results[: len(parts)], m["cells"], parts, "bi_role")  # bi_role_mm: per cell
        keys = [*m["dims"], *((c, ALL) for c in m["names"]), (ALL, ALL)]
        for i, metric in enumerate(records):
            part = results[i * len(keys) : (i + 1) * len(keys)]
            for (cohort, dim), res in zip(keys, part, strict=True):
                records[metric].append(
                    {"model": model, "role": ALL, "condition": condition, "cohort": cohort,
                     "dimension": dim, "label": None, "k": p["k"].get((cohort, dim)), **res}
                )  # fmt: skip
    frames = []
    for metric, recs in records.items():
        k = pl.Series("k", [r.pop("k") for r in recs], dtype=pl.Int64)
        frames.append(with_reason(ct.metric_frame(recs, TABLE_KEYS, metric), recs).with_columns(k))
    return pl.concat(frames)


def with_reason(table: pl.DataFrame, records: list[dict]) -> pl.DataFrame:
    """``table`` (ct.metric_frame of ``records``) with their withheld_reason (corrected_rule)."""
    reasons = [r.get("withheld_reason") for r in records]
    return table.with_columns(pl.Series("withheld_reason", reasons, dtype=pl.String))


def generator_means(rows: list, overall: str, single_label_bi: float, options: dict):
    """The role means' model "*" rows (GENERATOR_MEANS: bi.parquet's model "*" rows of
    "role" and "role_miller_madow"), per condition the mean over generators of each
    generator's :func:`role_mean_table` rows, by :func:`cross_model_rows` (one bootstrap per
    condition and metric: the generators independently, a role's dimensions jointly;
    ``bi_role_mm_mean``'s interval :func:`mm_interval`); interval_reliable of a metric of
    corrected_rule.AGGREGATE_MIN_LABELLED by its aggregate rule over every generator's role
    cells (withheld_reason where it fails), of the others per cell; k null. ``rows``: the
    ``bi`` rows."""
    parts = role_parts(rows, single_label_bi)
    frames = []
    for metric, mean in GENERATOR_MEANS.items():
        by_condition: dict[str, list] = {}
        for (_model, condition), p in parts.items():
            by_condition.setdefault(condition, []).append(p[metric])
        opts = {**options, "interval": mm_interval(options)} if metric == "bi_role_mm" else options
        frames.append(
            cross_model_rows(by_condition, overall, opts, mean).with_columns(
                pl.lit(None, pl.Int64).alias("k")
            )
        )
    return pl.concat(frames, how="diagonal_relaxed")


def cross_model_rows(
    by_condition: dict, overall: str, options: dict, metric: str = "bi_pooled_mean"
) -> pl.DataFrame:
    """Model "*" rows (role "*") of a per-model BI: bi.parquet's model "*" rows
    (contextbias.metrics.cross_model_rows), per condition the mean over the generators of
    every dimension's value, cohort mean and overall value (NaN left out, as the benchmark
    leaves out its nulls), one bootstrap per condition: the generators' cells independently
    (their images are), a role's dimensions jointly. ``by_condition``: condition -> the
    generators' :func:`model_part` (``pooled`` each dimension's functional): pooled BI
    (``bi_pooled_mean``) or a role mean (GENERATOR_MEANS). A ``metric`` of
    corrected_rule.AGGREGATE_MIN_LABELLED: interval_reliable by its rule (apply_rule) over
    the role cells of each generator x dimension of a row, and withheld_reason; otherwise
    interval_reliable per cell (no withheld_reason column)."""
    records, ruled = [], metric in AGGREGATE_MIN_LABELLED
    for condition, models in sorted(by_condition.items()):
        dims = sorted({d for m in models for d in m["dims"]})
        names = sorted({c for m in models for c in m["names"]})
        width = len(dims) + len(names) + 1
        cells, joint, parts, column = [], [], [], [[] for _ in range(width)]
        groups: list[list] = [[] for _ in range(width)]  # per column: generator x dimension
        for m in models:
            off, spans = len(cells), m["spans"]
            idx = [dims.index(d) for d in m["dims"]]
            idx += [len(dims) + names.index(c) for c in m["names"]] + [width - 1]
            of = [list(range(off + s.start, off + s.stop)) for s in spans]
            for d, col in enumerate(idx[: len(spans)]):
                column[col] += of[d]
                groups[col].append(of[d])
            for c, members in enumerate(m["cohorts"]):
                column[idx[len(spans) + c]] += [j for d in members for j in of[d]]
                groups[idx[len(spans) + c]] += [of[d] for d in members]
            column[-1] += list(range(off, off + len(m["cells"])))
            groups[-1] += of
            joint += [[off + j for j in group] for group in m["joint"]]
            fn = summary_functional(m["pooled"], spans, m["cohorts"], overall, with_dims=True)
            parts.append((fn, slice(off, off + len(m["cells"])), np.array(idx)))
            cells += m["cells"]

        def mean(shares: list[np.ndarray], parts=parts, width=width) -> np.ndarray:
            out = np.full((np.atleast_2d(shares[0]).shape[0], len(parts), width), np.nan)
            for i, (fn, span, idx) in enumerate(parts):
                out[:, i, idx] = fn(shares[span])
            return nanmean(out, axis=1)  # no generator: NaN

        results = rc.corrected_metrics(
            cells, mean, column_cells=column, joint=joint, bounds=(0.0, 1.0), **options
        )
        if ruled:
            apply_rule(results, cells, groups, metric)
        keys = [*dims, *((c, ALL) for c in names), (ALL, ALL)]
        for (cohort, dim), res in zip(keys, results, strict=True):
            records.append(
                {"model": ALL, "role": ALL, "condition": condition, "cohort": cohort,
                 "dimension": dim, "label": None, **res}
            )  # fmt: skip
    table = ct.metric_frame(records, TABLE_KEYS, metric)
    return with_reason(table, records) if ruled else table
