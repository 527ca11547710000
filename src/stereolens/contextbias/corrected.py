"""ContextBias's BI (role-level, its mean over roles, pooled, cross-generator) and CCS
corrected for the extractor's errors from a human-labelled sample, naive beside corrected
(stereolens.metrics.reader_correction; docs/statistics.md, "Correcting for the reader's errors")."""

from __future__ import annotations

import numpy as np
import polars as pl

from stereolens.contextbias.corrected_functionals import (
    ccs_mean_functional,
    pooled_functional,
    summary_functional,
)
from stereolens.contextbias.corrected_means import (
    TABLE_KEYS,
    cross_model_rows,
    generator_means,
    model_part,
    role_mean_table,
)
from stereolens.contextbias.corrected_ties import ccs_ties, with_reasons, withhold_ties
from stereolens.contextbias.metrics import ALL, CONDITIONS, image_universe
from stereolens.contextbias.schema import AttributeSchema
from stereolens.metrics import corrected_tables as ct
from stereolens.metrics import human_labels as hl
from stereolens.metrics import reader_correction as rc

METRICS = ("bi", "bi_pooled", "bi_role", "ccs", "ccs_mean")
"""The metrics corrected_table may be asked for; ``bi_pooled`` brings its summary rows and
their mean over generators (metric ``bi_pooled_mean``) with it, ``bi_role`` its
Miller-Madow twin (metric ``bi_role_mm``) and both's means over generators
(``bi_role_mean``, ``bi_role_mm_mean``)."""
NOT_CORRECTED = {
    "role_matched": "bi.parquet's role_matched rows (BI at matched support) have no corrected "
    "row: matched support subsamples the reader's images to a count, which would drop human "
    "labels at random and break their probability sample; the correction estimates shares "
    "(docs/statistics.md, 'Correcting for the reader's errors')",
}
"""bi.parquet's aggregations without a corrected row, and why (the CLI and the report say it)."""
CELL_KEYS = ("model", "role", "condition", "cohort")
"""The reader table's cell columns (attribute = the dimension)."""


def stratum_of() -> pl.Expr:
    """An image's sampling stratum: generator x role x condition, "model|role|condition"
    (the annotation form's sets; a human-label table uses the same strings)."""
    return pl.concat_str("model", "role", "condition", separator="|")


def reader_table(attributes: pl.DataFrame, images: pl.DataFrame | None = None) -> pl.DataFrame:
    """The reader table (human_labels.READER_COLUMNS, plus extractor, model, role,
    condition, cohort): every extracted image (the images table's status ok ones, else the
    attributes table's) x every dimension of the attributes table, with the extractor's
    labels (``attributes``' label column, canonical when use_label_column chose it) or
    "unknown" where it gave the image none. item_id = image_id, attribute = dimension."""
    extractor = "extractor" in attributes.columns
    gkeys = (["extractor"] if extractor else []) + ["model"]
    universe = image_universe(attributes, images)
    dims = attributes.select("cohort", "dimension").unique()
    labels = attributes.select(*gkeys, "image_id", "dimension", "label").unique()
    table = (
        universe.join(dims, how="cross")
        .join(labels, on=[*gkeys, "image_id", "dimension"], how="left")
        .with_columns(
            pl.col("label").fill_null("unknown"),
            pl.col("image_id").alias("item_id"),
            pl.col("dimension").alias("attribute"),
            stratum_of().alias("stratum"),
        )
    )
    return table.select(*gkeys, "role", "condition", "cohort", *hl.READER_COLUMNS).sort(
        [*gkeys, "role", "condition", "attribute", "item_id", "label"]
    )


