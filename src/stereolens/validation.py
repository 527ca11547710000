"""Validation of config and data files against JSON schemas, with errors that
name the key and say what is allowed."""

from __future__ import annotations

import copy
import os
from functools import lru_cache
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A config, registry or data file is wrong; the message says where and what to do."""


def parse_yaml(text: str):
    """yaml.safe_load's result, parsed by libyaml where PyYAML has it; a text libyaml
    refuses is parsed again by the pure-Python loader, for safe_load's error."""
    if _CSafeLoader is not None:
        try:
            return yaml.load(text, Loader=_CSafeLoader)  # noqa: S506 - a safe loader
        except yaml.YAMLError:
            pass
    return yaml.safe_load(text)


_CSafeLoader = getattr(yaml, "CSafeLoader", None)


def load_yaml(path: str | os.PathLike, what: str = "YAML file"):
    """The content of a YAML file; a syntax error is a ConfigError naming the file, the
    line and the column (PyYAML's own message names an anonymous string)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc}") from exc
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        detail = f"{context}: {problem}" if context else problem
        raise ConfigError(f"{what} {path}{where}: YAML error: {detail}") from exc


@lru_cache(maxsize=16)
def _load_schema(path: str) -> dict:
    return parse_yaml(Path(path).read_text())


def _describe(error) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    schema = error.schema if isinstance(error.schema, dict) else {}
    allowed = ""
    if error.validator == "additionalProperties":
        props = sorted((schema.get("properties") or {}).keys())
        allowed = f"; allowed keys here: {', '.join(props)}" if props else ""
    elif error.validator == "enum":
        allowed = f"; allowed values: {', '.join(map(str, error.validator_value))}"
    elif "description" in schema:
        allowed = f" ({schema['description'].strip().splitlines()[0]})"
    return f"{where}: {error.message}{allowed}"


def validate_against(
    obj: object, schema_path: str | os.PathLike | dict, what: str, fill_defaults: bool = False
) -> None:
    """Validate ``obj`` against a schema file (or a schema already loaded); raise
    ConfigError listing every problem.

    With ``fill_defaults`` the schema's defaults are written into missing keys
    (objects only), as snakemake.utils.validate does.
    """
    import jsonschema

    schema = schema_path if isinstance(schema_path, dict) else _load_schema(str(schema_path))
    validator_cls = jsonschema.validators.validator_for(schema)
    if fill_defaults:
        validator_cls = _extend_with_default(validator_cls)
    validator = validator_cls(schema)
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        lines = "\n  ".join(_describe(e) for e in errors[:20])
        raise ConfigError(f"{what} is invalid:\n  {lines}")


def _extend_with_default(validator_cls):
    import jsonschema

    validate_props = validator_cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub and name not in instance:
                    # a copy: the schema is cached, and filling an object's own defaults
                    # must not write into the schema's default (shared by every config)
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_cls, {"properties": set_defaults})
