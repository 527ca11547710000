"""The ground truth of the ContextBias extraction validation: the authors' 220 explicit prompts
and the reviewed truth file, checked against the attribute schema and the prompt file."""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from stereolens.contextbias.schema import NOT_LABELS, AttributeSchema
from stereolens.ids import stable_id
from stereolens.paths import resource
from stereolens.validation import ConfigError, parse_yaml

TRUTH_VERSION = "contextbias-validation-truth/1"
DEFAULT_TRUTH = ("contextbias", "validation_truth.v1.yaml")
DEFAULT_PROMPTS = ("contextbias", "validation_prompts.json")
CONDITION = "VAL"
VARIANT = "validation"
PHRASING = "a photo of"
DEFAULT_SEED_KEY = "pipeline_final"
N_PROMPTS = 220
_NO_EXTRACTOR = "\x00no-extractor"
ALL = "*"
"""dimension of the overall row of a (extractor,) model in :func:`validation_scores`."""

KINDS = ("stated", "implied")
_ENTRY_KEYS = frozenset(
    {"source_index", "role", "prompt", "dimension", "expected", "synonyms", "also", "implied"}
    | {"note", "reason"}
)
_PAIR_KEYS = frozenset({"dimension", "expected", "synonyms", "note"})

PAIR_COLUMNS: dict[str, Any] = {
    "source_index": pl.Int64,
    "prompt_id": pl.String,
    "role": pl.String,
    "prompt": pl.String,
    "kind": pl.String,
    "dimension": pl.String,
    "expected": pl.String,
    "accepted": pl.List(pl.String),
    "open_vocabulary": pl.Boolean,
    "exclusive": pl.Boolean,
    "note": pl.String,
}
"""One row per (prompt, expected pair). accepted = the normalised expected label and its
synonyms; open_vocabulary = the dimension has no closed vocabulary; exclusive = the
dimension holds one label per person (schema kind scalar), so another label of it is a
false positive (see :func:`validation_scores`)."""

EXCLUDED_COLUMNS: dict[str, Any] = {
    "source_index": pl.Int64,
    "prompt_id": pl.String,
    "role": pl.String,
    "prompt": pl.String,
    "reason": pl.String,
}

SCORE_COLUMNS = [
    "kind",
    "dimension",
    "n_prompts",
    "n_generated",
    "n_failed",
    "n_images",
    "n_correct",
    "n_false_negative",
    "n_false_positive",
    "accuracy",
    "recall",
    "precision",
    "f1",
    "f1_paper",
    "accuracy_macro",
    "n_excluded_prompts",
]


def normalise_label(label: str) -> str:
    """Lower case, single spaces: the form :meth:`AttributeSchema.labels` writes."""
    return " ".join(str(label).strip().lower().split())


def validation_prompt_id(source_index: int, text: str) -> str:
    return stable_id("validation", source_index, text)


@dataclass(frozen=True)
class ValidationTruth:
    """The loaded ground truth: ``pairs`` (PAIR_COLUMNS; stated and implied pairs) and
    ``excluded`` (EXCLUDED_COLUMNS; prompts that state no schema attribute)."""

    version: str
    source: str
    schema_version: str
    pairs: pl.DataFrame
    excluded: pl.DataFrame


# ------------------------------------------------------------------------ prompt file
def load_validation_prompts(path: str | os.PathLike | None = None) -> list[dict]:
    """The authors' validation prompt list, checked: source_index 0..n-1 once each."""
    path = Path(path) if path else resource(*DEFAULT_PROMPTS)
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"validation prompts {path} cannot be read as JSON: {exc}") from exc
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"validation prompts {path}: expected a non-empty JSON list")
    for i, e in enumerate(entries):
        missing = {"role", "prompt", "source_index"} - set(e if isinstance(e, dict) else {})
        if missing:
            raise ConfigError(f"validation prompts {path}: entry {i} lacks {sorted(missing)}")
    indices = sorted(e["source_index"] for e in entries)
    if indices != list(range(len(entries))):
        raise ConfigError(
            f"validation prompts {path}: source_index must run 0..{len(entries) - 1} once each"
        )
    return sorted(entries, key=lambda e: e["source_index"])


