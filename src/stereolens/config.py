"""Loading and checking a run config (the same checks the Snakefile runs)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from stereolens.paths import resource
from stereolens.registry import ModelSpec, load_registry
from stereolens.validation import ConfigError, validate_against

CONFIG_SCHEMA = resource("schemas", "config.schema.yaml")


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Validate in place, filling defaults; raise ConfigError naming the key."""
    validate_against(config, CONFIG_SCHEMA, what="config", fill_defaults=True)
    # defaults of nested objects that were absent are filled only one level deep
    # by the validator: run it again so their own defaults are filled too
    validate_against(config, CONFIG_SCHEMA, what="config", fill_defaults=True)
    return config


def check_models(config: dict[str, Any], registry: dict[str, ModelSpec]) -> None:
    """Every model the config names exists in the registry with the right kind."""
    cb = config["contextbias"]
    for key, kind in (("generators", "generator"), ("extractors", "vlm")):
        for name in cb[key]:
            spec = registry.get(name)
            if spec is None:
                known = sorted(n for n, s in registry.items() if s.kind == kind)
                raise ConfigError(
                    f"contextbias.{key}: {name!r} is not in the registry "
                    f"{config['registry']}; known {kind}s: {', '.join(known)}. "
                    "Add an entry there to add a model."
                )
            if spec.kind != kind:
                raise ConfigError(
                    f"contextbias.{key}: {name!r} is a {spec.kind} in the registry, not a {kind}"
                )
    bg = config["biasig"]
    if bg["enabled"]:
        for name in bg["generators"]:
            if registry.get(name) is None or registry[name].kind != "generator":
                raise ConfigError(
                    f"biasig.generators: {name!r} is not a generator in the registry "
                    f"{config['registry']}"
                )
        if (
            bg["vqa"] is None
            or registry.get(bg["vqa"]) is None
            or registry[bg["vqa"]].kind != "vlm"
        ):
            raise ConfigError(
                f"biasig.vqa: {bg['vqa']!r} is not a vlm in the registry {config['registry']}"
            )
    _check_lvlm(config, registry)
    llm = cb["canonicalisation"]["llm"]
    if llm is not None and (llm not in registry or registry[llm].kind not in ("llm", "vlm")):
        known = sorted(n for n, s in registry.items() if s.kind == "llm")
        raise ConfigError(
            f"contextbias.canonicalisation.llm: {llm!r} is not an llm in the registry "
            f"{config['registry']}; known llms: {', '.join(known)}"
        )


def _check_lvlm(config: dict[str, Any], registry: dict[str, ModelSpec]) -> None:
    lv = config.get("lvlm") or {}
    if not lv.get("enabled"):
        return
    where = config["registry"]
    if not lv["models"]:
        raise ConfigError("lvlm.models is empty: name at least one vlm of the registry")
    for name in lv["models"]:
        if registry.get(name) is None or registry[name].kind != "vlm":
            known = sorted(n for n, s in registry.items() if s.kind == "vlm")
            raise ConfigError(
                f"lvlm.models: {name!r} is not a vlm in the registry {where}; known vlms: "
                f"{', '.join(known)}. Add an entry under vlms: to add a model."
            )
    needs_assistant = [t for t in ("story", "term") if t in lv["tasks"]]
    if needs_assistant and lv["assistant"] is None:
        raise ConfigError(
            f"lvlm.assistant is null but task(s) {', '.join(needs_assistant)} need the LLM "
            "assistant: name an llms (or vlms) entry of the registry"
        )
    for key in ("assistant", "refusal_judge"):
        name = lv[key]
        if name is not None and (name not in registry or registry[name].kind not in ("llm", "vlm")):
            raise ConfigError(f"lvlm.{key}: {name!r} is not an llm or vlm in the registry {where}")
    src = lv["user_images"]
    if src["source"] == "folder" and not src["folder"]:
        raise ConfigError("lvlm.user_images.source is folder but lvlm.user_images.folder is unset")
    if "attribute_inferring" in lv["tasks"] and lv["settings"] == ["persona"]:
        raise ConfigError(
            "lvlm.tasks.attribute_inferring asks about the photo: it needs the image or "
            "mitigation setting, not persona alone"
        )


def load_config(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, ModelSpec]]:
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"config {path} cannot be read: {exc}") from exc
    config = validate_config(copy.deepcopy(config))
    registry = load_registry(config["registry"])
    check_models(config, registry)
    return config, registry
