"""The ContextBias attribute schema (paper Table 6) and what follows from it:
the JSON schema a VLM answers in, validation of an answer, and flattening an
answer to (dimension, label) pairs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from stereolens.paths import resource
from stereolens.validation import parse_yaml
from stereolens.vocabulary import vocabulary_key

NOT_LABELS = frozenset({"unknown", "none", ""})
"""Never counted as labels (REFERENCE.md: unknown, none and empty are never counted)."""

DEFAULT_SCHEMA = ("contextbias", "attribute_schema.v1.yaml")

# Bounds that keep a constrained decoder finite; a real answer stays far inside them.
MAX_PEOPLE = 6
MAX_LIST_ITEMS = 8
MAX_OPEN_LABEL_CHARS = 60


@dataclass(frozen=True)
class Dimension:
    cohort: str
    name: str
    kind: str  # scalar | list | identifier
    vocabulary: tuple[str, ...] | None  # None = open vocabulary
    per_person: bool

    @property
    def counted(self) -> bool:
        return self.kind != "identifier"


class AttributeSchema:
    """A loaded, versioned attribute schema."""

    def __init__(self, raw: dict[str, Any], source: str):
        self.source = source
        try:
            self.version = str(raw["version"])
            dims = []
            for cohort, body in raw["cohorts"].items():
                per_person = bool(body.get("per_person", False))
                for name, d in body["dimensions"].items():
                    vocab = d.get("vocabulary")
                    dims.append(
                        Dimension(
                            cohort,
                            name,
                            d["kind"],
                            tuple(map(str, vocab)) if vocab else None,
                            per_person,
                        )
                    )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"attribute schema {source} is malformed ({exc!r}); "
                "see attribute_schema.v1.yaml for the layout"
            ) from exc
        self.dimensions: tuple[Dimension, ...] = tuple(dims)
        self.cohorts: tuple[str, ...] = tuple(dict.fromkeys(d.cohort for d in dims))

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> AttributeSchema:
        path = Path(path) if path else resource(*DEFAULT_SCHEMA)
        return cls(parse_yaml(Path(path).read_text()), str(path))

    @property
    def counted_dimensions(self) -> tuple[Dimension, ...]:
        return tuple(d for d in self.dimensions if d.counted)

    def cohort_of(self) -> dict[str, str]:
        return {d.name: d.cohort for d in self.dimensions}

    def vocabulary(self) -> dict[str, tuple[str, ...] | None]:
        """Countable labels per dimension (unknown/none removed); None = open."""
        return {
            d.name: (
                tuple(v for v in d.vocabulary if v not in NOT_LABELS) if d.vocabulary else None
            )
            for d in self.counted_dimensions
        }

    def table_vocabularies(self, hint: str = "give --schema for another") -> tuple:
        """The closed vocabularies of an attributes table under this schema
        (stereolens.tables.Vocabulary): its counted dimensions, each one's cohort, and the
        labels of the closed dimensions (open ones, e.g. items, are canonicalised, not
        checked; unknown, none and empty pass to the attributes table's own check)."""
        from stereolens.vocabulary import Vocabulary

        hint = f"the attribute schema is {self.source}; {hint}"
        dims = self.counted_dimensions
        return (
            Vocabulary("dimension", tuple(d.name for d in dims), hint=hint),
            Vocabulary("cohort", {d.name: (d.cohort,) for d in dims}, by="dimension", hint=hint),
            Vocabulary("label", self.vocabulary(), by="dimension", ignore=NOT_LABELS, hint=hint),
        )

    # ---------------------------------------------------------------- JSON schema
    def _field_schema(self, d: Dimension) -> dict[str, Any]:
        if d.kind == "identifier":
            return {"type": "string", "pattern": "^p[0-9]{1,2}$"}
        if d.vocabulary:
            label = {"type": "string", "enum": [*d.vocabulary, "unknown"]}
        else:
            label = {"type": "string", "minLength": 1, "maxLength": MAX_OPEN_LABEL_CHARS}
        if d.kind == "scalar":
            return label
        return {"type": "array", "items": label, "maxItems": MAX_LIST_ITEMS}

    @cached_property
    def json_schema(self) -> dict[str, Any]:
        """JSON schema of one image's answer: one object per cohort, people a list."""
        props: dict[str, Any] = {}
        for cohort in self.cohorts:
            dims = [d for d in self.dimensions if d.cohort == cohort]
            obj = {
                "type": "object",
                "properties": {d.name: self._field_schema(d) for d in dims},
                "required": [d.name for d in dims],
                "additionalProperties": False,
            }
            if dims[0].per_person:
                props[cohort] = {"type": "array", "items": obj, "maxItems": MAX_PEOPLE}
            else:
                props[cohort] = obj
        return {
            "title": "ImageAttributes",
            "type": "object",
            "properties": props,
            "required": list(self.cohorts),
            "additionalProperties": False,
        }

    def validate(self, answer: Any) -> list[str]:
        """Problems with a parsed answer (empty list = valid)."""
        import jsonschema

        validator = jsonschema.Draft202012Validator(self.json_schema)
        return [
            f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in validator.iter_errors(answer)
        ]

    # ---------------------------------------------------------------- flattening
    def labels(self, answer: dict[str, Any]) -> list[tuple[str, str, str]]:
        """(cohort, dimension, label) for one valid answer.

        Labels are lower-cased and stripped; unknown, none and empty are dropped;
        each label counts once per image even when several people carry it.
        """
        seen: set[tuple[str, str]] = set()
        out: list[tuple[str, str, str]] = []
        for d in self.counted_dimensions:
            block = answer.get(d.cohort)
            records = block if d.per_person else [block]
            for rec in records or []:
                value = (rec or {}).get(d.name)
                values = value if isinstance(value, list) else [value]
                for v in values:
                    if v is None:
                        continue
                    label = vocabulary_key(v)
                    if label in NOT_LABELS or (d.name, label) in seen:
                        continue
                    seen.add((d.name, label))
                    out.append((d.cohort, d.name, label))
        return out
