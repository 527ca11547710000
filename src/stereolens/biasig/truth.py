"""BiasIG ground truth, weights, categories and eta pairs: the shipped truth files and
resources/biasig/biasig.yaml, validated against JSON schemas; the nine protected ``VALUES``."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from stereolens.paths import resource
from stereolens.validation import ConfigError, parse_yaml, validate_against

GENDER = ("male", "female")
RACE = ("White", "Black", "East Asian", "South Asian")
AGE = ("young", "middle-aged", "elderly")
ATTRIBUTES = ("gender", "race", "age")
VALUES_BY_ATTRIBUTE = {"gender": GENDER, "race": RACE, "age": AGE}
VALUES: tuple[str, ...] = GENDER + RACE + AGE
"""The nine protected values, in the order of every length-9 vector."""
SLICES = {"gender": slice(0, 2), "race": slice(2, 6), "age": slice(6, 9)}
VALUE_INDEX = {v: i for i, v in enumerate(VALUES)}
ATTRIBUTE_OF_VALUE = {v: a for a, vs in VALUES_BY_ATTRIBUTE.items() for v in vs}

ACQUIRED_TYPES = ("occupation", "characteristic", "social_relation")
CHARACTERISTIC_GROUPS = ("positive", "negative")
RELATION_GROUPS = ("equal", "hira", "instr")
"""category.json keys of the characteristic and social-relation groups; every other key is
an occupation category."""

TRUTH_FILES = {
    "oc_gt.json": "distribution",
    "char_gt.json": "distribution",
    "sr_gt.json": "distribution",
    "weight.json": "weight",
    "category.json": "category",
    "eta.json": "eta",
}
SUM_TOLERANCE = 1e-3


def positions(n_persons: int) -> tuple[str, ...]:
    """The positions of the people in an image of ``n_persons``."""
    return ("left", "right") if n_persons == 2 else ("single",)


def norm_name(name: str) -> str:
    """Whole-name comparison key: case-folded, whitespace collapsed."""
    return " ".join(name.split()).casefold()


def same_name(entry: str, name: str) -> bool:
    """True when ``entry`` (a truth-file name) names ``name`` (a prompt's) as a whole name,
    equal up to case and whitespace or as its plural ``name + "s"`` ("Dentists")."""
    e, n = norm_name(entry), norm_name(name)
    return e == n or e == n + "s"


@dataclass(frozen=True)
class Pair:
    """An advantaged/disadvantaged pair of truth/eta.json."""

    name: str
    """Key in eta.json, e.g. "pair1"."""
    advantaged: str
    """Name as eta.json writes it, e.g. "rich", "CEO", "Employer at left"."""
    disadvantaged: str
    weight: float
    """Pair weight for the model-level mean."""


@dataclass(frozen=True)
class Settings:
    """resources/biasig/biasig.yaml, validated."""

    k_implicit: dict[str, float]
    k_eta: dict[str, float]
    truth_key_aliases: dict[str, str]
    name_aliases: dict[str, str]
    age_keys: dict[str, str]
    category_overrides: dict[str, str]
    repair_negative_truth: bool
    source: str

    def k_implicit_vector(self) -> np.ndarray:
        """k_i of S_imp in ATTRIBUTES order."""
        return np.array([self.k_implicit[a] for a in ATTRIBUTES], dtype=float)

    def k_eta_vector(self) -> np.ndarray:
        """k_i of alpha in VALUES order."""
        return np.array([self.k_eta[v] for v in VALUES], dtype=float)


@dataclass(frozen=True)
class BiasIGTruth:
    """Everything the metrics need besides the answers."""

    distributions: dict[str, dict[str, np.ndarray]]
    """Truth key -> position ("single", or "left" and "right") -> length-9 vector."""
    weights: dict[str, float]
    """Truth key -> k_j (weight.json)."""
    categories: dict[str, tuple[str, ...]]
    """Category -> names, as category.json writes them."""
    pairs: tuple[Pair, ...]
    settings: Settings
    source: str
    repairs: tuple[str, ...] = field(default=())
    """What was changed on loading (negative shares set to zero, age keys renamed)."""

    def truth_key(self, subject: str) -> str:
        """The key of the truth and weight files for a prompt subject."""
        return self.settings.truth_key_aliases.get(subject, subject)

    def truth_name(self, name: str) -> str:
        """The name the truth files use for an acquired attribute ("unattractive" -> "ugly")."""
        return self.settings.name_aliases.get(name, name)

    def weight_key(self, subject: str, name: str) -> str:
        key = self.truth_key(subject)
        alias = self.truth_name(name)
        if alias != name:
            key = re.sub(rf"(?<!\S){re.escape(name)}(?!\S)", alias, key)
        return key

    def weight(self, subject: str, name: str) -> float:
        key = self.weight_key(subject, name)
        if key not in self.weights:
            raise ConfigError(
                f"{self.source}/weight.json: no weight for {key!r} (prompt subject {subject!r})"
            )
        return self.weights[key]

    def distribution(self, subject: str, position: str) -> np.ndarray:
        key = self.truth_key(subject)
        entry = self.distributions.get(key)
        if entry is None:
            raise ConfigError(
                f"{self.source}: no ground truth for {key!r} "
                f"(prompt subject {subject!r}) in oc_gt.json, char_gt.json "
                "or sr_gt.json"
            )
        if position not in entry:
            raise ConfigError(
                f"{self.source}: ground truth of {key!r} has no {position!r} "
                f"person (has {sorted(entry)})"
            )
        return entry[position]

    def category(self, acquired_type: str, name: str) -> tuple[str, list[str]]:
        """The category of an acquired attribute by whole name, and the quirks met
        (``category_override``, ``category_name_variant`` when case or plural differ)."""
        if acquired_type == "characteristic":
            groups = CHARACTERISTIC_GROUPS
            name = self.truth_name(name)
        elif acquired_type == "social_relation":
            groups = RELATION_GROUPS
        else:
            groups = tuple(
                c for c in self.categories if c not in CHARACTERISTIC_GROUPS + RELATION_GROUPS
            )
        if acquired_type == "occupation" and name in self.settings.category_overrides:
            return self.settings.category_overrides[name], ["category_override"]
        hits = [
            (c, entry)
            for c in groups
            for entry in self.categories.get(c, ())
            if same_name(entry, name)
        ]
        cats = sorted({c for c, _ in hits})
        if len(cats) != 1:
            what = "no category lists" if not cats else f"several categories list ({cats})"
            raise ConfigError(
                f"{self.source}/category.json: {what} the {acquired_type} "
                f"{name!r}; add it to category_overrides in biasig.yaml"
            )
        quirks = [] if any(entry == name for _, entry in hits) else ["category_name_variant"]
        return cats[0], quirks


def load_settings(path: str | os.PathLike | None = None) -> Settings:
    path = Path(path) if path else resource("biasig", "biasig.yaml")
    try:
        raw = parse_yaml(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"BiasIG settings {path} cannot be read as YAML: {exc}") from exc
    validate_against(
        raw, resource("biasig", "schemas", "settings.schema.yaml"), f"BiasIG settings {path}"
    )
    return Settings(
        k_implicit={k: float(v) for k, v in raw["k_implicit"].items()},
        k_eta={k: float(v) for k, v in raw["k_eta"].items()},
        truth_key_aliases=dict(raw["truth_key_aliases"]),
        name_aliases=dict(raw["name_aliases"]),
        age_keys=dict(raw["age_keys"]),
        category_overrides=dict(raw["category_overrides"]),
        repair_negative_truth=bool(raw["repair_negative_truth"]),
        source=str(path),
    )


def _no_constant(name: str) -> float:
    """json's NaN, Infinity and -Infinity pass every range check of a JSON schema: refuse."""
    raise json.JSONDecodeError(f"{name} is not a share or weight; write a finite number", name, 0)


def _read_json(path: Path, kind: str) -> object:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"BiasIG truth file {path} cannot be read as JSON: {exc}") from exc
    validate_against(
        obj, resource("biasig", "schemas", f"{kind}.schema.yaml"), f"BiasIG truth file {path}"
    )
    return obj


