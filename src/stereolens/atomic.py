"""Atomic file writes: a reader (or a rerun after a kill) never sees half a file.
Everything goes to a temporary sibling and is moved into place with os.replace."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it into place on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp creates 0600; give the file the mode a plain open() would
        os.chmod(tmp_path, 0o666 & ~_UMASK)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextmanager
def atomic_dir(path: str | os.PathLike, keep_existing: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``, moved into place on success (over a
    folder there, unless ``keep_existing``; one another process moves there first wins)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp makes it private; give it a plain mkdir's mode
    old = None
    try:
        yield tmp
        if path.exists():
            if keep_existing:
                return
            # rename(2) replaces only an empty folder: move the old one aside, then drop it
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old)
        try:
            os.replace(tmp, path)
        except OSError:
            if not path.is_dir():
                raise
    finally:
        for leftover in (tmp, old):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: object) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_jsonl(path: str | os.PathLike, rows: list[dict]) -> None:
    write_text(
        path, "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)
    )


def write_parquet(path: str | os.PathLike, frame) -> None:
    """Write a polars DataFrame atomically."""
    with atomic_path(path, suffix=".parquet") as tmp:
        frame.write_parquet(tmp)


def write_parquet_or_csv(path: str | os.PathLike, frame) -> None:
    """Write a polars DataFrame atomically: CSV for a .csv suffix, else parquet."""
    csv = Path(path).suffix.lower() == ".csv"
    with atomic_path(path, suffix=".csv" if csv else ".parquet") as tmp:
        if csv:
            frame.write_csv(tmp)
        else:
            frame.write_parquet(tmp)


def sink_parquet(path: str | os.PathLike, frame) -> None:
    """Write a polars LazyFrame atomically, streamed (never whole in memory unless a sort)."""
    with atomic_path(path, suffix=".parquet") as tmp:
        frame.sink_parquet(tmp)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSON-lines file written by :func:`write_jsonl`.

    Lines are split on "\\n" only: str.splitlines() would also split inside a value
    holding U+2028 or other Unicode line breaks, which json.dumps leaves unescaped.
    """
    rows = []
    with open(path, encoding="utf-8", newline="\n") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{path}:{n} is not valid JSON ({exc}): the file is damaged. Regenerate "
                    f"it and what was made from it: stereolens regenerate --shard {path} "
                    "--configfile <your config>"
                ) from exc
    return rows
