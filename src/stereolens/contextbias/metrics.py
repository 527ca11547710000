"""ContextBias metrics on the long attributes table: Bias Intensity (paper Eq. 1) pooled over
roles and per role (inputs and definitions: docs/methods.md, docs/outputs.md)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import polars as pl

from stereolens.contextbias.schema import AttributeSchema
from stereolens.contextbias.settings import ContextBiasSettings
from stereolens.metrics.entropy import SINGLE_LABEL_BI, bias_intensity

REQUIRED = ("model", "role", "condition", "image_id", "cohort", "dimension", "label")
K_DEFINITIONS = ("model", "cell", "vocabulary")
OVERALL_DEFINITIONS = ("cohort", "dimension")
"""How the overall ("*", "*") value is formed: "cohort" = the mean of the cohort means, each
cohort weighing the same (paper Tables 8 and 10, the released headline bootstrap; default);
"dimension" = the mean of all dimensions (People, 21 of 30 dimensions, then weighs 70%)."""
CONDITIONS = ("CF", "CA-R", "CA-U")
AGGREGATIONS = ("pooled", "role", "role_matched", "role_miller_madow")
BI_COLUMNS = [
    "model",
    "cohort",
    "dimension",
    "condition",
    "aggregation",
    "bi",
    "n_images",
    "k",
    "k_definition",
    "overall_definition",
]
ALL = "*"
"""Marks a summary row: model "*" = mean over models, cohort/dimension "*" = all of them."""


def nanmean(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    """np.nanmean without its all-NaN RuntimeWarning: an all-NaN slice's mean is NaN."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(values, axis=axis)


def check_attributes(attributes: pl.DataFrame, source: str = "attributes table") -> None:
    missing = [c for c in REQUIRED if c not in attributes.columns]
    if missing:
        raise ValueError(
            f"{source} lacks columns {missing}; it needs {list(REQUIRED)} "
            "(one row per image x dimension x label)"
        )
    bad = attributes.filter(
        pl.col("label").is_null()
        | pl.col("label").str.to_lowercase().is_in(["unknown", "none", ""])
    )
    if bad.height:
        raise ValueError(
            f"{source} has {bad.height} rows whose label is unknown, none, empty "
            "or null; drop them (they are never counted)"
        )


def check_conditions(attributes: pl.DataFrame, source: str = "attributes table") -> None:
    """The label-level analyses compare the paper's three conditions by name."""
    other = sorted(set(attributes["condition"].unique().to_list()) - set(CONDITIONS))
    if other:
        raise ValueError(
            f"{source} has conditions {other}; the ContextBias analyses know only "
            f"{', '.join(CONDITIONS)}"
        )


def check_bi_options(k_definition: str, overall: str, single_label_bi: float) -> None:
    if k_definition not in K_DEFINITIONS:
        raise ValueError(f"k_definition {k_definition!r}; allowed: {', '.join(K_DEFINITIONS)}")
    if overall not in OVERALL_DEFINITIONS:
        raise ValueError(f"overall {overall!r}; allowed: {', '.join(OVERALL_DEFINITIONS)}")
    if single_label_bi not in SINGLE_LABEL_BI:
        raise ValueError(f"single_label_bi {single_label_bi!r}; allowed: 0 or 1")


def _group_keys(attributes: pl.DataFrame) -> list[str]:
    return (["extractor"] if "extractor" in attributes.columns else []) + ["model"]


def image_counts(attributes: pl.DataFrame, images: pl.DataFrame | None) -> pl.DataFrame:
    """Images extracted per (extractor,) model, condition: the denominator n.

    From the images table (status ok) when given, else the distinct images in the
    attributes table (an image with no label at all is then missed)."""
    keys = _group_keys(attributes) + ["condition"]
    if images is not None:
        src = images.filter(pl.col("status") == "ok") if "status" in images.columns else images
        counts = src.group_by([k for k in keys if k in src.columns]).agg(
            pl.col("image_id").n_unique().alias("n_images")
        )
        if "extractor" in keys and "extractor" not in counts.columns:
            # an images table without extractor: every image counts for every extractor
            counts = counts.join(attributes.select("extractor").unique(), how="cross")
        return counts
    return attributes.group_by(keys).agg(pl.col("image_id").n_unique().alias("n_images"))


