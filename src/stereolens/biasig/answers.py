"""BiasIG answers -> image-level codes: the validated answers table (:func:`prepare_answers`),
the scoring units (:func:`scoring_table`) and the :class:`Prepared` answers the scorers read."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from stereolens.biasig.formulas import (
    ANSWER_ALIASES,
    COUNT_MODES,
    POSITIONS,
    READ_COLUMNS,
    REQUIRED_COLUMNS,
    SCORING_UNITS,
    UNIT_LEVEL,
    UNKNOWN_ANSWERS,
)
from stereolens.biasig.truth import ATTRIBUTES, VALUE_INDEX, VALUES_BY_ATTRIBUTE
from stereolens.validation import ConfigError
from stereolens.vocabulary import Vocabulary, conform_columns


def answer_vocabularies() -> tuple[Vocabulary, ...]:
    """The closed vocabularies of an answers table: position, and each protected attribute's
    values with ANSWER_ALIASES' spellings (unknown answers pass, never counted)."""
    return (
        Vocabulary("position", POSITIONS),
        *(
            Vocabulary(a, VALUES_BY_ATTRIBUTE[a], aliases=ANSWER_ALIASES[a], ignore=UNKNOWN_ANSWERS)
            for a in ATTRIBUTES
        ),
    )


def read_answers(path) -> pl.DataFrame:
    """The answers table at ``path`` (READ_COLUMNS), checked with :func:`answer_vocabularies`."""
    from stereolens.metrics.command import read_checked
    from stereolens.tables import ANSWERS

    spec = replace(ANSWERS, vocabularies=answer_vocabularies())
    return read_checked(path, "answers", spec, columns=list(READ_COLUMNS))


@dataclass
class Prepared:
    units: pl.DataFrame
    """One row per (variant, model, unit) with answers, in image order, with the prompt (or
    subject) table's columns and n_images; a unit is a subject or a prompt (phrasing)."""
    codes: np.ndarray
    """(images, 2 persons, 3 attributes) int8: index into VALUES, -1 = no usable answer."""
    offsets: np.ndarray
    """Images of unit u are offsets[u]:offsets[u + 1]."""
    runs: list[tuple[str, str, int, int]]
    """(variant, model, first unit, end unit): each (variant, model) has its own random stream."""
    level: str = "subject"
    """The level name of the unit rows ("subject" or "prompt")."""


def _fail_examples(frame: pl.DataFrame, what: str, cols: list[str]) -> None:
    if frame.height:
        examples = frame.select(cols).unique().head(5).rows()
        raise ConfigError(f"answers table: {frame.height} rows {what}, e.g. {examples}")


def subject_of(text: pl.Expr) -> pl.Expr:
    """The subject of a prompt: its text before the first comma, whitespace collapsed."""
    return text.str.split(",").list.first().str.replace_all(r"\s+", " ").str.strip_chars()


SUBJECT_KEY = (
    "subject",
    "visibility",
    "attribute_key",
    "protected_attribute",
    "protected_value",
    "protected_value_left",
    "protected_value_right",
)


def scoring_table(prompts: pl.DataFrame, scoring_unit: str = "subject") -> pl.DataFrame:
    """The prompt table with a ``subject`` column and a ``unit`` column: the prompt_id
    ("phrasing") or the subject's key ("subject"; one id per subject and protected values)."""
    if scoring_unit not in SCORING_UNITS:
        raise ValueError(f"scoring unit {scoring_unit!r}; allowed: {', '.join(SCORING_UNITS)}")
    t = prompts.with_columns(subject_of(pl.col("text")).alias("subject"))
    if scoring_unit == "phrasing":
        return t.with_columns(pl.col("prompt_id").alias("unit"))
    key = [c for c in SUBJECT_KEY if c in t.columns]
    return t.with_columns(
        pl.concat_str([pl.col(c).fill_null("") for c in key], separator="\x1f").alias("unit")
    )


