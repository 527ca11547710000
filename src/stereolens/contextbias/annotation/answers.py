"""Reading the annotators' CSV answers and the form's key, with labels normalised to the
schema's vocabulary (the shared reader: stereolens.annotation_form)."""

from __future__ import annotations

import os
from collections.abc import Iterable

import polars as pl

from stereolens.annotation_form import read_answers as _read_answers
from stereolens.contextbias.schema import AttributeSchema


def read_answers(
    answer_csvs: Iterable[str | os.PathLike],
    key: pl.DataFrame | str | os.PathLike,
    schema: AttributeSchema | None = None,
    max_errors: int = 20,
) -> pl.DataFrame:
    """The answer CSVs as one table (annotator, set_id, dimension, label, prevalence,
    source, row), validated against the key and the attribute ``schema``'s vocabularies
    (default: the shipped schema): annotation_form.read_answers, whose errors name the
    file, row and column."""
    schema = schema or AttributeSchema.load()
    return _read_answers(answer_csvs, key, schema.vocabulary(), max_errors)