def _person_vector(shares: dict, where: str, settings: Settings, repairs: list[str]) -> np.ndarray:
    vec = np.zeros(len(VALUES))
    for attribute in ATTRIBUTES:
        dist = shares[attribute]
        if attribute == "age":
            renamed: dict[str, float] = {}
            for key, value in dist.items():
                if key not in settings.age_keys:
                    raise ConfigError(
                        f"{where}.age: unknown age key {key!r}; known: "
                        f"{sorted(settings.age_keys)} (biasig.yaml age_keys)"
                    )
                bin_ = settings.age_keys[key]
                if bin_ in renamed:
                    raise ConfigError(f"{where}.age: two keys map to the age bin {bin_!r}")
                renamed[bin_] = float(value)
                if key not in ("0-30", "30-60", "60+"):
                    repairs.append(f"{where}.age: key {key!r} read as {bin_!r}")
            missing = [b for b in AGE if b not in renamed]
            if missing:
                raise ConfigError(f"{where}.age: no share for {missing}")
            dist = renamed
        part = np.array([float(dist[v]) for v in VALUES_BY_ATTRIBUTE[attribute]])
        if (part < 0).any():
            if not settings.repair_negative_truth:
                raise ConfigError(
                    f"{where}.{attribute}: negative share {float(part.min())!r}; "
                    "set repair_negative_truth in biasig.yaml"
                )
            repairs.append(
                f"{where}.{attribute}: negative share {float(part.min())!r} set to 0 "
                "and the distribution renormalised"
            )
            part = np.clip(part, 0.0, None)
            part = part / part.sum()
        total = part.sum()
        if abs(total - 1.0) > SUM_TOLERANCE:
            raise ConfigError(f"{where}.{attribute}: shares sum to {total:.4f}, not 1")
        vec[SLICES[attribute]] = part
    return vec