def _k(reader: pl.DataFrame, human: pl.DataFrame, k_definition: str, schema) -> dict:
    """(model, dimension) -> K under ``k_definition`` before the cell's own labels: 'model'
    = the labels the extractor or the humans gave in the model's images of the dimension;
    'vocabulary' = the schema's closed vocabulary's size (else as 'model'); 'cell' = 0
    (the cell's labels decide)."""
    if k_definition == "cell":
        return {}
    both = pl.concat(
        [
            reader.select("model", "attribute", "label"),
            human.join(
                reader.select("item_id", "attribute", "model").unique(),
                on=["item_id", "attribute"],
            ).select("model", "attribute", "label"),
        ]
    ).filter(~pl.col("label").str.strip_chars().str.to_lowercase().is_in(list(hl.NO_LABEL)))
    k = {
        (m, a): n
        for m, a, n in both.group_by("model", "attribute")
        .agg(pl.col("label").n_unique())
        .iter_rows()
    }
    if k_definition == "vocabulary":
        vocabulary = (schema or AttributeSchema.load()).vocabulary()
        closed = {d: len(v) for d, v in vocabulary.items() if v}
        k = {(m, a): closed.get(a, n) for (m, a), n in k.items()}
    return k


def _ccs_mean_table(by_key: dict, options: dict) -> pl.DataFrame:
    """The ``ccs_mean`` rows: per role x cohort x dimension x label over the generators with
    the role's three condition cells, naive the mean of the generators whose CCS is defined
    on the reader's counts (ccs_mean's own number), corrected of those whose corrected
    counts define it; two runs of corrected_metrics with one seed (the same resamples) where
    the two sets differ, one where they agree; NaN where a reading has no generator."""
    records = []
    for (role, cohort, dim), members in sorted(by_key.items()):
        ok_naive = np.stack([m[2] for m in members])  # (M, labels)
        ok_corr = np.stack([m[3] for m in members])
        labels = np.flatnonzero((ok_naive | ok_corr).any(0))
        if not labels.size:
            continue
        cells = [c for m in members for c in m[0]]
        sizes_of = [m[1] for m in members]
        # a generator whose shares of the label tie makes the mean's range as rough
        tie_naive = (np.stack([m[4] for m in members]) & ok_naive).any(0)
        tie_corr = (np.stack([m[5] for m in members]) & ok_corr).any(0)
        runs = {}
        for name, ok in (("naive", ok_naive), ("corrected", ok_corr)):
            masks = ok[:, labels].T
            key = masks.tobytes()
            if key not in runs:
                fn = ccs_mean_functional(labels, sizes_of, masks)
                runs[key] = rc.corrected_metrics(cells, fn, bounds=(0.0, 100.0), **options)
            runs[name] = runs[key]
        for i, j in enumerate(labels):
            naive, corr = runs["naive"][i], runs["corrected"][i]
            res = {**corr, **{c: naive[c] for c in ("naive", "naive_low", "naive_high")}}
            records.append(
                {"model": ALL, "role": role, "condition": ALL, "cohort": cohort,
                 "dimension": dim, "label": members[0][0][0].labels[j],
                 **withhold_ties(res, tie_naive[j], tie_corr[j])}
            )  # fmt: skip
    return with_reasons(ct.metric_frame(records, TABLE_KEYS, "ccs_mean"), records)


def _defined(counts: np.ndarray, min_count: int) -> np.ndarray:
    """CCS's support rule on (labels, 3) counts: seen in all three conditions and at least
    ``min_count`` times in total (contextbias.ccs.ccs_table)."""
    return (counts > 0).all(-1) & (counts.sum(-1) >= min_count - 1e-9)