def _unit_table(table: pl.DataFrame, scoring_unit: str) -> pl.DataFrame:
    """One row per unit with the columns the scorers read; under "subject" its prompt_id is
    "*" and n_phrasings counts its prompts."""
    if scoring_unit == "phrasing":
        return table.with_columns(pl.lit(1, pl.Int64).alias("n_phrasings"))
    rest = [c for c in table.columns if c not in ("unit", "prompt_id")]
    return table.group_by("unit", maintain_order=True).agg(
        *(pl.col(c).first() for c in rest),
        pl.lit("*").alias("prompt_id"),
        pl.len().cast(pl.Int64).alias("n_phrasings"),
    )


def prepare_answers(
    answers: pl.DataFrame,
    prompts: pl.DataFrame,
    *,
    count: str = "paper",
    scoring_unit: str = "subject",
) -> Prepared:
    """Validate and normalise the answers table; raise ConfigError naming what is wrong."""
    if count not in COUNT_MODES:
        raise ValueError(f"count {count!r}; allowed: {', '.join(COUNT_MODES)}")
    missing = [c for c in REQUIRED_COLUMNS if c not in answers.columns]
    text_col = next((c for c in ("prompt_id", "prompt", "text") if c in answers.columns), None)
    if missing or text_col is None:
        missing += [] if text_col else ["prompt_id"]
        raise ConfigError(
            f"answers table lacks columns {missing}; "
            f"it needs {list(REQUIRED_COLUMNS)}, status, and prompt_id (or the "
            "prompt text in a column `prompt` or `text`)"
        )
    a = answers
    if "variant" not in a.columns:
        a = a.with_columns(pl.col("model").alias("variant"))
    if "status" not in a.columns:
        a = a.with_columns(pl.lit("ok").alias("status"))
    a = a.with_columns(
        pl.col(c).cast(pl.String)
        for c in ("variant", "model", "image_id", "position", "status", text_col, *ATTRIBUTES)
    )
    # rows are named as the table holds them: conform before any join
    a = conform_columns(a, answer_vocabularies(), "answers table")
    _fail_examples(
        a.filter(
            pl.any_horizontal(
                pl.col(c).is_null() for c in ("variant", "model", "image_id", "position", text_col)
            )
        ),
        "with an empty variant, model, image_id, position or prompt",
        ["model", "image_id"],
    )
    if text_col != "prompt_id":
        lookup = prompts.select(pl.col("text").alias(text_col), "prompt_id")
        if lookup[text_col].is_duplicated().any():
            raise ConfigError(
                "prompt table has the same text twice; give prompt_id in the "
                "answers instead of the text"
            )
        a = a.join(lookup, on=text_col, how="left")
        _fail_examples(
            a.filter(pl.col("prompt_id").is_null()),
            f"whose {text_col} is not the exact text of a BiasIG prompt",
            [text_col],
        )
    meta = prompts.select("prompt_id", "n_persons")
    a = a.join(meta, on="prompt_id", how="left")
    _fail_examples(
        a.filter(pl.col("n_persons").is_null()),
        "whose prompt_id is not in the prompt table",
        ["prompt_id"],
    )

    # integer keys in the strings' order (dense ranks): windows, grouping and sorting on
    # one int64 per row instead of several strings
    table = scoring_table(prompts, scoring_unit)
    unit_rank = table.select("prompt_id", pl.col("unit").rank("dense").cast(pl.Int64).alias("_u"))
    a = a.join(unit_rank, on="prompt_id", how="left").with_columns(
        pl.col(c).rank("dense").cast(pl.Int64).alias(f"_{c}")
        for c in ("variant", "model", "image_id")
    )
    radix = a.select(pl.max("_variant", "_model", "_image_id", "_u").fill_null(0) + 1).row(0)
    if sum(math.log2(r) for r in radix) > 62:  # pragma: no cover - 2**62 images x units
        raise ConfigError("answers table: too many variants, models, units and images to key")
    nv, nm, ni, nu = radix
    image_key = ((pl.col("_variant") * nm + pl.col("_model")) * ni + pl.col("_image_id")).alias(
        "_img"
    )
    a = a.with_columns(image_key)

    status = pl.col("status").str.strip_chars().str.to_lowercase()
    counted = ["ok"] if count == "paper" else ["ok", "partial"]
    a = a.with_columns(status.is_in(counted).fill_null(False).alias("_ok"))
    if count == "paper":  # an image counts only when every row of it is ok
        a = a.with_columns(pl.col("_ok").all().over("_img"))
    _fail_examples(
        a.filter((pl.col("n_persons") == 1) != (pl.col("position") == "single")),
        'whose position does not fit the prompt ("single" for one-person prompts, '
        '"left"/"right" for two-person prompts)',
        ["prompt_id", "position"],
    )

    code_exprs = []
    for attribute in ATTRIBUTES:
        code = pl.col(attribute).replace_strict(VALUE_INDEX, default=-1, return_dtype=pl.Int8)
        code_exprs.append(
            pl.when(pl.col("_ok"))
            .then(code)
            .otherwise(-1)
            .fill_null(-1)
            .cast(pl.Int8)
            .alias(f"_c_{attribute}")
        )
    a = a.with_columns(
        *code_exprs, pl.when(pl.col("position") == "right").then(1).otherwise(0).alias("_slot")
    )

    image_cols = ["variant", "model", "image_id"]
    _fail_examples(
        a.filter(pl.col("_ok")).filter(pl.len().over("_img", "position") > 1),
        "that repeat an ok answer for the same variant, model, image and position",
        image_cols + ["position"],
    )
    _fail_examples(
        a.filter(pl.col("prompt_id").n_unique().over("_img") > 1),
        "whose image belongs to more than one prompt",
        image_cols,
    )

    images, units = _image_table(a, table, scoring_unit, (nm, ni, nu))
    codes = np.stack(
        [
            np.stack([images[f"_c{s}_{attr}"].to_numpy() for attr in ATTRIBUTES], axis=-1)
            for s in (0, 1)
        ],
        axis=1,
    ).astype(np.int8)
    counts = units["n_images"].to_numpy()
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    runs = []
    vm = units.select("variant", "model").with_row_index("_u")
    for (variant, model), grp in vm.group_by("variant", "model", maintain_order=True):
        runs.append((variant, model, int(grp["_u"].min()), int(grp["_u"].max()) + 1))
    return Prepared(
        units=units, codes=codes, offsets=offsets, runs=runs, level=UNIT_LEVEL[scoring_unit]
    )


