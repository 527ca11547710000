"""Damaged tables: a structural check of a results folder's parquet and JSON-lines files,
a few bytes per file, and the message naming a damaged file and the command that mends it
(docs/troubleshooting.md says what is checked and why not checksums)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from stereolens.validation import ConfigError

TABLE_SUFFIXES = (".parquet", ".jsonl")
"""The table files the checks look at (others are skipped)."""

SKIPPED_FOLDERS = ("images", "cache")
"""Folders directly under results/<benchmark>/ or results/ that the scan of a results
folder does not enter."""

REGENERATING_ENV = "STEREOLENS_REGENERATING"
"""Set by ``stereolens regenerate`` for its Snakemake runs: the parse-time scan then warns
instead of refusing (the regeneration is what mends the files)."""


class DamagedTable(ConfigError):
    """One or more table files are damaged; the message names them and how to mend them."""

    def __init__(self, message: str, paths: list[str]):
        super().__init__(message)
        self.paths = paths


def problem(path: str | os.PathLike) -> str | None:
    """What is wrong with the table file ``path`` (None: nothing this check can see, or
    not a table file; a missing file is not damaged)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        return None
    try:
        size = path.stat().st_size
        if suffix == ".jsonl":
            if size == 0:
                return None
            with path.open("rb") as fh:
                fh.seek(-1, os.SEEK_END)
                last = fh.read(1)
            return (
                None
                if last == b"\n"
                else "its last line is not valid JSON: cut short, no final newline"
            )
        if size < 12:
            return f"{size} bytes, too short for a parquet file"
        with path.open("rb") as fh:
            head = fh.read(4)
            fh.seek(-8, os.SEEK_END)
            tail = fh.read(8)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if head != b"PAR1":
        return "it does not start with parquet's magic bytes (not a parquet file)"
    if tail[4:] != b"PAR1":
        return "it does not end with parquet's footer (truncated?)"
    footer = int.from_bytes(tail[:4], "little")
    if footer + 12 > size:
        return f"its footer claims {footer} bytes of a {size}-byte file (truncated?)"
    return None


def in_results(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies in a results/ folder (an output of the workflow)."""
    return "results" in Path(path).parts


def mend_hint(path: str | os.PathLike, configfile: str | None = None) -> str:
    """How to mend the file: the regenerate command for a workflow output, else advice."""
    if not in_results(path):
        return "write it again from its source"
    config = f" --configfile {configfile}" if configfile else " --configfile <the run's config>"
    return (
        f"mend it and everything made from it with `stereolens regenerate --shard {path}"
        f"{config}` (or delete it if no output of this config needs it)"
    )


def message(found: list[tuple[str, str]], configfile: str | None = None) -> str:
    lines = [f"{p}: damaged, {why}; {mend_hint(p, configfile)}" for p, why in found[:20]]
    more = f"\n  (+{len(found) - 20} more)" if len(found) > 20 else ""
    what = "a damaged table" if len(found) == 1 else f"{len(found)} damaged tables"
    return f"{what}:\n  " + "\n  ".join(lines) + more


def check_files(paths: Iterable[str | os.PathLike]) -> list[tuple[str, str]]:
    """(path, problem) of every damaged table file among ``paths``."""
    out = []
    for p in paths:
        why = problem(p)
        if why is not None:
            out.append((str(p), why))
    return out


def require_intact(paths: Iterable[str | os.PathLike], configfile: str | None = None) -> None:
    """Raise DamagedTable naming every damaged table file among ``paths``."""
    found = check_files(paths)
    if found:
        raise DamagedTable(message(found, configfile), [p for p, _ in found])


def table_files(root: str | os.PathLike = "results") -> Iterable[Path]:
    """Every parquet and JSON-lines file under ``root``, outside the generation shards and
    the caches (SKIPPED_FOLDERS at the first two levels) and the writers' temporary files."""
    root = Path(root)
    if not root.is_dir():
        return
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if depth <= 1 and entry.name in SKIPPED_FOLDERS:
                    continue
                stack.append((Path(entry.path), depth + 1))
            elif entry.name.endswith(TABLE_SUFFIXES) and not entry.name.startswith("."):
                yield Path(entry.path)


def scan(root: str | os.PathLike = "results") -> list[tuple[str, str]]:
    """(path, problem) of every damaged table of a results folder."""
    return check_files(table_files(root))


def read_failure(path: str | os.PathLike, exc: BaseException, what: str = "table") -> ConfigError:
    """The error to raise when reading ``path`` failed with ``exc``: DamagedTable (with the
    mend command) when the file is damaged or lies in a results folder, else a ConfigError
    naming the file and the reader's complaint."""
    kind = Path(path).suffix.lower().lstrip(".")
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
    why = problem(path)
    if why is None and not in_results(path):
        return ConfigError(f"{what} {path} cannot be read as {kind}: {said}")
    why = why or f"the reader says: {said}"
    return DamagedTable(
        f"{what} {path} cannot be read as {kind}: damaged, {why}; {mend_hint(path)}",
        [str(path)],
    )
