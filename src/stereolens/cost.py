"""The planner's cost model: the throughput table (config/throughput.yaml, validated) and
the GPU-hours of each benchmark of a config by arithmetic from its plug-in's sizes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stereolens.validation import ConfigError, load_yaml

THROUGHPUT_TABLE = "config/throughput.yaml"
"""The planner's throughput table of the workflow (stereolens.plan's default)."""

THROUGHPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["entries"],
    "additionalProperties": False,
    "properties": {
        "gpu": {"type": "string", "description": "the GPU the figures are for"},
        "entries": {
            "type": "object",
            "description": "registry model name -> throughput entry",
            "additionalProperties": {
                "type": "object",
                "required": ["status", "source"],
                "additionalProperties": False,
                "properties": {
                    "seconds_per_image": {
                        "type": "number",
                        "exclusiveMinimum": 0,
                        "description": "generators: seconds per generated image",
                    },
                    "seconds_per_call": {
                        "type": "number",
                        "exclusiveMinimum": 0,
                        "description": "VLMs: seconds per request (one image)",
                    },
                    "status": {"enum": ["measured", "estimate"]},
                    "source": {
                        "type": "string",
                        "minLength": 1,
                        "description": "where the figure comes from (the arithmetic for "
                        "an estimate)",
                    },
                },
                "oneOf": [
                    {"required": ["seconds_per_image"], "not": {"required": ["seconds_per_call"]}},
                    {"required": ["seconds_per_call"], "not": {"required": ["seconds_per_image"]}},
                ],
            },
        },
    },
}


def _describe(error) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    if error.validator == "oneOf":
        return f"{where}: give exactly one of seconds_per_image or seconds_per_call"
    if error.validator == "enum":
        return f"{where}: {error.message}; allowed values: measured, estimate"
    if error.validator == "additionalProperties" and isinstance(error.schema, dict):
        props = ", ".join(sorted(error.schema.get("properties", {})))
        return f"{where}: {error.message}; allowed keys here: {props}"
    return f"{where}: {error.message}"


def load_throughput(path: str | os.PathLike) -> dict[str, Any]:
    """The throughput table, validated; raise ConfigError naming each problem."""
    import jsonschema

    path = Path(path)
    table = load_yaml(path, "throughput table")
    validator = jsonschema.Draft202012Validator(THROUGHPUT_SCHEMA)
    errors = sorted(validator.iter_errors(table), key=lambda e: list(e.absolute_path))
    if errors:
        lines = "\n  ".join(_describe(e) for e in errors[:20])
        raise ConfigError(f"throughput table {path} is invalid:\n  {lines}")
    return table


def speed(
    name: str, stage: str, registry: dict, throughput: dict[str, Any]
) -> tuple[float | None, str, str]:
    spec = registry[name]
    if spec.backend == "openai":
        return 0.0, "api", f"{spec.backend} API: no local GPU"
    if spec.get("device") == "cpu":
        return 0.0, "cpu", "runs on the CPU (registry device: cpu)"
    key = "seconds_per_image" if stage == "generate" else "seconds_per_call"
    entry = (throughput.get("entries") or {}).get(name)
    if entry is not None:
        if key not in entry:
            other = "seconds_per_call" if key == "seconds_per_image" else "seconds_per_image"
            raise ConfigError(
                f"throughput entry {name!r} gives {other}, but the model is used for {stage}: "
                f"give {key}"
            )
        return float(entry[key]), entry["status"], entry["source"]
    reg_key = "seconds_per_image" if stage == "generate" else "seconds_per_item"
    if spec.get(reg_key) is not None:
        return float(spec.get(reg_key)), "estimate", f"registry {reg_key}"
    return None, "unknown", "no throughput figure: add one to the throughput table"


STAGES = ("generate", "extract", "vqa", "respond", "assistant")
"""Stages with a throughput figure: the rows of the plan (refusal labelling and the
aggregate jobs are left out)."""


def benchmark_sizes(
    config: dict[str, Any], names: set[str] | None = None
) -> list[tuple[Any, list]]:
    """(plug-in, its Size records) per enabled benchmark of ``names`` (``size``, else its jobs)."""
    from stereolens.benchmark import Size, benchmarks

    out = []
    for plugin in benchmarks(config):
        if names is not None and plugin.name not in names:
            continue
        if plugin.size is not None:
            sizes = plugin.size(config)
        else:
            jobs = plugin.jobs(config, counts=True)
            sizes = [Size(j.stage, j.model, 1, j.items, j.unit) for j in jobs]
        out.append((plugin, sizes))
    return out


def benchmark_hours(
    config: dict[str, Any],
    registry: dict,
    throughput: dict[str, Any] | None = None,
    names: set[str] | None = None,
) -> tuple[dict[str, float], list[str]]:
    """GPU-hours per enabled benchmark (of ``names``) by :func:`size`'s arithmetic, and the
    models of those benchmarks that have no throughput figure (their hours left out)."""
    throughput = throughput or {"entries": {}}
    hours: dict[str, float] = {}
    unknown: list[str] = []
    for plugin, sizes in benchmark_sizes(config, names):
        hours[plugin.name] = 0.0
        for s in sizes:
            h = size_hours(s, registry, throughput)
            if h is None and s.model not in unknown:
                unknown.append(s.model)
            hours[plugin.name] += h or 0.0
    return hours, unknown


def size_hours(s: Any, registry: dict, throughput: dict[str, Any]) -> float | None:
    """GPU-hours of a Size record: 0 off the model stages, None without a throughput figure."""
    if s.stage not in STAGES or s.model not in registry:
        return 0.0
    seconds = speed(s.model, s.stage, registry, throughput)[0]
    return None if seconds is None else s.items * seconds / 3600


def default_throughput() -> dict[str, Any] | None:
    """The workflow's throughput table (config/throughput.yaml) when it is here."""
    return load_throughput(THROUGHPUT_TABLE) if Path(THROUGHPUT_TABLE).is_file() else None