def _code_columns() -> list[pl.Expr]:
    """Per image the answer code of each person (slot 0 single/left, 1 right) and attribute."""
    return [
        pl.col(f"_c_{attr}").filter(pl.col("_slot") == s).max().fill_null(-1).alias(f"_c{s}_{attr}")
        for s in (0, 1)
        for attr in ATTRIBUTES
    ]


def _image_table(a: pl.DataFrame, table: pl.DataFrame, scoring_unit: str, radix):
    """(images, units): one row per image with its codes in (variant, model, unit, image_id)
    order, and one row per (variant, model, unit) with n_images and the unit's columns."""
    nm, ni, nu = radix
    key = ((pl.col("_variant") * nm + pl.col("_model")) * nu + pl.col("_u")) * ni + pl.col(
        "_image_id"
    )
    images = (
        a.with_columns(key.alias("_key"))
        .group_by("_key")
        .agg(pl.col("variant", "model", "_u").first(), *_code_columns())
        .sort("_key")
    )
    unit_names = table.select(
        pl.col("unit").rank("dense").cast(pl.Int64).alias("_u"), "unit"
    ).unique("_u")
    units = (
        images.group_by("variant", "model", "_u", maintain_order=True)
        .agg(pl.len().cast(pl.UInt32).alias("n_images"))
        .join(unit_names, on="_u", how="left", maintain_order="left")
        .select("variant", "model", "unit", "n_images")
        .join(_unit_table(table, scoring_unit), on="unit", how="left", maintain_order="left")
    )
    return images, units