def _ccs_table(cells: dict, min_count: int, options: dict) -> tuple[pl.DataFrame, dict]:
    """The ``ccs`` rows: per model x role x cohort x dimension with its three condition
    cells, every label whose CCS is defined on the reader's or the corrected counts, all of
    them from one bootstrap of the three cells (reader_correction.corrected_metrics; each
    label as corrected_metric would give it); NaN where a reading's own counts fail the
    support rule (:func:`_undefine`). Also each role x cohort x dimension's generators:
    (their three cells, n_c, the labels defined on the reader's and on the corrected
    counts), for :func:`_ccs_mean_table`."""
    share_opts = {k: options[k] for k in ("lam", "off_simplex", "fixed_strata") if k in options}
    by_role: dict[tuple, dict] = {}
    for (model, role, condition, cohort, dim), cell in cells.items():
        by_role.setdefault((model, role, cohort, dim), {})[condition] = cell
    records, masks, by_key = [], [], {}
    for (model, role, cohort, dim), conds in sorted(by_role.items()):
        if set(conds) != set(CONDITIONS):
            continue
        three = [conds[c] for c in CONDITIONS]
        sizes = np.array([c.stratum.size for c in three], dtype=float)
        naive = np.stack([c.reader.sum(0) for c in three], -1)
        corr = np.stack([rc.cell_shares(c, **share_opts)["corrected"] for c in three], -1)
        ok_naive, ok_corr = _defined(naive, min_count), _defined(corr * sizes, min_count)
        labels = np.flatnonzero(ok_naive | ok_corr)
        ties = np.zeros((2, ok_naive.size), dtype=bool)
        if labels.size:
            results, ties[0, labels], ties[1, labels] = ccs_ties(three, labels, sizes, options)
        by_key.setdefault((role, cohort, dim), []).append(
            (three, sizes, ok_naive, ok_corr, ties[0], ties[1])
        )
        for j, res in zip(labels, results if labels.size else [], strict=True):
            records.append(
                {"model": model, "role": role, "condition": ALL, "cohort": cohort,
                 "dimension": dim, "label": three[0].labels[j],
                 **withhold_ties(res, ties[0, j], ties[1, j])}
            )  # fmt: skip
            masks.append((ok_naive[j], ok_corr[j]))
    table = with_reasons(ct.metric_frame(records, TABLE_KEYS, "ccs"), records)
    return _undefine(table, np.array(masks, dtype=bool).reshape(-1, 2)), by_key


def _undefine(table: pl.DataFrame, masks: np.ndarray) -> pl.DataFrame:
    """NaN where CCS is undefined: naive and its interval where the reader's counts fail the
    support rule, corrected, estimate_bc and their interval where the corrected counts do."""
    naive, corr = pl.Series(masks[:, 0]), pl.Series(masks[:, 1])
    return table.with_columns(
        *[pl.when(naive).then(pl.col(c)).otherwise(np.nan).alias(c)
          for c in ("naive", "naive_low", "naive_high")],
        *[pl.when(corr).then(pl.col(c)).otherwise(np.nan).alias(c)
          for c in ("corrected", "estimate_bc", "ci_low", "ci_high")],
    )  # fmt: skip


def _pooled_rows(cells: dict, k_of: dict, single_label_bi: float) -> list:
    """metric_table rows of pooled BI per model x condition x cohort x dimension over the
    role cells kept; K = max(K of k_definition, the labels seen in the pooled cells)."""
    groups: dict[tuple, list] = {}
    for (model, _role, condition, cohort, dim), cell in sorted(cells.items()):
        groups.setdefault((model, condition, cohort, dim), []).append(cell)
    rows = []
    for (model, condition, cohort, dim), part in groups.items():
        seen = np.zeros(len(part[0].labels), dtype=bool)
        for cell in part:
            seen |= cell.reader.any(0) | cell.human.any(0)
        k = max(k_of.get((model, dim), 0), int(seen.sum()), 1)
        sizes = np.array([c.stratum.size for c in part], dtype=float)
        key = {"model": model, "role": ALL, "condition": condition, "cohort": cohort,
               "dimension": dim, "label": None, "k": k}  # fmt: skip
        rows.append((key, part, pooled_functional(sizes, k, single_label_bi), (0.0, 1.0)))
    return rows


