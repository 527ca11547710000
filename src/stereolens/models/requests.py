"""What a request to a model is, and what a backend must answer: VLMRequest and the VLM
protocol (vision-language and text models), GenerationItem and the Generator protocol
(text-to-image models)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from stereolens.ids import sha256_bytes


@dataclass(frozen=True)
class VLMRequest:
    """One single-turn conversation: optional system text, an optional image, user text.

    Every retry is a fresh VLMRequest: no history is carried between attempts.
    """

    text: str
    """User text."""
    image_path: str | None = None
    """Image attached to the user turn (PNG/JPEG path), or None for text-only."""
    system: str | None = None
    """System prompt, or None."""
    json_schema: dict[str, Any] | None = None
    """Constrain the answer to JSON matching this schema (None = free text)."""
    choices: tuple[str, ...] | None = None
    """Constrain the answer to exactly one of these strings (None = free text)."""
    max_new_tokens: int = 1024
    temperature: float = 0.0
    seed: int | None = 0
    attempt: int = 1
    """1-based attempt number; part of the cache key so a retry is a new request."""

    def cache_key(self, model_fingerprint: dict[str, Any], image_sha256: str | None) -> str:
        """sha256 of the full request (the image by its content hash) and the model."""
        payload = asdict(self)
        payload["image_path"] = None
        payload["image_sha256"] = image_sha256
        payload["model"] = model_fingerprint
        return sha256_bytes(json.dumps(payload, sort_keys=True, default=str).encode())


class VLM(Protocol):
    """A loaded vision-language model. Constructed from a registry ModelSpec."""

    def answer(self, requests: list[VLMRequest]) -> list[Any]:
        """Per request, in order: the raw text answer (a refusal or empty output too), an
        ItemFailure when this request cannot be asked, or a BackendFailure (also raised for
        the whole backend) for a failure outside the model (see stereolens.models.ask)."""
        ...


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
