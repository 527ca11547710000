"""Loading and checking a run config (the same checks the Snakefile runs)."""

from __future__ import annotations

import copy
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from stereolens.models.registry import ModelSpec, load_registry
from stereolens.paths import resource
from stereolens.validation import ConfigError, load_yaml, validate_against

CONFIG_SCHEMA = resource("schemas", "config.schema.yaml")


def config_schema() -> dict[str, Any]:
    """config.schema.yaml with each registered benchmark's config_schema under its name
    (``x-required: true``: the section must be given; ``x-report-galleries``' properties
    join report.galleries)."""
    from stereolens.benchmark import benchmarks

    fragments = tuple((p.name, p.config_schema) for p in benchmarks() if p.config_schema)
    return _merged_schema(str(CONFIG_SCHEMA), fragments)


@lru_cache(maxsize=4)
def _merged_schema(path: str, fragments: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    schema = copy.deepcopy(load_yaml(path, "config schema"))
    sections = {}
    for name, fragment in fragments:
        if name in schema["properties"]:
            raise ConfigError(
                f"benchmark {name!r} ships the config schema {fragment}, but the config "
                f"schema {path} has a section {name!r} already"
            )
        section = load_yaml(fragment, f"config schema of benchmark {name!r}")
        if not isinstance(section, dict) or section.get("type") != "object":
            raise ConfigError(
                f"config schema of benchmark {name!r} ({fragment}): expected the JSON Schema "
                "of its config section (type: object, with properties and defaults)"
            )
        if section.pop("x-required", False):
            schema["required"].append(name)
        galleries = schema["properties"]["report"]["properties"]["galleries"]["properties"]
        for key, prop in section.pop("x-report-galleries", {}).items():
            if key in galleries:
                raise ConfigError(
                    f"config schema of benchmark {name!r} ({fragment}): report.galleries."
                    f"{key} exists already; name it after the benchmark ({name}_...)"
                )
            galleries[key] = prop
        sections[name] = section
    # the benchmarks' sections first: an absent section's defaults are filled in this order
    schema["properties"] = {**sections, **schema["properties"]}
    return schema


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Validate in place, filling defaults; raise ConfigError naming the key."""
    return _validated(config, config_schema())


def validate_report_config(config: dict[str, Any]) -> dict[str, Any]:
    """A report's config, validated in place and filled with defaults (:func:`report_schema`)."""
    return _validated(config, report_schema())


def report_schema() -> dict[str, Any]:
    """The config schema less what a results folder cannot show: no key is required, a
    list may be empty, and a value may be null (the tables do not name it)."""
    return _relaxed(copy.deepcopy(config_schema()))


def _relaxed(schema: dict[str, Any]) -> dict[str, Any]:
    schema.pop("required", None)
    schema.pop("minItems", None)
    kind = schema.get("type")
    if isinstance(kind, str) and kind != "null":
        schema["type"] = [kind, "null"]
    elif isinstance(kind, list) and "null" not in kind:
        kind.append("null")
    if "enum" in schema and None not in schema["enum"]:
        schema["enum"].append(None)
    subschemas = [*schema.get("properties", {}).values(), *schema.get("$defs", {}).values()]
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            subschemas.append(schema[key])
    for key in ("anyOf", "oneOf", "allOf"):
        subschemas += schema.get(key, [])
    for sub in subschemas:
        _relaxed(sub)
    return schema


def _validated(config: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    from stereolens.benchmark import benchmarks
    from stereolens.settings import apply_preset

    for plugin in benchmarks():
        if isinstance(config.get(plugin.name), dict) and plugin.presets:
            config[plugin.name] = apply_preset(plugin.name, config[plugin.name])
    validate_against(config, schema, what="config", fill_defaults=True)
    # defaults of nested objects that were absent are filled only one level deep
    # by the validator: run it again so their own defaults are filled too
    validate_against(config, schema, what="config", fill_defaults=True)
    return config


def check_models(config: dict[str, Any], registry: dict[str, ModelSpec]) -> None:
    """Every model the config names is in the registry with the right kind; plug-in checks pass."""
    from stereolens.benchmark import benchmarks

    for plugin in benchmarks(config):
        plugin.check(config, registry)


MODEL_FILES = ("model_index.json", "config.json")
"""Files of which a local model folder holds at least one (diffusers pipelines hold
model_index.json, transformers and vLLM checkpoints config.json); a GGUF file counts too."""


def _local_problem(spec: ModelSpec) -> str | None:
    """What is wrong with an entry's local ``model:`` path (None: fine or not a local path)."""
    from stereolens.models.registry import PACKAGE_SCHEME, resolve_model_location

    if spec.backend == "openai" or not spec.model or spec.get("build"):
        return None
    try:
        location = resolve_model_location(spec.model)
    except ConfigError as exc:
        return str(exc)
    path = Path(location).expanduser()
    local = (
        spec.model.startswith(PACKAGE_SCHEME)
        or location.startswith((".", "/", "~"))
        or location.count("/") >= 2
        or path.exists()
    )
    if not local:
        return None
    if not path.exists():
        return f"its model: {spec.model} is a local path that does not exist"
    if path.is_file():
        return None
    if any((path / f).is_file() for f in MODEL_FILES) or any(path.glob("*.gguf")):
        return None
    return (
        f"its model: {spec.model} is a folder that holds no model (no "
        f"{' or '.join(MODEL_FILES)}, no .gguf file)"
    )


def model_source_problems(
    config: dict[str, Any], registry: dict[str, ModelSpec], environ=os.environ
) -> tuple[list[str], list[str]]:
    """What would fail every job of a model the run uses (a missing local model, an unset
    API key variable), one line each naming the model, its role and the registry key."""
    from stereolens.benchmark import model_roles

    roles: dict[str, list[str]] = {}
    for role, name in model_roles(config):
        if name in registry and role not in roles.setdefault(name, []):
            roles[name].append(role)
    paths, keys = [], []
    where = config["registry"]
    for name, used in roles.items():
        spec = registry[name]
        what = f"model {name!r} ({', '.join(used)})"
        problem = _local_problem(spec)
        if problem:
            paths.append(
                f"{what}: {problem}; fix model: in the registry {where}, or fetch the weights there"
            )
        key = spec.get("api_key_env") if spec.backend == "openai" else None
        if key and not environ.get(key):
            keys.append(
                f"{what}: its API key variable ${key} (registry key api_key_env) is not set; "
                f"export {key}=... before the run"
            )
    return paths, keys


def check_model_sources(
    config: dict[str, Any], registry: dict[str, ModelSpec], *, warn_keys: bool = False
) -> None:
    """Refuse a run whose models cannot load (model_source_problems), before any job;
    ``warn_keys``: unset API keys only warn (a dry run asks no model)."""
    import sys

    paths, keys = model_source_problems(config, registry)
    if warn_keys and keys:
        print("stereolens: warning: " + "\n  ".join(keys), file=sys.stderr)
        keys = []
    problems = paths + keys
    if problems:
        raise ConfigError(
            "the run's models cannot load (every job of theirs would fail):\n  "
            + "\n  ".join(problems)
        )


def load_config(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, ModelSpec]]:
    config = load_yaml(path, "config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"config {path}: expected a mapping of keys at the top level")
    config = validate_config(copy.deepcopy(config))
    registry = load_registry(config["registry"])
    check_models(config, registry)
    return config, registry
