"""The LVLM audit's metric settings: one frozen object from the validated config section."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from stereolens.settings import section_defaults, settings_from


@dataclass(frozen=True)
class LVLMSettings:
    """The keys of ``lvlm.metrics`` and the section's ``seed`` (the schema describes each)."""

    min_count: int
    replicates: int
    seed: int
    level: float
    permutations: int
    interval_min_images_per_group: int
    formulas: MappingProxyType
    """Task -> formula name (stereolens.lvlm.scores.FORMULAS); tasks not named use the
    default formula."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "formulas", MappingProxyType(dict(self.formulas)))

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> LVLMSettings:
        """From a validated ``lvlm`` section (its preset applied, defaults filled)."""
        return settings_from(cls, dict(section["metrics"], seed=section["seed"]))

    @classmethod
    def preset(cls, preset: str | dict | None = None) -> LVLMSettings:
        """The schema's defaults under ``preset`` (None: "paper")."""
        return cls.from_config(section_defaults("lvlm", preset))
