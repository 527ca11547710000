"""The jinja2 environment every HTML page of stereolens is rendered with (the report, its
gallery pages, the ContextBias annotation form): HTML autoescaped, an undefined name an
error (a template typo fails the render, not the reader)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jinja2


def environment(
    *search_paths: str | Path, filters: Mapping[str, Callable[..., Any]] | None = None
) -> jinja2.Environment:
    """A jinja2 environment loading templates from ``search_paths`` (first match wins)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(p) for p in search_paths]),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(filters or {})
    return env


def render_template(name: str, *search_paths: str | Path, **values: Any) -> str:
    """The template ``name`` (found in ``search_paths``) rendered with ``values``."""
    return environment(*search_paths).get_template(name).render(**values)
