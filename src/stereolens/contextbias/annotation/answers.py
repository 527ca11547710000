"""Reading the annotators' CSV answers and the form's key, with labels normalised to the
schema's vocabulary."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable
from pathlib import Path

import polars as pl

from stereolens.contextbias.annotation.columns import (
    CSV_COLUMNS,
    MAX_DESCRIPTOR_CHARS,
    UNKNOWN,
    UNKNOWN_TEXT,
)
from stereolens.contextbias.schema import NOT_LABELS, AttributeSchema


def read_key(key: pl.DataFrame | str | os.PathLike) -> pl.DataFrame:
    """The key (a DataFrame or the path of key.parquet), checked."""
    frame = key if isinstance(key, pl.DataFrame) else pl.read_parquet(key)
    missing = [c for c in ("set_id", "n_images", "image_ids", "dimensions") if c not in frame]
    if missing:
        raise ValueError(f"annotation key lacks columns {missing}; is it a key.parquet?")
    if frame.height == 0:
        raise ValueError("annotation key has no sets")
    if frame["set_id"].is_duplicated().any():
        raise ValueError("annotation key has duplicate set ids")
    return frame


def _key_dimensions(key: pl.DataFrame) -> list[str]:
    return list(dict.fromkeys(d for ds in key["dimensions"].to_list() for d in ds))


def _normalise(text: str) -> str:
    return " ".join(str(text).strip().lower().split())


def normalise_label(text: str, vocabulary: tuple[str, ...] | None) -> str | None:
    """A human answer as a label: lower-cased, whitespace collapsed; unknown, none, not
    visible and "unknown / not visible" become ``unknown``. For a closed vocabulary spaces
    may stand for underscores ("young adult"); returns None when the label is not in it."""
    label = _normalise(text)
    if label in NOT_LABELS or label in ("not visible", UNKNOWN_TEXT, "n/a"):
        return UNKNOWN
    if vocabulary is None:
        return label
    if label in vocabulary:
        return label
    underscored = label.replace(" ", "_")
    return underscored if underscored in vocabulary else None


def read_answers(
    answer_csvs: Iterable[str | os.PathLike],
    key: pl.DataFrame | str | os.PathLike,
    schema: AttributeSchema | None = None,
    max_errors: int = 20,
) -> pl.DataFrame:
    """The answer CSVs as one table (annotator, set_id, dimension, label, prevalence,
    source, row), validated against the key.

    Every problem names the file, the row (line number, header = 1) and the column: missing
    columns, an empty annotator, a set id not in the key, a dimension not asked, a label
    outside the dimension's vocabulary or a descriptor longer than 60 characters, a
    prevalence that is not a number from 0 to the set's image count, and the same
    annotator answering one item twice. All problems (up to ``max_errors`` listed) are
    raised together as one ValueError."""
    key = read_key(key)
    schema = schema or AttributeSchema.load()
    vocab = schema.vocabulary()
    n_images = dict(zip(key["set_id"].to_list(), key["n_images"].to_list(), strict=True))
    dims = set(_key_dimensions(key))
    errors: list[str] = []
    rows: list[dict] = []
    seen: dict[tuple[str, str, str], str] = {}
    paths = [Path(p) for p in answer_csvs]
    if not paths:
        raise ValueError("no answer files given")
    for path in paths:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = [(h or "").strip() for h in (reader.fieldnames or [])]
            missing = [c for c in CSV_COLUMNS if c not in header]
            if missing:
                errors.append(
                    f"{path}: missing columns {missing} (header {header}); "
                    f"expected {', '.join(CSV_COLUMNS)}"
                )
                continue
            reader.fieldnames = header
            n_rows = 0
            for rec in reader:
                n_rows += 1
                where = f"{path}, row {reader.line_num}"

                def bad(column: str, problem: str, where: str = where) -> None:
                    errors.append(f"{where}, column '{column}': {problem}")

                annotator = (rec.get("annotator") or "").strip()
                set_id = (rec.get("set_id") or "").strip()
                dimension = (rec.get("dimension") or "").strip()
                raw_label = rec.get("label") or ""
                raw_prev = (rec.get("prevalence") or "").strip()
                ok = True
                if not annotator:
                    bad("annotator", "empty")
                    ok = False
                if set_id not in n_images:
                    bad("set_id", f"unknown set id {set_id!r} (not in this sample's key)")
                    ok = False
                if dimension not in dims:
                    bad("dimension", f"{dimension!r} was not asked; asked: {sorted(dims)}")
                    ok = False
                label = None
                if dimension in dims:
                    if not raw_label.strip():
                        bad("label", f"empty; write {UNKNOWN!r} for not visible")
                        ok = False
                    else:
                        label = normalise_label(raw_label, vocab.get(dimension))
                        if label is None:
                            bad(
                                "label",
                                f"{raw_label!r} is not a {dimension} label; allowed: "
                                f"{', '.join(vocab[dimension])}, {UNKNOWN}",
                            )
                            ok = False
                        elif len(label) > MAX_DESCRIPTOR_CHARS:
                            bad("label", f"longer than {MAX_DESCRIPTOR_CHARS} characters")
                            ok = False
                try:
                    prevalence = float(raw_prev)
                    if not math.isfinite(prevalence):
                        raise ValueError
                except ValueError:
                    bad("prevalence", f"{raw_prev!r} is not a number")
                    ok = False
                else:
                    top = n_images.get(set_id, 10)
                    if not 0 <= prevalence <= top:
                        bad("prevalence", f"{raw_prev} is outside 0-{top}")
                        ok = False
                if not ok:
                    continue
                item = (annotator, set_id, dimension)
                if item in seen:
                    bad(
                        "set_id", f"{annotator} answered {set_id}/{dimension} before ({seen[item]})"
                    )
                    continue
                seen[item] = where
                rows.append(
                    {
                        "annotator": annotator,
                        "set_id": set_id,
                        "dimension": dimension,
                        "label": label,
                        "prevalence": prevalence,
                        "source": str(path),
                        "row": reader.line_num,
                    }
                )
            if n_rows == 0:
                errors.append(f"{path}: no answers (only a header)")
    if errors:
        shown = "\n  ".join(errors[:max_errors])
        more = f"\n  ... and {len(errors) - max_errors} more" if len(errors) > max_errors else ""
        raise ValueError(f"{len(errors)} problems in the answer files:\n  {shown}{more}")
    return pl.DataFrame(
        rows,
        schema={
            "annotator": pl.String,
            "set_id": pl.String,
            "dimension": pl.String,
            "label": pl.String,
            "prevalence": pl.Float64,
            "source": pl.String,
            "row": pl.Int64,
        },
    )


# ============================================================================ pipeline
