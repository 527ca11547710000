"""Debiasing variants of a generator (``variant_of``): registry-level helpers, no torch, no
diffusers (the keys that make a variant: docs/adding-a-model.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from stereolens.validation import ConfigError

_PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")


def base_of(spec: Any) -> str | None:
    """The base model a registry entry is a variant of, or None."""
    value = spec.get("variant_of")
    return str(value) if value else None


def check_variants(specs: Mapping[str, Any]) -> None:
    """Check every ``variant_of`` in a registry (name -> ModelSpec): the base must be another
    generator entry that is not itself a variant. Raises ConfigError naming the entry."""
    for name, spec in specs.items():
        base = base_of(spec)
        if base is None:
            continue
        where = f"model registry: {spec.kind}s.{name}.variant_of"
        if spec.kind != "generator":
            raise ConfigError(f"{where}: only generators can be debiasing variants")
        if base == name:
            raise ConfigError(f"{where} names the entry itself; name its base generator")
        other = specs.get(base)
        if other is None:
            generators = sorted(n for n, s in specs.items() if s.kind == "generator")
            raise ConfigError(
                f"{where} is {base!r}, which is not in the registry; "
                f"generators: {', '.join(generators)}"
            )
        if other.kind != "generator":
            raise ConfigError(f"{where} is {base!r}, which is a {other.kind}, not a generator")
        if base_of(other) is not None:
            raise ConfigError(
                f"{where} is {base!r}, which is itself a variant of {base_of(other)!r}; "
                f"a variant must name a base model, not another variant (use "
                f"variant_of: {base_of(other)})"
            )


# -- prompt intervention --------------------------------------------------------


def check_prompt_intervention(value: Any, where: str) -> dict[str, str]:
    """The normalised ``prompt_intervention`` setting {text, position, separator}."""
    if not isinstance(value, Mapping) or not isinstance(value.get("text"), str):
        raise ConfigError(f"{where}: prompt_intervention must be a mapping with a `text` string")
    unknown = sorted(set(value) - {"text", "position", "separator"})
    if unknown:
        raise ConfigError(f"{where}: prompt_intervention has unknown key(s) {', '.join(unknown)}")
    text = value["text"].strip()
    if not text:
        raise ConfigError(f"{where}: prompt_intervention.text is empty")
    if _PLACEHOLDER.search(text):
        raise ConfigError(
            f"{where}: prompt_intervention.text {text!r} holds a {{placeholder}}; the text is "
            "added to every prompt as it is, so write the prompt set's own intervention "
            "prompts for per-item wording"
        )
    position = value.get("position", "suffix")
    if position not in ("suffix", "prefix"):
        raise ConfigError(
            f"{where}: prompt_intervention.position is {position!r}; allowed: suffix, prefix"
        )
    separator = value.get("separator", " ")
    if not isinstance(separator, str):
        raise ConfigError(f"{where}: prompt_intervention.separator must be a string")
    return {"text": text, "position": position, "separator": separator}


def apply_prompt_intervention(prompt: str, intervention: Mapping[str, str] | None) -> str:
    """``prompt`` with the intervention text added (see check_prompt_intervention)."""
    if not intervention:
        return prompt
    text, sep = intervention["text"], intervention.get("separator", " ")
    if intervention.get("position", "suffix") == "prefix":
        return f"{text}{sep}{prompt}"
    return f"{prompt}{sep}{text}"
