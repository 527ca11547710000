"""Where the shipped data files live (inside the package, so an installed
stereolens finds them without the repository)."""

from __future__ import annotations

from pathlib import Path

RESOURCES = Path(__file__).resolve().parent / "resources"


def resource(*parts: str) -> Path:
    """Path of a shipped data file, e.g. resource("contextbias", "prompts.json")."""
    path = RESOURCES.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"shipped resource {path} is missing; reinstall stereolens")
    return path
