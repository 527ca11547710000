"""Step 2 of the canonicalisation of open-vocabulary labels (optional): an LLM reduces each
embedding cluster's canonical label to its core concept (:func:`llm_core_labels`)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from stereolens.contextbias.canonical_clusters import MAPPING_COLUMNS, mapping_frame
from stereolens.contextbias.schema import NOT_LABELS, AttributeSchema
from stereolens.models.registry import ModelSpec
from stereolens.paths import resource
from stereolens.validation import ConfigError, parse_yaml

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = ("contextbias", "canonical_prompt.v1.yaml")


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
            raw = parse_yaml(Path(path).read_text())
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
    return mapping_frame(pl.DataFrame(rows, schema=MAPPING_COLUMNS))


def _answer_cached(
    requests: list,
    spec: ModelSpec,
    llm: Any,
    cache_dir: str | os.PathLike | None,
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
