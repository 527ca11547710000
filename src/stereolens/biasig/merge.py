"""results/biasig/answers.parquet from the VQA shards, in two steps: one generator's shards into
``merged/{model}/answers.parquet``, then the parts concatenated in (model, variant) order."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import polars as pl

from stereolens.atomic import sink_parquet, write_parquet
from stereolens.biasig.answers import answer_vocabularies
from stereolens.jsonl_tables import check_keys, explain_failure, scan_jsonl
from stereolens.vocabulary import conform_columns

ANSWER_DTYPES: dict[str, pl.DataType] = {
    "model": pl.String,
    "prompt_id": pl.String,
    "image_id": pl.String,
    "position": pl.String,
    "gender": pl.String,
    "race": pl.String,
    "age": pl.String,
    "attempts": pl.Int64,
    "status": pl.String,
    "reason": pl.String,
    "response_sha256": pl.String,
    "prompt_version": pl.String,
    "vqa_model": pl.String,
    "vqa_revision": pl.String,
}
"""The columns of a VQA row that answers.parquet keeps (vqa.ROW_COLUMNS: these + NOT_MERGED)."""
NOT_MERGED = ("attempt_log",)
"""Row keys left in the shards: per-attempt detail, the same on every row of an image."""
SORT_KEYS = ("model", "variant", "prompt_id", "image_id", "position")
COLUMNS = [*sorted(ANSWER_DTYPES), "variant"]
"""Column order of answers.parquet."""


def base_models(registry: Mapping | None) -> dict[str, str]:
    """Registry name -> the base model a debiasing variant belongs to (``variant_of``)."""
    return {
        name: (spec.get("variant_of") if spec is not None else None) or name
        for name, spec in (registry or {}).items()
    }


def answers_frame(paths: Sequence[str | os.PathLike], registry: Mapping | None) -> pl.LazyFrame:
    """The answer rows of VQA shards ``paths`` as a lazy table (columns :data:`COLUMNS`):
    ``variant`` is the generator's registry name, ``model`` the base it belongs to."""
    check_keys(paths, ANSWER_DTYPES, NOT_MERGED, "stereolens.biasig.merge.ANSWER_DTYPES")
    base = base_models(registry)
    return (
        scan_jsonl(paths, ANSWER_DTYPES)
        .with_columns(
            pl.col("model").alias("variant"),
            pl.col("model").replace(base) if base else pl.col("model"),
        )
        .select(COLUMNS)
        .sort(*SORT_KEYS)
    )


def merge_model_answers(
    paths: Sequence[str | os.PathLike], out_path: str | os.PathLike, registry: Mapping | None
) -> dict[str, int]:
    """Write one generator's answers part; returns its row count per status."""
    paths = list(paths)
    try:
        frame = answers_frame(paths, registry).collect()
    except pl.exceptions.PolarsError as exc:
        raise explain_failure(paths, ANSWER_DTYPES, exc) from exc
    # the metrics CLI's rule, here too: positions and protected values read or refused
    where = f"answers of {len(paths)} VQA shard(s) ({paths[0] if paths else ''} ...)"
    frame = conform_columns(frame, answer_vocabularies(), where)
    variants = frame.select("model", "variant").unique()
    if variants.height > 1:
        raise ValueError(
            f"the VQA shards of one answers part hold {variants.height} generators "
            f"({sorted(variants['variant'].to_list())}); a part holds one"
        )
    write_parquet(out_path, frame)
    return dict(frame["status"].value_counts().sort("status").rows())


def _part_key(path: str | os.PathLike) -> tuple[str, str]:
    first = pl.scan_parquet(path).select("model", "variant").head(1).collect()
    return tuple(first.row(0)) if first.height else ("", "")


def merge_answer_parts(parts: Sequence[str | os.PathLike], out_path: str | os.PathLike) -> int:
    """Concatenate the generators' parts in (model, variant) order; returns the row count."""
    keyed = sorted((_part_key(p), str(p)) for p in parts)
    seen = [k for k, _ in keyed if k != ("", "")]
    if len(seen) != len(set(seen)):
        raise ValueError(f"two answers parts hold the same generator: {seen}")
    frames = [pl.scan_parquet(p) for _, p in keyed]
    table = (
        pl.concat(frames, how="vertical")
        if frames
        else pl.LazyFrame(schema={c: ANSWER_DTYPES.get(c, pl.String) for c in COLUMNS})
    )
    sink_parquet(out_path, table.select(COLUMNS))
    return pl.scan_parquet(out_path).select(pl.len()).collect().item()


def part_path(model: str) -> str:
    """Where the workflow writes a generator's answers part."""
    from stereolens.biasig.layout import LAYOUT

    return LAYOUT.path("merged", model=model)
