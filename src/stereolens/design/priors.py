"""The documented prior of the power planner (resources/design/priors.v1.yaml, and the
sections benchmarks ship in their plug-ins' priors files)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stereolens.paths import resource
from stereolens.validation import ConfigError, load_yaml

PRIORS_VERSION = "stereolens-design-priors/1"
DEFAULT_PRIORS = ("design", "priors.v1.yaml")


def load_priors(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The prior file (default: the shipped one); raise ConfigError on another version or
    without a section for every registered benchmark with a planner world."""
    p = Path(path) if path is not None else resource(*DEFAULT_PRIORS)
    raw = load_yaml(p, "design priors")
    if not isinstance(raw, dict) or raw.get("version") != PRIORS_VERSION:
        raise ConfigError(f"design priors {p}: expected version {PRIORS_VERSION!r}")
    from stereolens.benchmark import benchmarks

    missing = []
    for plugin in benchmarks():
        if not plugin.planner or plugin.name in raw:
            continue
        if plugin.priors is None:
            missing.append(plugin.name)
        else:
            raw[plugin.name] = load_yaml(Path(plugin.priors), f"{plugin.name} design priors")
    if missing:
        raise ConfigError(
            f"design priors {p}: no section for {', '.join(missing)} (add one, or give the "
            "benchmark's plug-in a priors file)"
        )
    return raw