# ------------------------------------------------------------------------ ground truth
def _pair(
    raw: Any,
    where: str,
    schema: AttributeSchema,
    vocab: Mapping[str, tuple[str, ...] | None],
    problems: list[str],
) -> dict | None:
    """One checked (dimension, expected, synonyms) pair, or None after noting problems."""
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping with dimension and expected, got {raw!r}")
        return None
    extra = sorted(set(raw) - _PAIR_KEYS)
    if extra:
        problems.append(f"{where}: unknown keys {extra}; allowed: {sorted(_PAIR_KEYS)}")
    dim = raw.get("dimension")
    if dim not in vocab:
        close = difflib.get_close_matches(str(dim), list(vocab), n=3)
        close += [d for d in vocab if str(dim) in d and d not in close][: 3 - len(close)]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        problems.append(
            f"{where}: dimension {dim!r} is not a counted dimension of the schema "
            f"{schema.version}{hint}"
        )
        return None
    label = raw.get("expected")
    if isinstance(label, bool):
        problems.append(
            f'{where}: expected is the boolean {label}; write "yes" or "no" in quotes '
            "(YAML reads an unquoted yes/no as a boolean)"
        )
        return None
    if not isinstance(label, str) or not normalise_label(label):
        problems.append(f"{where}: expected must be a non-empty label, got {label!r}")
        return None
    label = normalise_label(label)
    if label in NOT_LABELS:
        problems.append(
            f"{where}: expected {label!r} is never counted (unknown/none/empty); "
            "use expected: null with a reason to exclude the prompt"
        )
        return None
    allowed = vocab[dim]
    synonyms = raw.get("synonyms") or []
    if allowed is not None:
        if label not in allowed:
            problems.append(
                f"{where}: {label!r} is not in the vocabulary of {dim}; allowed: "
                f"{', '.join(allowed)}"
            )
            return None
        if synonyms:
            problems.append(
                f"{where}: synonyms are for open-vocabulary dimensions only; {dim} is closed"
            )
            return None
    if not isinstance(synonyms, list) or not all(
        isinstance(s, str) and normalise_label(s) and normalise_label(s) not in NOT_LABELS
        for s in synonyms
    ):
        problems.append(f"{where}: synonyms must be a list of non-empty labels, got {synonyms!r}")
        return None
    accepted = list(dict.fromkeys([label, *(normalise_label(s) for s in synonyms)]))
    kind = next(d.kind for d in schema.counted_dimensions if d.name == dim)
    return {
        "dimension": dim,
        "expected": label,
        "accepted": accepted,
        "open_vocabulary": allowed is None,
        "exclusive": kind == "scalar",
        "note": raw.get("note"),
    }


