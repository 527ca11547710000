"""Group names of the LVLM audit and their path-safe forms. Import-light: the Snakefile
imports this at parse time."""

from __future__ import annotations

import re

GENDERS: tuple[str, ...] = ("female", "male")
RACES: tuple[str, ...] = (
    "Black",
    "East Asian",
    "Indian",
    "White",
    "Latino_Hispanic",
    "Middle Eastern",
    "Southeast Asian",
)
AXES: dict[str, tuple[str, ...]] = {"gender": GENDERS, "race": RACES}
SETTINGS: tuple[str, ...] = ("image", "mitigation", "persona")
ALL_TASKS: tuple[str, ...] = ("story", "term", "exam", "attribute_inferring")

_SLUG_RE = re.compile(r"[^a-z0-9_]+")


def group_slug(group: str) -> str:
    """Path-safe group name ("East Asian" -> "east-asian", "Latino_Hispanic" ->
    "latino_hispanic"), so group names never need quoting in paths or on a command line."""
    return _SLUG_RE.sub("-", group.lower()).strip("-")


def group_from_slug(axis: str, slug: str) -> str:
    for g in AXES[axis]:
        if group_slug(g) == slug:
            return g
    raise ValueError(f"no {axis} group with path name {slug!r}")


def groups(lv: dict, axis: str) -> list[str]:
    """The groups tested on ``axis`` (lvlm.groups or every group of the axis)."""
    return list(lv["groups"].get(axis) or AXES[axis])


def table_vocabularies(group_columns: tuple[str, ...] = ("group",)) -> tuple:
    """The closed vocabularies of an LVLM table (stereolens.tables.Vocabulary): setting,
    task, axis, and each of ``group_columns`` among its axis's groups (lvlm.groups names a
    subset of these; a table holds the groups of the run that wrote it)."""
    from stereolens.vocabulary import Vocabulary

    return (
        Vocabulary("setting", SETTINGS),
        Vocabulary("task", ALL_TASKS),
        Vocabulary("axis", tuple(AXES)),
        *(Vocabulary(c, AXES, by="axis") for c in group_columns),
    )