def image_universe(
    attributes: pl.DataFrame, images: pl.DataFrame | None = None, extra: Sequence[str] = ()
) -> pl.DataFrame:
    """One row per extracted image: (extractor,) model, role, condition, image_id and the
    ``extra`` columns (e.g. variant, prompt_id). The per-role denominators n_{r,c}.

    From the images table (status ok) when given. Columns the images table lacks are taken
    from the attributes table: ``extractor`` (every image counts for every extractor), and
    ``role`` or an extra column by image_id (images without any label are then missed).
    Without an images table: the distinct images of the attributes table."""
    gkeys = _group_keys(attributes)
    cols = [*gkeys, "role", "condition", "image_id", *extra]
    lacking = [c for c in cols if c not in attributes.columns and c != "extractor"]
    if images is None:
        if lacking:
            raise ValueError(f"attributes table lacks columns {lacking}")
        return attributes.select(cols).unique()
    need = [c for c in ("model", "condition", "image_id") if c not in images.columns]
    if need:
        raise ValueError(f"images table lacks columns {need}; it needs model, condition, image_id")
    src = images.filter(pl.col("status") == "ok") if "status" in images.columns else images
    have = [c for c in cols if c in src.columns]
    src = src.select(have).unique()
    if "extractor" in gkeys and "extractor" not in have:
        src = src.join(attributes.select("extractor").unique(), how="cross")
    missing = [c for c in cols if c not in src.columns]
    if missing:
        if any(c not in attributes.columns for c in missing):
            raise ValueError(f"neither the images nor the attributes table has {missing}")
        keys = gkeys + ["image_id"]
        lookup = attributes.select(keys + missing).unique(subset=keys)
        src = src.join(lookup, on=keys, how="inner")
    return src.select(cols).unique()


def _dimension_k(
    attributes: pl.DataFrame, k_definition: str, schema: AttributeSchema | None
) -> pl.DataFrame:
    """K per (extractor,) model x dimension for the 'model' and 'vocabulary' definitions
    (column k, Int64); null under 'cell', where K is the number of labels in each cell."""
    gkeys = _group_keys(attributes)
    k = attributes.group_by(gkeys + ["dimension"]).agg(
        pl.col("label").n_unique().cast(pl.Int64).alias("k")
    )
    if k_definition == "cell":
        return k.with_columns(pl.lit(None, pl.Int64).alias("k"))
    if k_definition == "vocabulary":
        vocab = (schema or AttributeSchema.load()).vocabulary()
        closed = {d: v for d, v in vocab.items() if v}
        seen = (
            attributes.filter(pl.col("dimension").is_in(list(closed)))
            .select("dimension", "label")
            .unique()
        )
        for dim, labels in seen.group_by("dimension").agg("label").iter_rows():
            outside = set(labels) - set(closed[dim])
            if outside:
                raise ValueError(
                    f"dimension {dim} has labels outside the schema vocabulary "
                    f"({sorted(outside)[:5]}); use metrics.k_definition: model"
                )
        sizes = pl.DataFrame(
            {"dimension": list(closed), "k_vocab": [len(v) for v in closed.values()]},
            schema={"dimension": pl.String, "k_vocab": pl.Int64},
        )
        k = k.join(sizes, on="dimension", how="left").select(
            *gkeys, "dimension", pl.coalesce("k_vocab", "k").alias("k")
        )
    return k


