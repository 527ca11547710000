"""Loading and checking a run config (the same checks the Snakefile runs)."""

from __future__ import annotations

import copy
import os
from typing import Any

from stereolens.models.registry import ModelSpec, load_registry
from stereolens.paths import resource
from stereolens.validation import ConfigError, load_yaml, validate_against

CONFIG_SCHEMA = resource("schemas", "config.schema.yaml")


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Validate in place, filling defaults; raise ConfigError naming the key."""
    validate_against(config, CONFIG_SCHEMA, what="config", fill_defaults=True)
    # defaults of nested objects that were absent are filled only one level deep
    # by the validator: run it again so their own defaults are filled too
    validate_against(config, CONFIG_SCHEMA, what="config", fill_defaults=True)
    return config


def check_models(config: dict[str, Any], registry: dict[str, ModelSpec]) -> None:
    """Every model the config names exists in the registry with the right kind, and each
    enabled benchmark's own input is sound: each plug-in checks its part
    (stereolens.benchmark)."""
    from stereolens.benchmark import benchmarks

    for plugin in benchmarks(config):
        plugin.check(config, registry)


def load_config(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, ModelSpec]]:
    config = load_yaml(path, "config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"config {path}: expected a mapping of keys at the top level")
    config = validate_config(copy.deepcopy(config))
    registry = load_registry(config["registry"])
    check_models(config, registry)
    return config, registry
