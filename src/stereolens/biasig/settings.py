"""BiasIG's metric settings: one frozen object from the validated config section."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from stereolens.settings import section_defaults, settings_from


@dataclass(frozen=True)
class BiasIGSettings:
    """The metric keys of the ``biasig`` section (the schema describes each one)."""

    eta_variant: str
    replicates: int
    seed: int
    count: str
    scoring_unit: str
    ceiling_draws: int
    interval_min_images_per_subject: int
    level: float

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The section keys it is built from."""
        return tuple(f.name for f in fields(cls))

    def metric_options(self) -> dict[str, Any]:
        """The keywords of stereolens.biasig.metrics.compute_metrics these settings give
        (its ``ci`` is the level)."""
        options = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "level"}
        return options | {"ci": self.level}

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> BiasIGSettings:
        """From a validated ``biasig`` section (its preset applied, defaults filled)."""
        return settings_from(cls, {f.name: section[f.name] for f in fields(cls)})

    @classmethod
    def preset(cls, preset: str | dict | None = None) -> BiasIGSettings:
        """The schema's defaults under ``preset`` (None: "paper")."""
        return cls.from_config(section_defaults("biasig", preset))
