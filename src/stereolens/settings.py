"""A benchmark's frozen settings, built from its validated config section, and its named
presets (`paper`, `released`, or a YAML file of section keys) applied before validation."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from stereolens.validation import ConfigError, load_yaml

T = TypeVar("T")

DEFAULT_PRESET = "paper"
"""The preset a section without a ``preset`` key gets: the papers' published definitions."""


def _merge(base: Mapping, over: Mapping) -> dict:
    """``over`` on top of ``base``, nested mappings merged key by key."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def preset_values(benchmark: str, preset: str | Mapping | None) -> dict[str, Any]:
    """The section keys ``preset`` sets: a shipped name, a YAML path, a mapping or JSON text."""
    from stereolens.benchmark import benchmark as plugin

    if preset is None:
        preset = DEFAULT_PRESET
    if isinstance(preset, Mapping):
        return dict(preset)
    text = str(preset).strip()
    if text.startswith("{"):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"preset {text[:60]!r}...: not a JSON mapping ({err})") from None
    else:
        folder = plugin(benchmark).presets
        shipped = Path(folder) / f"{text}.yaml" if folder else None
        if shipped is not None and shipped.is_file():
            path = shipped
        elif Path(text).suffix in (".yaml", ".yml", ".json") and Path(text).is_file():
            path = Path(text)
        else:
            names = sorted(p.stem for p in Path(folder).glob("*.yaml")) if folder else []
            raise ConfigError(
                f"{benchmark} preset {text!r}: neither a shipped preset ({', '.join(names)}) "
                "nor a YAML file of the section's keys"
            )
        values = load_yaml(path, f"{benchmark} preset {text}") or {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{benchmark} preset {text!r}: expected a mapping of section keys")
    if "preset" in values:
        raise ConfigError(f"{benchmark} preset {text!r}: a preset cannot name another preset")
    return dict(values)


def stacked_presets(benchmark: str, presets: list[str | Mapping]) -> str | dict[str, Any]:
    """One preset from several given in order (each on top of those before it, as
    ``--preset released --preset extra.yaml``); a single one as it is."""
    if len(presets) == 1:
        return presets[0]
    out: dict[str, Any] = {}
    for preset in presets:
        out = _merge(out, preset_values(benchmark, preset))
    return out


def apply_preset(benchmark: str, section: Mapping) -> dict[str, Any]:
    """The config section with its preset's keys filled in where the section does not set
    them itself (a key written in the config wins over the preset)."""
    return _merge(preset_values(benchmark, section.get("preset")), section)


def section_defaults(benchmark: str, preset: str | Mapping | None = None) -> dict[str, Any]:
    """The benchmark's config section filled with the schema's defaults, ``preset`` first."""
    from stereolens.benchmark import benchmark as plugin
    from stereolens.validation import validate_against

    schema = dict(load_yaml(plugin(benchmark).config_schema, f"{benchmark} config schema"))
    schema.pop("required", None)  # the section's inputs (prompt bank, models) have no default
    section = preset_values(benchmark, preset)
    section["preset"] = preset if isinstance(preset, str) and preset[:1] != "{" else "inline"
    for _ in range(2):  # the second pass fills the defaults of objects the first one added
        validate_against(section, schema, f"{benchmark} settings", fill_defaults=True)
    return section


def settings_json(section: Mapping, keys: tuple[str, ...]) -> str:
    """``keys`` of a validated section as one sorted JSON mapping (the workflow's
    ``--preset``); a key "a.b" passes only b of the mapping a, so other keys of a rerun
    nothing."""
    out: dict[str, Any] = {}
    for key in keys:
        head, _, tail = key.partition(".")
        if tail:
            out.setdefault(head, {})[tail] = section[head][tail]
        else:
            out[key] = section[key]
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def settings_from(cls: type[T], values: Mapping[str, Any]) -> T:
    """``cls`` (a frozen dataclass) from a flat mapping; a missing or unknown field is an error."""
    names = {f.name for f in dataclasses.fields(cls)}
    missing = names - set(values)
    unknown = set(values) - names
    if missing or unknown:
        raise ConfigError(
            f"{cls.__name__}: missing {sorted(missing)}, unknown {sorted(unknown)}; the "
            "benchmark's schema and its settings class must name the same keys"
        )
    return cls(**values)


def overrides(args: object, flags: Mapping[str, str]) -> dict[str, Any]:
    """Setting name -> value of every CLI flag given (``flags``: argparse dest -> setting)."""
    return {
        name: getattr(args, dest)
        for dest, name in flags.items()
        if getattr(args, dest, None) is not None
    }