def _summary_records(m: dict, cohort_cells: list, overall: str, options: dict, key: dict) -> list:
    """One bootstrap of a model part ``m`` (corrected_means.model_part): its cohort rows (columns
    ``cohort_cells``) and overall row, the cells of one role drawn jointly; ``key`` the
    rows' model, role and condition."""
    results = rc.corrected_metrics(
        m["cells"], summary_functional(m["pooled"], m["spans"], m["cohorts"], overall),
        column_cells=[*cohort_cells, list(range(len(m["cells"])))], joint=m["joint"],
        bounds=(0.0, 1.0), **options,
    )  # fmt: skip
    return [
        {**key, "cohort": cohort, "dimension": ALL, "label": None, **res}
        for cohort, res in zip([*m["names"], ALL], results, strict=True)
    ]


def _summary_table(rows: list, overall: str, options: dict) -> pl.DataFrame:
    """The ``bi_pooled`` summary rows of the benchmark's bi table: per model x condition the
    cohort rows (dimension "*") and the overall row (cohort "*", dimension "*") over the
    pooled rows' cells (:func:`_pooled_rows`), one bootstrap per model x condition; the
    cells of one role (its dimensions: the same images) drawn jointly
    (reader_correction.corrected_metrics ``joint``), the roles independently; k null. Then
    the ``bi_pooled_mean`` rows (corrected_means.cross_model_rows)."""
    groups: dict[tuple, list] = {}
    for key, part, fn, _ in rows:
        groups.setdefault((key["model"], key["condition"]), []).append((key, part, fn))
    records, by_condition = [], {}
    for (model, condition), dims in groups.items():
        m = model_part(dims)
        by_condition.setdefault(condition, []).append(m)
        spans = m["spans"]
        cols = [[j for d in idx for j in range(spans[d].start, spans[d].stop)]
                for idx in m["cohorts"]]  # fmt: skip
        key = {"model": model, "role": ALL, "condition": condition}
        records += _summary_records(m, cols, overall, options, key)
    summary = ct.metric_frame(records, TABLE_KEYS, "bi_pooled")
    means = cross_model_rows(by_condition, overall, options)
    # the means carry withheld_reason (their rule, corrected_rule); the summary rows none
    table = pl.concat([summary, means], how="diagonal_relaxed")
    return table.with_columns(pl.lit(None, pl.Int64).alias("k"))


def _role_summary_table(rows: list, overall: str, options: dict) -> pl.DataFrame:
    """The ``bi`` summary rows of role-level BI: per model x role x condition the cohort
    rows (dimension "*": the mean of the role's BI over the cohort's dimensions) and the
    overall row (cohort "*", dimension "*": per ``overall``, the mean of the cohort rows or
    of all the dimensions), NaN dimensions left out of every mean (summary_functional, each
    dimension's functional of its one cell), one bootstrap per model x role x condition in
    which the role's dimensions (the same images) share one draw (corrected_metrics
    ``joint``); k null. ``rows``: the ``bi`` rows (key, [cell], functional, bounds)."""
    groups: dict[tuple, list] = {}
    for key, part, fn, _ in rows:
        groups.setdefault((key["model"], key["role"], key["condition"]), []).append((key, part, fn))
    records = []
    for (model, role, condition), dims in sorted(groups.items()):
        m = model_part(dims)  # one cell per dimension: span d is cell d
        key = {"model": model, "role": role, "condition": condition}
        records += _summary_records(m, m["cohorts"], overall, options, key)
    return ct.metric_frame(records, TABLE_KEYS, "bi").with_columns(
        pl.lit(None, pl.Int64).alias("k")
    )


def _bi_rows(cells: dict, k_of: dict, single_label_bi: float) -> list:
    """The ``bi`` rows (key with k, [cell], bi_functional, bounds) of every cell: K =
    max(K of k_definition, the labels extractor or humans gave in the cell, 1)."""
    rows = []
    for key, cell in cells.items():
        seen = int((cell.reader.any(0) | cell.human.any(0)).sum())
        k = max(k_of.get((key[0], key[-1]), 0), seen, 1)
        names = dict(zip([*CELL_KEYS, "dimension"], key, strict=True))
        fn = rc.bi_functional(k=k, single_label_bi=single_label_bi)
        rows.append(({**names, "label": None, "k": k}, [cell], fn, (0.0, 1.0)))
    return rows


