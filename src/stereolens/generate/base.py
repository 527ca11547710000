"""What a text-to-image backend must provide, and what one shard of work is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class GenerationItem:
    """One image to make."""

    image_id: str
    """Stable id: stable_id(model, prompt_id, seed)."""
    prompt_id: str
    """Stable id of the prompt text (see stereolens.contextbias.prompts)."""
    text: str
    """Prompt as the benchmark states it (cleaned); the backend adds the style prefix."""
    seed: int
    """Seed of this image's own torch.Generator."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Benchmark fields carried into the metadata (role, condition, ...)."""


class Generator(Protocol):
    """A loaded text-to-image model. Constructed from a registry ModelSpec (loads weights)."""

    def generate(self, prompts: list[str], seeds: list[int]) -> list[Any]:
        """One PIL image per (prompt, seed); image k depends only on prompts[k] and seeds[k]."""
        ...

    def settings(self) -> dict[str, Any]:
        """The resolved settings that determine the images (for per-image metadata)."""
        ...
