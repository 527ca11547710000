"""ContextBias's metric settings: one frozen object from the validated config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stereolens.settings import section_defaults, settings_from


@dataclass(frozen=True)
class ContextBiasSettings:
    """The keys of ``contextbias.metrics`` (the schema describes each one)."""

    k_definition: str
    replicates: int
    seed: int
    matched_draws: int
    overall: str
    single_label_bi: float
    bootstrap_draws: str
    bootstrap_interval: str
    interval_min_roles: int
    consistency: str
    bh_family: str
    robustness_cells: str
    robustness_all: str
    ccs_min_count: int
    alpha: float
    max_range_pp: float

    def ccs_options(self) -> dict[str, Any]:
        """The keywords of stereolens.contextbias.ccs.ccs_table these settings give."""
        return {
            "min_count": self.ccs_min_count,
            "alpha": self.alpha,
            "max_range_pp": self.max_range_pp,
            "consistency": self.consistency,
            "bh_family": self.bh_family,
        }

    def bootstrap_options(self) -> dict[str, Any]:
        """The keywords of stereolens.contextbias.bootstrap.level_replicates these settings
        give (but k_definition, which the common-support bootstrap leaves at its default)."""
        return {
            "replicates": self.replicates,
            "seed": self.seed,
            "draws": self.bootstrap_draws,
            "overall": self.overall,
            "single_label_bi": self.single_label_bi,
        }

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> ContextBiasSettings:
        """From a validated ``contextbias`` section (its preset applied, defaults filled)."""
        values = dict(section["metrics"])
        values["single_label_bi"] = float(values["single_label_bi"])
        return settings_from(cls, values)

    @classmethod
    def preset(cls, preset: str | dict | None = None) -> ContextBiasSettings:
        """The schema's defaults under ``preset`` (None: "paper")."""
        return cls.from_config(section_defaults("contextbias", preset))