def _table(rows: list, metric: str, options: dict) -> pl.DataFrame:
    """metric_table of ``rows`` (keys may carry k) in TABLE_KEYS + METRIC_COLUMNS + k."""
    table = ct.metric_table(
        [({c: v for c, v in key.items() if c != "k"}, *rest) for key, *rest in rows],
        TABLE_KEYS,
        metric,
        **options,
    )
    return table.with_columns(pl.Series("k", [key.get("k") for key, *_ in rows], dtype=pl.Int64))


def corrected_table(
    reader: pl.DataFrame,
    human: pl.DataFrame,
    *,
    k_definition: str = "model",
    single_label_bi: float = 0.0,
    schema: AttributeSchema | None = None,
    min_count: int = 5,
    overall: str = "cohort",
    metrics: tuple[str, ...] = METRICS,
    **options,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(corrected.parquet, the cells left out for want of human labels): per metric of
    ``metrics`` (METRICS) the benchmark's own function of the label shares of the cells whose
    strata have reader_correction.MIN_LABELLED human labels, naive beside corrected (PPI),
    both samples resampled within strata (``options``: reader_correction.corrected_metric's).
    Rows, columns and printing rules: docs/outputs.md (corrected.parquet) and docs/statistics.md
    "Correcting for the reader's errors". Each extractor is corrected on its own."""
    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise ValueError(f"metrics {sorted(unknown)}; allowed: {', '.join(METRICS)}")
    human = hl.check_human_labels(human)
    extractors = (
        reader["extractor"].unique(maintain_order=True).to_list()
        if ("extractor" in reader.columns)
        else [None]
    )
    tables, skipped = [], []
    for extractor in extractors:
        part = reader if extractor is None else reader.filter(pl.col("extractor") == extractor)
        hl.check_human_in_reader(hl.check_human_labels(part, "reader table", reader=True), human)
        part, short = ct.labelled_cells(part, human, CELL_KEYS)
        # the human labels of the cells kept (build_cells wants every one read by them)
        hum = human.join(
            part.select("item_id", "attribute").unique(), on=["item_id", "attribute"], how="semi"
        )
        k_of = _k(part, hum, k_definition, schema)
        cells = rc.build_cells(part, hum, CELL_KEYS)
        parts = []
        rows = _bi_rows(cells, k_of, single_label_bi)
        if "bi" in metrics:
            parts += [_table(rows, "bi", options), _role_summary_table(rows, overall, options)]
        if "bi_pooled" in metrics:
            pooled = _pooled_rows(cells, k_of, single_label_bi)
            parts += [
                _table(pooled, "bi_pooled", options),
                _summary_table(pooled, overall, options),
            ]
        if "bi_role" in metrics:
            parts += [
                role_mean_table(rows, overall, single_label_bi, options),
                generator_means(rows, overall, single_label_bi, options),
            ]
        if "ccs" in metrics or "ccs_mean" in metrics:
            ccs, by_key = _ccs_table(cells, min_count, options)
            parts += [ccs] if "ccs" in metrics else []
            parts += [_ccs_mean_table(by_key, options)] if "ccs_mean" in metrics else []
        # withheld_reason: the CCS rows' (TIE_REASON), null on the others
        table = pl.concat(parts, how="diagonal_relaxed")
        if "withheld_reason" not in table.columns:
            table = table.with_columns(pl.lit(None, pl.String).alias("withheld_reason"))
        if extractor is not None:
            table = table.select(pl.lit(extractor).alias("extractor"), pl.all())
            short = short.select(pl.lit(extractor).alias("extractor"), pl.all())
        tables.append(table)
        skipped.append(short.rename({"attribute": "dimension"}))
    out = pl.concat(tables)
    if not out.height:
        raise ValueError(
            f"human-label table: no cell has {rc.MIN_LABELLED} human-labelled images in "
            f"each of its strata (images of a generator x role x condition, stratum "
            f"'model|role|condition'); label more images"
        )
    return out, pl.concat(skipped)
