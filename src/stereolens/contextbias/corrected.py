"""ContextBias Bias Intensity corrected for the extractor's errors from a human-labelled
sample (stereolens.metrics.reader_correction; docs/statistics.md, "Correcting for the
reader's errors"): the reader table from the canonical attributes, BI per role x condition x
dimension as the benchmark defines it (1 - H / log K of the label shares), naive beside
corrected."""

from __future__ import annotations

import polars as pl

from stereolens.contextbias.metrics import image_universe
from stereolens.contextbias.schema import AttributeSchema
from stereolens.metrics import corrected_tables as ct
from stereolens.metrics import reader_correction as rc

KEYS = ("model", "role", "condition", "cohort", "dimension")
"""The key columns of a ContextBias corrected row (``extractor`` first when the attributes
table has one); the metric is ``bi``, the role-level BI of paper Sec. 3.5."""
CELL_KEYS = ("model", "role", "condition", "cohort")
"""The reader table's cell columns (attribute = the dimension)."""


def stratum_of() -> pl.Expr:
    """An image's sampling stratum: generator x role x condition, "model|role|condition"
    (the annotation form's sets; a human-label table uses the same strings)."""
    return pl.concat_str("model", "role", "condition", separator="|")


def reader_table(attributes: pl.DataFrame, images: pl.DataFrame | None = None) -> pl.DataFrame:
    """The reader table (reader_correction.READER_COLUMNS, plus extractor, model, role,
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
    return table.select(*gkeys, "role", "condition", "cohort", *rc.READER_COLUMNS).sort(
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
    ).filter(~pl.col("label").str.strip_chars().str.to_lowercase().is_in(list(rc.NO_LABEL)))
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


def corrected_bi(
    reader: pl.DataFrame,
    human: pl.DataFrame,
    *,
    k_definition: str = "model",
    single_label_bi: float = 0.0,
    schema: AttributeSchema | None = None,
    **options,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the corrected table: KEYS (extractor first if any) + reader_correction.METRIC_COLUMNS
    + k, one row per (extractor,) model x role x condition x dimension whose strata have
    reader_correction.MIN_LABELLED human labels; the cells left out for want of them).
    BI = reader_correction.bi_functional (metrics.entropy.bias_intensity's definition) of
    the shares with K = max(K of ``k_definition``, the labels extractor or humans gave in
    the cell). ``options``: corrected_metric's (replicates, seed, lam, off_simplex, ...).
    Each extractor is corrected on its own (the human labels are the same images')."""
    human = rc.check_human_labels(human)
    extractors = (
        reader["extractor"].unique(maintain_order=True).to_list()
        if ("extractor" in reader.columns)
        else [None]
    )
    tables, skipped = [], []
    for extractor in extractors:
        part = reader if extractor is None else reader.filter(pl.col("extractor") == extractor)
        rc.check_human_in_reader(rc.check_human_labels(part, "reader table", reader=True), human)
        part, short = ct.labelled_cells(part, human, CELL_KEYS)
        # the human labels of the cells kept (build_cells wants every one read by them)
        hum = human.join(
            part.select("item_id", "attribute").unique(), on=["item_id", "attribute"], how="semi"
        )
        k_of = _k(part, hum, k_definition, schema)
        rows = []
        for key, cell in rc.build_cells(part, hum, CELL_KEYS).items():
            seen = int((cell.reader.any(0) | cell.human.any(0)).sum())
            k = max(k_of.get((key[0], key[-1]), 0), seen, 1)
            names = dict(zip([*CELL_KEYS, "dimension"], key, strict=True))
            fn = rc.bi_functional(k=k, single_label_bi=single_label_bi)
            rows.append(({**names, "k": k}, [cell], fn, (0.0, 1.0)))
        table = ct.metric_table(
            [({c: v for c, v in key.items() if c != "k"}, *rest) for key, *rest in rows],
            KEYS,
            "bi",
            **options,
        ).with_columns(pl.Series("k", [key["k"] for key, *_ in rows], dtype=pl.Int64))
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