def load_truth(
    directory: str | os.PathLike | None = None, settings: Settings | str | os.PathLike | None = None
) -> BiasIGTruth:
    """Load and validate truth/*.json (default: the shipped copy) with the settings."""
    directory = Path(directory) if directory else resource("biasig", "truth")
    if not isinstance(settings, Settings):
        settings = load_settings(settings)
    raw = {}
    for name, kind in TRUTH_FILES.items():
        path = directory / name
        if not path.exists():
            raise ConfigError(f"BiasIG truth file {path} is missing")
        raw[name] = _read_json(path, kind)

    repairs: list[str] = []
    distributions: dict[str, dict[str, np.ndarray]] = {}
    for name in ("oc_gt.json", "char_gt.json", "sr_gt.json"):
        for key, entry in raw[name].items():
            where = f"{directory / name}: {key!r}"
            if key in distributions:
                raise ConfigError(f"{where}: also defined in another ground-truth file")
            if "left" in entry:
                distributions[key] = {
                    pos: _person_vector(entry[pos], f"{where}.{pos}", settings, repairs)
                    for pos in ("left", "right")
                }
            else:
                distributions[key] = {"single": _person_vector(entry, where, settings, repairs)}

    categories = {c: tuple(names) for c, names in raw["category.json"].items()}
    for group in CHARACTERISTIC_GROUPS + RELATION_GROUPS:
        if group not in categories:
            raise ConfigError(f"{directory / 'category.json'}: lacks the group {group!r}")
    seen: dict[str, str] = {}
    for c, names in categories.items():
        for n in names:
            if norm_name(n) in seen:
                raise ConfigError(
                    f"{directory / 'category.json'}: {n!r} is listed under "
                    f"{seen[norm_name(n)]!r} and {c!r}"
                )
            seen[norm_name(n)] = c
    for occupation, cat in settings.category_overrides.items():
        if cat not in categories:
            raise ConfigError(
                f"{settings.source}: category_overrides.{occupation} names "
                f"{cat!r}, which category.json does not have"
            )

    pairs = tuple(
        Pair(name, str(v[0][0]), str(v[0][1]), float(v[1])) for name, v in raw["eta.json"].items()
    )
    if len({p.name for p in pairs}) != len(pairs):
        raise ConfigError(f"{directory / 'eta.json'}: duplicate pair names")

    return BiasIGTruth(
        distributions=distributions,
        weights={k: float(v) for k, v in raw["weight.json"].items()},
        categories=categories,
        pairs=pairs,
        settings=settings,
        source=str(directory),
        repairs=tuple(repairs),
    )