def load_validation_truth(
    path: str | os.PathLike | None = None,
    *,
    schema: AttributeSchema | None = None,
    prompts_path: str | os.PathLike | None = None,
    check_prompts: bool = True,
) -> ValidationTruth:
    """Load and check the reviewed ground truth of the validation prompts.

    Checks, each failure naming the entry: every dimension is a counted dimension of the
    attribute schema; closed-vocabulary labels are in the vocabulary (never unknown/none);
    synonyms only on open-vocabulary dimensions; a prompt with ``expected: null`` gives a
    ``reason``; every source_index of the prompt file (0..219) appears exactly once; and,
    with ``check_prompts``, role and prompt text equal those of the prompt file. All problems
    are collected and raised together as one :class:`ConfigError`.
    """
    path = Path(path) if path else resource(*DEFAULT_TRUTH)
    schema = schema or AttributeSchema.load()
    try:
        raw = parse_yaml(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"validation truth {path} cannot be read as YAML: {exc}") from exc
    if not isinstance(raw, Mapping) or not isinstance(raw.get("entries"), list):
        raise ConfigError(f"validation truth {path}: expected a mapping with a list `entries`")
    version = str(raw.get("version"))
    if version != TRUTH_VERSION:
        raise ConfigError(
            f"validation truth {path}: version {version!r}; this stereolens reads {TRUTH_VERSION}"
        )
    schema_version = str(raw.get("schema_version"))
    if schema_version != schema.version:
        raise ConfigError(
            f"validation truth {path} was written for schema {schema_version!r}, "
            f"but the attribute schema is {schema.version!r}; review the truth for the new schema"
        )
    source_prompts = None
    if check_prompts:
        source_prompts = {e["source_index"]: e for e in load_validation_prompts(prompts_path)}
    n_expected = len(source_prompts) if source_prompts is not None else N_PROMPTS
    vocab = schema.vocabulary()
    problems: list[str] = []
    pairs: list[dict] = []
    excluded: list[dict] = []
    seen: dict[int, int] = {}
    for i, entry in enumerate(raw["entries"]):
        if not isinstance(entry, Mapping):
            problems.append(f"entry {i}: expected a mapping, got {entry!r}")
            continue
        si, text, role = entry.get("source_index"), entry.get("prompt"), entry.get("role")
        where = f"entry {i} (source_index {si}, {text!r})"
        extra = sorted(set(entry) - _ENTRY_KEYS)
        if extra:
            problems.append(f"{where}: unknown keys {extra}; allowed: {sorted(_ENTRY_KEYS)}")
        if isinstance(si, bool) or not isinstance(si, int) or not 0 <= si < n_expected:
            problems.append(f"{where}: source_index must be an integer 0..{n_expected - 1}")
            continue
        if si in seen:
            problems.append(f"{where}: source_index {si} appears twice (also entry {seen[si]})")
            continue
        seen[si] = i
        if not isinstance(text, str) or not text.strip() or not isinstance(role, str):
            problems.append(f"{where}: prompt and role must be non-empty strings")
            continue
        if source_prompts is not None:
            src = source_prompts[si]
            if text != src["prompt"] or role != src["role"]:
                problems.append(
                    f"{where}: prompt/role differ from the prompt file, which has "
                    f"{src['prompt']!r} (role {src['role']!r})"
                )
                continue
        base = {
            "source_index": si,
            "prompt_id": validation_prompt_id(si, " ".join(text.split())),
            "role": role,
            "prompt": text,
        }
        if entry.get("expected") is None:
            reason = entry.get("reason")
            if not isinstance(reason, str) or not reason.strip():
                problems.append(f"{where}: expected is null, so a reason must say why")
            elif any(entry.get(k) for k in ("dimension", "synonyms", "also", "implied")):
                problems.append(
                    f"{where}: expected is null; dimension, synonyms, also and implied "
                    "must then be absent"
                )
            else:
                excluded.append({**base, "reason": reason.strip()})
            continue
        first = {k: entry.get(k) for k in ("dimension", "expected", "synonyms", "note")}
        groups = [("stated", [first, *(entry.get("also") or [])])]
        groups.append(("implied", entry.get("implied") or []))
        dims: set[str] = set()
        for kind, items in groups:
            if not isinstance(items, list):
                problems.append(f"{where}: `{'also' if kind == 'stated' else kind}` must be a list")
                continue
            for j, item in enumerate(items):
                label = "" if (kind, j) == ("stated", 0) else f" {kind} pair {j}"
                pair = _pair(item, where + label, schema, vocab, problems)
                if pair is None:
                    continue
                if pair["dimension"] in dims:
                    problems.append(
                        f"{where}{label}: dimension {pair['dimension']} is given twice; "
                        "one expected label per dimension"
                    )
                    continue
                dims.add(pair["dimension"])
                if pair["note"] is None:
                    pair["note"] = entry.get("note") if kind == "stated" else None
                pairs.append({**base, "kind": kind, **pair})
    missing = sorted(set(range(n_expected)) - set(seen))
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        problems.append(f"source_index values missing ({len(missing)}): {shown}")
    if problems:
        listed = "\n  ".join(problems[:30])
        more = f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
        raise ConfigError(f"validation truth {path} is invalid:\n  {listed}{more}")
    return ValidationTruth(
        version=version,
        source=str(path),
        schema_version=schema_version,
        pairs=pl.DataFrame(pairs, schema=PAIR_COLUMNS).sort("source_index", "kind", "dimension"),
        excluded=pl.DataFrame(excluded, schema=EXCLUDED_COLUMNS).sort("source_index"),
    )