def bi_from_parts(
    total: np.ndarray,
    xlogx: np.ndarray,
    n_labels: np.ndarray,
    k: np.ndarray,
    miller_madow: bool = False,
    single_label_bi: float = 0.0,
) -> np.ndarray:
    """BI = 1 - H / log K, elementwise over cells given their parts: total N = sum c,
    xlogx = sum c log c, n_labels m = labels with positive count, K.

    H = log N - xlogx / N is the plug-in entropy of p = c / N (equal to
    :func:`stereolens.metrics.entropy.bias_intensity`); ``miller_madow`` adds
    (m - 1) / (2N). BI is ``single_label_bi`` where K == 1 and NaN for empty cells. The
    Miller-Madow value is not clipped: it can fall below 0 when the corrected entropy
    exceeds log K."""
    total = np.asarray(total, dtype=float)
    n_labels = np.asarray(n_labels, dtype=float)
    k = np.asarray(k, dtype=float)
    filled = total > 0
    if np.any(filled & (k < n_labels)):
        raise ValueError("K is smaller than the number of labels observed in a cell")
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.maximum(np.log(total) - np.asarray(xlogx, dtype=float) / total, 0.0)
        if miller_madow:
            h = h + (n_labels - 1.0) / (2.0 * total)
        bi = 1.0 - h / np.log(k)
    bi = np.where(k == 1, float(single_label_bi), bi)
    return np.where(filled, bi, np.nan)


def pooled_bi(
    attributes: pl.DataFrame,
    images: pl.DataFrame | None = None,
    k_definition: str = "model",
    schema: AttributeSchema | None = None,
    *,
    overall: str = "cohort",
    single_label_bi: float = 0.0,
) -> pl.DataFrame:
    """BI per (extractor,) model x dimension x condition over label counts pooled across
    roles (aggregation "pooled"), plus cohort rows (dimension "*": mean of the cohort's
    dimensions) and overall rows (cohort "*", dimension "*": per ``overall``, the mean of
    the cohort rows or of all dimensions). A cell with K == 1 has BI ``single_label_bi``."""
    check_bi_options(k_definition, overall, single_label_bi)
    check_attributes(attributes)
    gkeys = _group_keys(attributes)
    cell = gkeys + ["cohort", "dimension", "condition"]
    counts = attributes.group_by(cell + ["label"]).agg(pl.len().alias("count"))
    k_model = attributes.group_by(gkeys + ["dimension"]).agg(
        pl.col("label").n_unique().alias("k_model")
    )
    vocab = (schema or AttributeSchema.load()).vocabulary()
    rows = []
    cells = (
        counts.group_by(cell)
        .agg(pl.col("count"), pl.col("label"))
        .join(k_model, on=gkeys + ["dimension"])
    )
    for r in cells.iter_rows(named=True):
        if k_definition == "cell":
            k = len(r["count"])
        elif k_definition == "vocabulary" and vocab.get(r["dimension"]):
            k = len(vocab[r["dimension"]])
            outside = set(r["label"]) - set(vocab[r["dimension"]])
            if outside:
                raise ValueError(
                    f"dimension {r['dimension']} has labels outside the schema "
                    f"vocabulary ({sorted(outside)[:5]}); use metrics.k_definition: model"
                )
        else:
            k = r["k_model"]
        bi = bias_intensity(r["count"], k, single_label_bi=single_label_bi)
        rows.append({**{c: r[c] for c in cell}, "bi": bi, "k": k})
    schema_cols = {**{c: pl.String for c in cell}, "bi": pl.Float64, "k": pl.Int64}
    dims = pl.DataFrame(rows, schema=schema_cols).with_columns(pl.col("bi").fill_nan(None))
    dims = dims.join(image_counts(attributes, images), on=gkeys + ["condition"], how="left")
    return _with_summary_rows(dims, gkeys, "pooled", k_definition, overall)


