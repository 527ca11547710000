"""The human sample of the reader correction, designed: the human labels a target width needs,
their Neyman allocation over the strata, the stratified draw with its selection probabilities
and the human-label template (docs/statistics.md, "Designing the human sample")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from scipy import stats

from stereolens.ids import stable_id
from stereolens.metrics.human_labels import (
    HUMAN_COLUMNS,
    NO_LABEL,
    check_human_in_reader,
    check_human_labels,
)
from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE, MIN_LABELLED

FORM_FILES = {
    "form": "form.html",
    "key": "key.parquet",
    "template": "human_labels_template.csv",
    "design": "design.parquet",
}
"""The files of a reader-sample folder with one annotation form (a benchmark's
export_reader_sample)."""
ALLOCATIONS = ("neyman", "proportional")
"""``neyman``: n_h proportional to N_h x S_h, S_h = sqrt(the stratum's disagreement rate)
(Cochran 1977, Sec. 5.5); ``proportional``: n_h proportional to N_h."""
MIN_PILOT_PAIRS = 20
"""Human-labelled item x attribute pairs a pilot stratum needs for its own disagreement
rate; a stratum with fewer takes its generator's pooled rate."""
DESIGN_COLUMNS = {
    "stratum": pl.String,
    "n_items": pl.Int64,
    "disagreement": pl.Float64,
    "n_human": pl.Int64,
    "selection_probability": pl.Float64,
}
"""allocate's per-stratum table: N_h, the disagreement rate used, n_h and n_h / N_h."""


@dataclass(frozen=True)
class Allocation:
    """The human sample of one group of strata (e.g. one generator's items)."""

    strata: pl.DataFrame
    """DESIGN_COLUMNS, one row per stratum."""
    n_human: int
    """Labels to collect, sum of n_h (all items where the width is not reachable)."""
    reachable: bool
    """Whether n_h <= N_h in every stratum reaches the target width."""
    width: float
    """The planned corrected interval's width of a label share over the group's items."""
    naive_width: float
    """The width of the same share's interval from sampling alone (a perfect reader): no
    number of human labels makes the corrected one narrower."""
    floor: int
    """MIN_LABELLED per stratum (at most N_h): the fewest labels the correction runs with."""


def _z(ci: float) -> float:
    return float(stats.norm.ppf(0.5 + ci / 2.0))


def _reader_variance(w: np.ndarray, s2: np.ndarray, n: np.ndarray) -> float:
    """sum_h W_h^2 S_h^2 / n_h (0 where S_h = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.where(s2 > 0, w**2 * s2 / n, 0.0).sum())


def allocate(
    strata: pl.DataFrame,
    target_width: float,
    *,
    share: float = 0.5,
    ci: float = 0.95,
    allocation: str = "neyman",
) -> Allocation:
    """Human labels per stratum of ``strata`` (stratum, n_items, disagreement) for a ``ci``
    corrected interval of width at most ``target_width`` on a label share, from the
    stratified PPI variance with lam = 1: V = share (1 - share) / N + sum_h W_h^2 S_h^2 / n_h
    (S_h^2 the disagreement rate), n spread by ``allocation``, each n_h in [MIN_LABELLED,
    N_h]. With a ``minimum`` column each n_h is raised to reachable_minimum."""
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation {allocation!r}; allowed: {', '.join(ALLOCATIONS)}")
    if not 0.0 < target_width:
        raise ValueError(f"target_width must be positive, got {target_width}")
    missing = [c for c in ("stratum", "n_items", "disagreement") if c not in strata.columns]
    if missing or not strata.height or strata["stratum"].is_duplicated().any():
        raise ValueError(
            f"strata table: needs one row per stratum with stratum, n_items, disagreement "
            f"(lacks {missing})"
        )
    big = strata["n_items"].to_numpy().astype(float)
    s2 = strata["disagreement"].to_numpy().astype(float)
    if (big < 1).any() or (s2 < 0).any() or (s2 > 1).any() or np.isnan(s2).any():
        raise ValueError("strata table: n_items must be >= 1 and disagreement in [0, 1]")
    w = big / big.sum()
    z = _z(ci)
    sampling = share * (1.0 - share) / big.sum()
    room = (target_width / (2.0 * z)) ** 2 - sampling
    a = w * np.sqrt(s2) if allocation == "neyman" else w.copy()
    low = np.minimum(MIN_LABELLED, big)
    n = low.copy()
    fixed = (a <= 0) | (s2 <= 0)  # nothing to learn there: the floor
    reachable = room > 0
    while reachable and not fixed.all():
        free = ~fixed
        left = room - _reader_variance(w[fixed], s2[fixed], n[fixed])
        if left <= 0:
            reachable = False
            break
        with np.errstate(divide="ignore", invalid="ignore"):
            term = np.where(s2[free] > 0, w[free] ** 2 * s2[free] / a[free], 0.0).sum()
        total = a[free].sum() * term / left
        want = np.ceil(total * a[free] / a[free].sum() - 1e-9)
        n[free] = want
        over, under = free & (n > big), free & (n < low)
        if not (over.any() or under.any()):
            break
        n[over], n[under] = big[over], low[under]
        fixed |= over | under
    if not reachable:
        n = big.copy()
    var = sampling + _reader_variance(w, s2, n)
    width = 2.0 * z * float(np.sqrt(var))
    reachable = bool(reachable and width <= target_width * (1.0 + 1e-9))
    if not reachable:
        n = big.copy()
        width = 2.0 * z * float(np.sqrt(sampling + _reader_variance(w, s2, n)))
    if "minimum" in strata.columns:
        n = np.maximum(n, reachable_minimum(strata).to_numpy().astype(float))
        width = 2.0 * z * float(np.sqrt(sampling + _reader_variance(w, s2, n)))
    out = strata.select("stratum", "n_items", "disagreement").with_columns(
        pl.col("n_items").cast(pl.Int64),
        pl.col("disagreement").cast(pl.Float64),
        pl.Series("n_human", n.astype(np.int64)),
        pl.Series("selection_probability", n / big),
    )
    return Allocation(
        strata=out,
        n_human=int(n.sum()),
        reachable=reachable,
        width=width,
        naive_width=2.0 * z * float(np.sqrt(sampling)),
        floor=int(low.sum()),
    )


def disagreement_by_stratum(reader: pl.DataFrame, human: pl.DataFrame) -> pl.DataFrame:
    """A pilot's disagreement rate per stratum: the share of its human-labelled item x
    attribute pairs whose label sets differ from the reader's (its first extractor). Columns
    stratum, n_pairs, n_disagree, disagreement."""
    if "extractor" in reader.columns:
        reader = reader.filter(pl.col("extractor") == reader["extractor"].min())
    reader = check_human_labels(reader, "reader table", reader=True)
    human = check_human_labels(human)
    check_human_in_reader(reader, human)

    def label_sets(frame: pl.DataFrame) -> pl.DataFrame:
        keep = ~pl.col("label").str.strip_chars().str.to_lowercase().is_in(list(NO_LABEL))
        return frame.group_by("item_id", "attribute").agg(
            pl.col("label").filter(keep).unique().sort().str.join("\x1f").alias("labels"),
            pl.col("stratum").first(),
        )

    both = label_sets(human).join(
        label_sets(reader).select("item_id", "attribute", pl.col("labels").alias("read")),
        on=["item_id", "attribute"],
    )
    return (
        both.group_by("stratum")
        .agg(
            pl.len().cast(pl.Int64).alias("n_pairs"),
            (pl.col("labels") != pl.col("read")).sum().cast(pl.Int64).alias("n_disagree"),
        )
        .with_columns((pl.col("n_disagree") / pl.col("n_pairs")).alias("disagreement"))
        .sort("stratum")
    )


def draw_sample(items: pl.DataFrame, design: pl.DataFrame, seed: int = 0) -> pl.DataFrame:
    """The stratified sample: per stratum of ``design`` a simple random sample of n_h of its
    ``items``, seeded by ``seed`` and its name; item_id, stratum, selection_probability."""
    items = items.select("item_id", "stratum").unique()
    if items["item_id"].is_duplicated().any():
        raise ValueError("items: an item has two strata; an item has one stratum")
    rows: list[tuple[str, str, float]] = []
    for stratum, n in design.select("stratum", "n_human").iter_rows():
        ids = sorted(items.filter(pl.col("stratum") == stratum)["item_id"].to_list())
        if n > len(ids) or n < 1:
            raise ValueError(f"stratum {stratum!r}: {n} human labels asked of its {len(ids)} items")
        rng = np.random.default_rng(int(stable_id("reader-sample", seed, stratum), 16))
        pick = sorted(rng.choice(len(ids), size=n, replace=False).tolist())
        rows += [(ids[i], stratum, n / len(ids)) for i in pick]
    schema = {"item_id": pl.String, "stratum": pl.String, "selection_probability": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row").sort("stratum", "item_id")


def label_template(sample: pl.DataFrame, attributes: Sequence[str]) -> pl.DataFrame:
    """The human-label table to fill: HUMAN_COLUMNS per sampled item x attribute, label empty."""
    return (
        sample.select("item_id", "stratum", "selection_probability")
        .join(
            pl.DataFrame({"attribute": list(attributes)}, schema={"attribute": pl.String}),
            how="cross",
        )  # fmt: skip
        .with_columns(pl.lit("").alias("label"))
        .select(list(HUMAN_COLUMNS))
        .cast(HUMAN_COLUMNS)
        .sort("stratum", "item_id", "attribute")
    )


def disagreement_rates(
    reader: pl.DataFrame,
    human: pl.DataFrame,
    strata: pl.DataFrame,
    default: float,
    group: str = "model",
) -> tuple[pl.DataFrame, str]:
    """``strata`` (model, stratum, ...) with a disagreement column from a pilot: per
    attribute the stratum's rate (MIN_PILOT_PAIRS pairs or more), else its generator's
    (``group``) pooled, else the whole pilot's, ``default`` without human labels; the
    largest over the attributes. Returns the table and "pilot" or "default"."""
    if "extractor" in reader.columns:
        reader = reader.filter(pl.col("extractor") == reader["extractor"].min())
    model_of = reader.select("stratum", pl.col(group).alias("model")).unique()
    worst = strata.select("model", "stratum")
    for attribute in sorted(set(human["attribute"])):
        per = disagreement_by_stratum(reader, human.filter(pl.col("attribute") == attribute))
        per = per.join(model_of, on="stratum", how="left")
        own = per.filter(pl.col("n_pairs") >= MIN_PILOT_PAIRS).select(
            "stratum", pl.col("disagreement").alias("_own")
        )
        pooled = per.group_by("model").agg(
            (pl.col("n_disagree").sum() / pl.col("n_pairs").sum()).alias("_model")
        )
        overall = per["n_disagree"].sum() / max(per["n_pairs"].sum(), 1)
        rate = (
            strata.select("model", "stratum")
            .join(own, on="stratum", how="left")
            .join(pooled, on="model", how="left")
            .select(
                "model",
                "stratum",
                pl.coalesce("_own", "_model", pl.lit(float(overall))).alias(attribute),
            )
        )
        worst = worst.join(rate, on=["model", "stratum"], how="left")
    attrs = [c for c in worst.columns if c not in ("model", "stratum")]
    if not attrs:
        return strata.with_columns(pl.lit(float(default)).alias("disagreement")), "default"
    worst = worst.select("model", "stratum", pl.max_horizontal(attrs).alias("disagreement"))
    return strata.join(worst, on=["model", "stratum"], how="left"), "pilot"


def allocate_by_model(
    strata: pl.DataFrame, target_width: float, **options: Any
) -> tuple[pl.DataFrame, list[dict[str, Any]]]:
    """allocate per generator (the target width is that of a label share
    over one generator's images): the per-stratum table (DESIGN_COLUMNS + model) and one
    summary dict per generator (model, n_items, strata, n_human, floor, width,
    naive_width, reachable)."""
    tables, rows = [], []
    for (model,), part in strata.sort("model", "stratum").group_by("model", maintain_order=True):
        got = allocate(part, target_width, **options)
        tables.append(got.strata.select(pl.lit(model).alias("model"), pl.all()))
        rows.append(
            {
                "model": model,
                "n_items": int(part["n_items"].sum()),
                "strata": part.height,
                "n_human": got.n_human,
                "floor": got.floor,
                "width": got.width,
                "naive_width": got.naive_width,
                "reachable": got.reachable,
            }
        )
    return pl.concat(tables), rows


def with_disagreement(
    strata: pl.DataFrame, disagreement: float | pl.DataFrame, on: list[str]
) -> pl.DataFrame:
    """``strata`` with a ``disagreement`` column: one rate for every stratum, or a table's
    rates joined on ``on`` (e.g. disagreement_rates of a pilot), which must give every
    stratum one."""
    if not isinstance(disagreement, pl.DataFrame):
        return strata.with_columns(pl.lit(float(disagreement)).alias("disagreement"))
    rates = disagreement.select(*on, "disagreement").unique()
    strata = strata.join(rates, on=on, how="left")
    lacking = strata.filter(pl.col("disagreement").is_null())
    if lacking.height:
        raise ValueError(
            f"disagreement table: no rate for stratum {lacking['stratum'][0]!r}; give every "
            "stratum of the reader table one"
        )
    return strata


def planned_widths(
    summary: list[dict[str, Any]], target_width: float, group: str = "model"
) -> list[pl.Expr]:
    """target_width, and the planned width and reachable of each group's allocation
    (allocate_by_model's summary, keyed by the ``group`` column), as columns."""
    by_group = {s["model"]: s for s in summary}
    return [
        pl.lit(float(target_width)).alias("target_width"),
        pl.col(group).replace_strict({g: s["width"] for g, s in by_group.items()}).alias("width"),
        pl.col(group)
        .replace_strict({g: s["reachable"] for g, s in by_group.items()})
        .alias("reachable"),
    ]


def reachable_minimum(strata: pl.DataFrame) -> pl.Series:
    """Per stratum the largest of its rows' printing ``minimums`` (else ``minimum``) that
    its items reach, 0 where none."""
    if "minimums" not in strata.columns:
        least = strata.select(pl.col("minimum").fill_null(0)).to_series()
        return pl.Series("reach", np.where(strata["n_items"] >= least, least, 0), pl.Int64)
    rows = strata.select("n_items", "minimums").with_row_index("_i").explode("minimums")
    best = (
        rows.filter(pl.col("minimums") <= pl.col("n_items"))
        .group_by("_i")
        .agg(pl.col("minimums").max().alias("reach"))
    )
    index = pl.DataFrame({"_i": pl.arange(0, strata.height, eager=True).cast(pl.UInt32)})
    joined = index.join(best, on="_i", how="left").sort("_i")
    return joined["reach"].fill_null(0).cast(pl.Int64)


def printable_counts(strata: pl.DataFrame, design: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """Per model of ``strata`` (model, stratum, n_items, minimum: the human labels from
    which the report prints the stratum's rows) and ``design`` (stratum, n_human):
    n_printable (every stratum at its minimum, capped at its items), n_recommended (the
    larger of n_h and :func:`reachable_minimum` per stratum), minimum_min / _max, the strata
    short of items (cells_short, short_reaching, short_items_min) and grow (their largest
    minimum / items ratio)."""
    table = strata.join(design.select("stratum", "n_human"), on="stratum", how="left")
    table = table.with_columns(reachable_minimum(table).alias("_reach"))
    table = table.with_columns(
        pl.max_horizontal(
            pl.min_horizontal("minimum", "n_items"), pl.min_horizontal(MIN_LABELLED, "n_items")
        ).alias("_print"),
        (pl.col("n_items") < pl.col("minimum")).alias("_short"),
    )
    per = table.group_by("model").agg(
        pl.col("_print").sum().alias("n_printable"),
        pl.max_horizontal("_reach", "n_human").sum().alias("n_recommended"),
        pl.col("minimum").filter(pl.col("minimum") > 0).min().alias("minimum_min"),
        pl.col("minimum").max().alias("minimum_max"),
        pl.col("_short").sum().alias("cells_short"),
        (pl.col("_short") & (pl.col("_reach") > 0)).sum().alias("short_reaching"),
        pl.col("n_items").filter("_short").min().alias("short_items_min"),
        (pl.col("minimum") / pl.col("n_items")).filter("_short").max().alias("grow"),
    )
    return {r.pop("model"): r for r in per.iter_rows(named=True)}


def planner_part(
    benchmark: str,
    unit: str,
    section: dict[str, Any],
    strata: pl.DataFrame,
    source: str,
    notes: list[str],
    knob: tuple[str, float] | dict[str, tuple[str, float]] | None = None,
) -> dict[str, Any]:
    """A benchmark's part of stereolens.plan.reader_plan: per model of ``strata`` (model,
    stratum, n_items, disagreement, minimum: default MIN_HUMAN_RELIABLE) allocate_by_model's
    labels for the ``section``'s width (n_human None where unreachable), disagreement_min /
    _max, printable_counts' columns and, with ``knob`` (the config key the items of every
    cell scale with and its value, or one per model), knob and knob_needed; the totals."""
    if "minimum" not in strata.columns:
        strata = strata.with_columns(pl.lit(MIN_HUMAN_RELIABLE).alias("minimum"))
    strata = strata.with_columns(pl.col("minimum").cast(pl.Int64))
    design, rows = allocate_by_model(
        strata.drop("minimum", "minimums", strict=False),
        float(section["target_width"]),
        allocation=section["allocation"],
    )
    printable = printable_counts(strata, design)
    rates = strata.group_by("model").agg(
        pl.col("disagreement").min().alias("lo"), pl.col("disagreement").max().alias("hi")
    )
    span = {m: (lo, hi) for m, lo, hi in rates.iter_rows()}
    for r in rows:
        r["disagreement_min"], r["disagreement_max"] = span[r["model"]]
        r["n_human"] = r["n_human"] if r["reachable"] else None
        p = printable[r["model"]]
        grow = p.pop("grow")
        r.update(p)
        mine = knob.get(r["model"]) if isinstance(knob, dict) else knob
        r["knob"] = None if mine is None else mine[0]
        r["knob_needed"] = (
            int(np.ceil(mine[1] * grow - 1e-9)) if mine is not None and grow is not None else None
        )
    needed = [r["n_human"] for r in rows]
    return {
        "benchmark": benchmark,
        "unit": unit,
        "target_width": float(section["target_width"]),
        "allocation": section["allocation"],
        "disagreement_source": source,
        "rows": rows,
        "n_human": None if None in needed else sum(needed),
        "n_printable": sum(r["n_printable"] for r in rows),
        "n_recommended": sum(r["n_recommended"] for r in rows),
        "notes": notes,
    }
