"""JSON-lines shards read as tables by polars' native scanner with an explicit schema, and
:func:`check_keys`, which fails on a record key the schema does not name (docs/architecture.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import polars as pl

from stereolens.atomic import read_jsonl


def _first_record(path: Path) -> dict | None:
    with open(path, encoding="utf-8", newline="\n") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{path}:{n} is not valid JSON ({exc}); delete the file and rerun the job "
                    "that wrote it"
                ) from exc
            if not isinstance(value, dict):
                raise ValueError(f"{path}:{n} is not a JSON object")
            return value
    return None


def check_keys(
    paths: Iterable[str | os.PathLike],
    schema: Mapping[str, pl.DataType],
    dropped: Sequence[str] = (),
    where: str = "the merge's schema",
) -> None:
    """Fail when the first record of a file has a key that is neither in ``schema`` nor in
    ``dropped`` (keys read on purpose into no column)."""
    known = set(schema) | set(dropped)
    for path in paths:
        record = _first_record(Path(path))
        if record is None:
            continue
        unknown = sorted(set(record) - known)
        if unknown:
            raise ValueError(
                f"{path}: record key(s) {unknown} are not in {where}; add them there (with "
                "their type) so that the merged table keeps them"
            )


def scan_jsonl(
    paths: Sequence[str | os.PathLike], schema: Mapping[str, pl.DataType]
) -> pl.LazyFrame:
    """All rows of ``paths`` (in order) with exactly the columns of ``schema``; a key a
    record lacks is null. Empty files hold no rows."""
    files = [str(p) for p in paths if os.path.getsize(p) > 0]
    if not files:
        return pl.LazyFrame(schema=dict(schema))
    return pl.scan_ndjson(files, schema=dict(schema))


def explain_failure(
    paths: Sequence[str | os.PathLike], schema: Mapping[str, pl.DataType], exc: Exception
) -> Exception:
    """A clear error for a scan that failed: find the file and line that does not parse or
    does not fit the schema (slow path, taken only after a failure)."""
    for path in paths:
        rows = read_jsonl(path)  # raises naming path:line for broken JSON
        try:
            pl.DataFrame(rows, schema=dict(schema), strict=False)
            got = pl.DataFrame(rows, infer_schema_length=None)
        except Exception as inner:  # noqa: BLE001 - reported with the file name
            return ValueError(f"{path}: {inner}")
        for name, dtype in schema.items():
            if name in got.columns and got[name].dtype not in (dtype, pl.Null):
                try:
                    got[name].cast(dtype, strict=True)
                except Exception:  # noqa: BLE001
                    return ValueError(
                        f"{path}: column {name!r} holds {got[name].dtype} values, the merge "
                        f"expects {dtype}"
                    )
    return ValueError(f"reading {len(paths)} JSON-lines file(s) failed: {exc}")