def _with_summary_rows(
    dims: pl.DataFrame, gkeys: list[str], aggregation: str, k_definition: str, overall: str
) -> pl.DataFrame:
    """Dimension rows plus cohort rows (dimension "*", mean of the cohort's dimensions) and
    overall rows (cohort "*"): the mean of the cohort rows (``overall`` "cohort") or of all
    dimensions ("dimension"), in the BI_COLUMNS layout. Empty (null) cells are left out of
    every mean."""
    cohorts = (
        dims.group_by(gkeys + ["cohort", "condition"])
        .agg(pl.col("bi").mean(), pl.col("n_images").first())
        .with_columns(pl.lit(ALL).alias("dimension"), pl.lit(None, pl.Int64).alias("k"))
    )
    source = cohorts if overall == "cohort" else dims
    totals = (
        source.group_by(gkeys + ["condition"])
        .agg(pl.col("bi").mean(), pl.col("n_images").first())
        .with_columns(
            pl.lit(ALL).alias("cohort"),
            pl.lit(ALL).alias("dimension"),
            pl.lit(None, pl.Int64).alias("k"),
        )
    )
    cols = gkeys + ["cohort", "dimension", "condition", "bi", "n_images", "k"]
    out = pl.concat([dims.select(cols), cohorts.select(cols), totals.select(cols)])
    out = out.with_columns(
        pl.lit(aggregation).alias("aggregation"),
        pl.lit(k_definition).alias("k_definition"),
        pl.lit(overall).alias("overall_definition"),
        pl.col("n_images").cast(pl.Int64),
        pl.col("k").cast(pl.Int64),
    )
    order = (["extractor"] if "extractor" in gkeys else []) + BI_COLUMNS
    return out.select(order).sort(gkeys + ["cohort", "dimension", "condition"])


def role_bi(
    attributes: pl.DataFrame,
    images: pl.DataFrame | None = None,
    k_definition: str = "model",
    schema: AttributeSchema | None = None,
    matched_draws: int = 20,
    seed: int = 0,
    *,
    overall: str = "cohort",
    single_label_bi: float = 0.0,
) -> pl.DataFrame:
    """BI computed per role x dimension x condition, then averaged over roles (paper Sec. 3.5
    BI^role, App. E.2), in three aggregations:

    - "role": plug-in BI per role on all of the role's images;
    - "role_miller_madow": the same with H_MM = H + (m - 1) / (2N) (m = labels with a
      positive count in the role cell, N = their total count);
    - "role_matched": at matched support. For each role, every condition cell is subsampled
      (without replacement, images, not labels) to the smallest image count that role has
      among the conditions it has images in; BI per role cell is averaged over
      ``matched_draws`` seeded draws, then over roles.

    K follows ``k_definition`` as in :func:`pooled_bi` ('model': the model x dimension label
    grid of the full data; 'cell': labels seen in the role cell, of the subsample for
    "role_matched"). A role without any label of a dimension in a condition does not enter
    that average. Columns as :func:`pooled_bi`; n_images = images of the model and
    condition ("role_matched": the subsampled images, summed over roles); k = the
    dimension's K, null under 'cell' (it varies by role) and on "*" rows. ``overall`` and
    ``single_label_bi`` as in :func:`pooled_bi`."""
    check_bi_options(k_definition, overall, single_label_bi)
    if matched_draws < 1:
        raise ValueError(f"matched_draws must be at least 1, got {matched_draws}")
    check_attributes(attributes)
    gkeys = _group_keys(attributes)
    kdim = _dimension_k(attributes, k_definition, schema)
    cell = gkeys + ["role", "cohort", "dimension", "condition"]
    parts = (
        attributes.group_by(cell + ["label"])
        .agg(pl.len().cast(pl.Float64).alias("c"))
        .group_by(cell)
        .agg(
            pl.col("c").sum().alias("total"),
            (pl.col("c") * pl.col("c").log()).sum().alias("xlogx"),
            pl.len().alias("m"),
        )
        .join(kdim, on=gkeys + ["dimension"], how="left")
    )
    k = parts["k"].fill_null(parts["m"]).to_numpy()
    args = (parts["total"].to_numpy(), parts["xlogx"].to_numpy(), parts["m"].to_numpy(), k)
    parts = parts.with_columns(
        pl.Series("bi_role", bi_from_parts(*args, single_label_bi=single_label_bi)),
        pl.Series(
            "bi_mm", bi_from_parts(*args, miller_madow=True, single_label_bi=single_label_bi)
        ),
    )
    n_all = image_counts(attributes, images)
    dim_keys = gkeys + ["cohort", "dimension", "condition"]
    kcol = kdim.rename({"k": "k_dim"})
    out = []
    for col, aggregation in (("bi_role", "role"), ("bi_mm", "role_miller_madow")):
        dims = (
            parts.group_by(dim_keys)
            .agg(pl.col(col).fill_nan(None).mean().alias("bi"))
            .join(n_all, on=gkeys + ["condition"], how="left")
            .join(kcol, on=gkeys + ["dimension"], how="left")
            .rename({"k_dim": "k"})
        )
        out.append(_with_summary_rows(dims, gkeys, aggregation, k_definition, overall))
    universe = image_universe(attributes, images)
    matched, n_matched = _matched_role_bi(
        attributes, universe, gkeys, kdim, matched_draws, seed, single_label_bi
    )
    dims = (
        matched.group_by(dim_keys)
        .agg(pl.col("bi").fill_nan(None).mean())
        .join(n_matched, on=gkeys + ["condition"], how="left")
        .join(kcol, on=gkeys + ["dimension"], how="left")
        .rename({"k_dim": "k"})
    )
    out.append(_with_summary_rows(dims, gkeys, "role_matched", k_definition, overall))
    return pl.concat(out)


