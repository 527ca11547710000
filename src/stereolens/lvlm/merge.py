"""The merged LVLM tables (results/lvlm/{responses,story_attributes,stories,term_judgements}
.parquet), in two steps: one audited model's files into ``merged/{model}/``, then the parts
concatenated in model order, streamed."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import polars as pl

from stereolens.atomic import sink_parquet, write_parquet
from stereolens.jsonl_tables import check_keys, explain_failure, scan_jsonl
from stereolens.lvlm.names import table_vocabularies
from stereolens.vocabulary import conform_parquet

RESPONSE_DTYPES: dict[str, pl.DataType] = {
    "model": pl.String,
    "setting": pl.String,
    "task": pl.String,
    "axis": pl.String,
    "group": pl.String,
    "shard": pl.Int64,
    "image_id": pl.String,
    "file": pl.String,
    "stratum": pl.String,
    "gender": pl.String,
    "race": pl.String,
    "age": pl.String,
    "prompt_id": pl.String,
    "request": pl.String,
    "response": pl.String,
    "status": pl.String,
    "attempts": pl.Int64,
    "cached": pl.Boolean,
    "seconds": pl.Float64,
    "request_key": pl.String,
    "prompts_version": pl.Int64,
    "prompts_sha256": pl.String,
    "subject": pl.String,
    "answer": pl.String,
    "domain": pl.String,
    "term": pl.String,
    "choice": pl.String,
    "correct": pl.Boolean,
}
"""A response record of stereolens.lvlm.respond.respond_shard."""
STORY_DTYPES: dict[str, pl.DataType] = {
    "model": pl.String,
    "setting": pl.String,
    "axis": pl.String,
    "group": pl.String,
    "shard": pl.Int64,
    "image_id": pl.String,
    "prompt_id": pl.String,
    "assistant": pl.String,
    "status": pl.String,
    "attempts": pl.Int64,
    "cached": pl.Boolean,
    "response_sha256": pl.String,
    "pairs": pl.List(pl.List(pl.String)),
}
"""A story record of stereolens.lvlm.assistant.extract_story_shard."""
KEYS = ["model", "setting", "task", "axis", "group", "image_id", "prompt_id"]
"""The response key the refusal labels are joined on."""
STORY_ATTRIBUTE_COLUMNS = ["model", "setting", "axis", "group", "image_id", "prompt_id"]
TABLES = ("responses", "story_attributes", "stories", "term_judgements")


def _nonempty_parquet(paths: Sequence[str | os.PathLike]) -> list[pl.LazyFrame]:
    frames = []
    for p in paths:
        lf = pl.scan_parquet(p)
        if lf.collect_schema().len() and lf.select(pl.len()).collect().item():
            frames.append(lf)
    return frames


def responses_frame(
    response_paths: Sequence[str | os.PathLike], refusal_paths: Sequence[str | os.PathLike]
) -> pl.LazyFrame:
    """The responses of ``response_paths`` (columns: the record keys sorted) with the
    refusal labels of ``refusal_paths`` joined on the response key."""
    check_keys(response_paths, RESPONSE_DTYPES, (), "stereolens.lvlm.merge.RESPONSE_DTYPES")
    responses = scan_jsonl(response_paths, RESPONSE_DTYPES).select(sorted(RESPONSE_DTYPES))
    labels = _nonempty_parquet(refusal_paths)
    if not labels:
        return responses
    return responses.join(
        pl.concat(labels, how="diagonal_relaxed"), on=KEYS, how="left", maintain_order="left"
    )


def story_tables(story_paths: Sequence[str | os.PathLike]) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(story_attributes, stories) of the assistant's story records."""
    check_keys(story_paths, STORY_DTYPES, (), "stereolens.lvlm.merge.STORY_DTYPES")
    records = scan_jsonl(story_paths, STORY_DTYPES)
    attributes = (
        records.filter(pl.col("status") == "ok")
        .select(*STORY_ATTRIBUTE_COLUMNS, "pairs")
        .explode("pairs")
        .filter(pl.col("pairs").is_not_null())
        .with_columns(
            pl.col("pairs").list.get(0).alias("attribute"),
            pl.col("pairs").list.get(1).alias("value"),
        )
        .select(*STORY_ATTRIBUTE_COLUMNS, "attribute", "value")
    )
    stories = records.select(sorted(c for c in STORY_DTYPES if c != "pairs"))
    return attributes, stories


def merge_model_tables(
    *,
    response_paths: Sequence[str | os.PathLike],
    refusal_paths: Sequence[str | os.PathLike],
    story_paths: Sequence[str | os.PathLike],
    judgement_paths: Sequence[str | os.PathLike],
    out: Mapping[str, str | os.PathLike],
) -> dict[str, int]:
    """Write one model's part of each table (``out``: table name -> path); returns the
    row counts."""
    try:
        sink_parquet(out["responses"], responses_frame(response_paths, refusal_paths))
    except pl.exceptions.PolarsError as exc:
        raise explain_failure(response_paths, RESPONSE_DTYPES, exc) from exc
    if story_paths:
        try:
            attributes, stories = story_tables(story_paths)
            sink_parquet(out["story_attributes"], attributes)
            sink_parquet(out["stories"], stories)
        except pl.exceptions.PolarsError as exc:
            raise explain_failure(story_paths, STORY_DTYPES, exc) from exc
    else:
        write_parquet(out["story_attributes"], _empty_story_attributes())
        write_parquet(out["stories"], pl.DataFrame())
    judged = _nonempty_parquet(judgement_paths)
    judgements = pl.concat(judged, how="diagonal_relaxed") if judged else pl.LazyFrame()
    sink_parquet(out["term_judgements"], judgements) if judged else write_parquet(
        out["term_judgements"], pl.DataFrame()
    )
    # the metrics CLI's rule, here too: settings, tasks, axes and groups read or refused
    for name, vocabularies in _vocabularies().items():
        conform_parquet(out[name], vocabularies, f"{name} part {out[name]}")
    return {name: pl.scan_parquet(out[name]).select(pl.len()).collect().item() for name in TABLES}


def _vocabularies() -> dict[str, tuple]:
    return {
        "responses": table_vocabularies(),
        "story_attributes": table_vocabularies(),
        "term_judgements": table_vocabularies(("group_a", "group_b", "winner")),
    }


def _empty_story_attributes() -> pl.DataFrame:
    return pl.DataFrame(
        schema={c: pl.String for c in [*STORY_ATTRIBUTE_COLUMNS, "attribute", "value"]}
    )


def merge_model_parts(
    parts: Mapping[str, Mapping[str, str | os.PathLike]], out: Mapping[str, str | os.PathLike]
) -> dict[str, int]:
    """Concatenate the models' parts (``parts``: model -> table name -> path) in model
    order into the merged tables; returns their row counts."""
    counts = {}
    for name in TABLES:
        frames = _nonempty_parquet([parts[m][name] for m in sorted(parts)])
        if frames:
            sink_parquet(out[name], pl.concat(frames, how="diagonal_relaxed"))
        else:
            empty = _empty_story_attributes() if name == "story_attributes" else pl.DataFrame()
            write_parquet(out[name], empty)
        counts[name] = pl.scan_parquet(out[name]).select(pl.len()).collect().item()
    return counts


def part_paths(model: str) -> dict[str, str]:
    """Where the workflow writes a model's part of each merged table."""
    from stereolens.lvlm.layout import LAYOUT

    return {name: LAYOUT.path("merged", model=model, table=name) for name in TABLES}