def _matched_role_bi(
    attributes: pl.DataFrame,
    universe: pl.DataFrame,
    gkeys: list[str],
    kdim: pl.DataFrame,
    draws: int,
    seed: int,
    single_label_bi: float = 0.0,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per role cell BI averaged over ``draws`` matched-support subsamples, and the matched
    image count per (extractor,) model x condition."""
    rc = gkeys + ["role", "condition"]
    uni = (
        universe.select(rc + ["image_id"])
        .sort(rc + ["image_id"])
        .with_columns(pl.struct(rc).rle_id().cast(pl.Int64).alias("g"))
    )
    size = uni.group_by(rc + ["g"]).agg(pl.len().alias("size"))
    size = size.with_columns(pl.col("size").min().over(gkeys + ["role"]).alias("target"))
    size = size.sort("g")
    g = uni["g"].to_numpy()
    n_img = g.size
    start = np.searchsorted(g, np.arange(size.height))
    target = size["target"].to_numpy()
    # Sorting g + u (u uniform in [0, 1)) shuffles each group in place; an image is kept
    # when its position inside its group is below the group's target size.
    rng = np.random.default_rng(seed)
    u = rng.random((draws, n_img))
    order = np.argsort(g[None, :] + u, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(n_img) - start[g], order.shape), 1)
    keep = rank < target[g][None, :]

    cell = gkeys + ["role", "cohort", "dimension", "condition"]
    rows = attributes.select(
        gkeys + ["image_id", "role", "cohort", "dimension", "condition", "label"]
    )
    rows = rows.join(
        uni.select(gkeys + ["image_id"]).with_row_index("u"), on=gkeys + ["image_id"], how="inner"
    )
    # one row per (role cell, label) with the images carrying it; cells numbered by a join
    # (sorting this many string keys costs more than the whole subsampling)
    keyed = rows.group_by(cell + ["label"]).agg(pl.col("u"))
    cells = keyed.select(cell).unique().with_row_index("cell")
    keyed = keyed.join(cells, on=cell, how="left")
    cell_of_key = keyed["cell"].to_numpy().astype(np.int64)
    n_keys, n_cells = keyed.height, cells.height
    key_of_row = np.repeat(np.arange(n_keys), keyed["u"].list.len().to_numpy())
    u_of_row = keyed["u"].explode().to_numpy()
    cells = cells.join(kdim, on=gkeys + ["dimension"], how="left").sort("cell")
    k_fixed = cells["k"].to_numpy(allow_copy=True).astype(float)  # NaN under 'cell'
    acc = np.zeros(n_cells)
    n_ok = np.zeros(n_cells)
    for d in range(draws):  # a handful of draws; each is vectorised over all cells
        c = np.bincount(key_of_row[keep[d, u_of_row]], minlength=n_keys).astype(float)
        total = np.bincount(cell_of_key, c, minlength=n_cells)
        xlogx = np.bincount(cell_of_key, c * np.log(np.where(c > 0, c, 1.0)), minlength=n_cells)
        m = np.bincount(cell_of_key, c > 0, minlength=n_cells)
        k = np.where(np.isnan(k_fixed), m, k_fixed)
        bi = bi_from_parts(total, xlogx, m, k, single_label_bi=single_label_bi)
        ok = ~np.isnan(bi)
        acc[ok] += bi[ok]
        n_ok += ok
    with np.errstate(invalid="ignore"):
        mean = acc / n_ok
    matched = cells.select(cell).with_columns(pl.Series("bi", mean))
    n_matched = (
        size.group_by(gkeys + ["role"])
        .agg(pl.col("condition"), pl.col("target").first())
        .explode("condition")
        .group_by(gkeys + ["condition"])
        .agg(pl.col("target").sum().cast(pl.Int64).alias("n_images"))
    )
    return matched, n_matched


def cross_model_rows(bi: pl.DataFrame) -> pl.DataFrame:
    """Model "*" rows: per (extractor,) aggregation x cohort x dimension x condition the mean
    BI over models and the summed n_images (k null)."""
    keys = (["extractor"] if "extractor" in bi.columns else []) + [
        "aggregation",
        "k_definition",
        "overall_definition",
        "cohort",
        "dimension",
        "condition",
    ]
    out = (
        bi.filter(pl.col("model") != ALL)
        .group_by(keys)
        .agg(pl.col("bi").mean(), pl.col("n_images").sum().cast(pl.Int64))
        .with_columns(pl.lit(ALL).alias("model"), pl.lit(None, pl.Int64).alias("k"))
    )
    return out.select(bi.columns)


def bi_table(
    attributes: pl.DataFrame,
    images: pl.DataFrame | None = None,
    schema: AttributeSchema | None = None,
    settings: ContextBiasSettings | None = None,
) -> pl.DataFrame:
    """Everything bi.parquet holds: :func:`pooled_bi` (aggregation "pooled") and
    :func:`role_bi` ("role", "role_matched", "role_miller_madow"), each with model "*" rows
    (mean over models), sorted by aggregation in that order, then model, cohort, dimension,
    condition; ``settings`` (None: the "paper" preset) as in :func:`pooled_bi`."""
    s = settings or ContextBiasSettings.preset()
    opts = {"overall": s.overall, "single_label_bi": s.single_label_bi}
    pooled = pooled_bi(attributes, images, k_definition=s.k_definition, schema=schema, **opts)
    role = role_bi(attributes, images, s.k_definition, schema, s.matched_draws, s.seed, **opts)
    per_model = pl.concat([pooled, role.select(pooled.columns)])
    out = pl.concat([per_model, cross_model_rows(per_model)])
    rank = {a: i for i, a in enumerate(AGGREGATIONS)}
    gkeys = _group_keys(attributes)
    return (
        out.with_columns(pl.col("aggregation").replace_strict(rank).alias("_a"))
        .sort(["_a"] + gkeys + ["cohort", "dimension", "condition"])
        .drop("_a")
    )


def use_label_column(attributes, column: str):
    """The table with ``label`` taken from ``column`` ("auto" = canonical_label when the
    table has it, else label), one row per image x dimension x label."""
    if column == "auto":
        column = "canonical_label" if "canonical_label" in attributes.columns else "label"
    if column not in attributes.columns:
        raise ValueError(f"--label-column {column!r} is not a column of the attributes table")
    if column == "label":
        return attributes
    keys = [c for c in attributes.columns if c not in ("label", column)]
    return (
        attributes.with_columns(pl.col(column).alias("label"))
        .drop(column)
        .unique(subset=[*keys, "label"], keep="first", maintain_order=True)
    )
