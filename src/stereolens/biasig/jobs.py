"""The body of one BiasIG generation or VQA job; :func:`generation_items` is this benchmark's
adapter to the shared generation job. Heavy imports happen only inside."""

from __future__ import annotations

import math

import polars as pl

from stereolens.atomic import write_jsonl
from stereolens.ids import stable_id
from stereolens.models.job import ModelJob

ACQUIRED_TYPES = ("occupation", "characteristic", "social_relation")
CONDITIONS = ("implicit", "explicit")
CARRIED_KEYS = (
    "image_id",
    "prompt_id",
    "seed",
    "image_index",
    "model",
    "revision",
    "acquired_type",
    "condition",
    "n_persons",
    "prompt",
    "image_sha256",
)
"""Metadata keys of a generated image passed on to the VQA."""


def _selection(prompts: pl.DataFrame, acquired_type: str, condition: str) -> pl.DataFrame:
    if acquired_type not in ACQUIRED_TYPES:
        raise ValueError(f"acquired_type must be one of {ACQUIRED_TYPES}, got {acquired_type!r}")
    if condition not in CONDITIONS:
        raise ValueError(f"condition must be one of {CONDITIONS}, got {condition!r}")
    return prompts.filter(
        (pl.col("acquired_type") == acquired_type) & (pl.col("visibility") == condition)
    ).sort("prompt_id", maintain_order=True)


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def n_shards(
    prompts: pl.DataFrame, acquired_type: str, condition: str, prompts_per_shard: int
) -> int:
    """How many generation jobs the prompts of (acquired_type, condition) make."""
    _check_positive("prompts_per_shard", prompts_per_shard)
    return math.ceil(_selection(prompts, acquired_type, condition).height / prompts_per_shard)


def image_seed(prompt_id: str, image_index: int, seed_base: int = 0, salt: int = 0) -> int:
    """Stable seed (below 2**31) of a prompt's image_index-th image, the same for every model."""
    parts = ("biasig-seed", seed_base, prompt_id, image_index) + ((salt,) if salt else ())
    return int(stable_id(*parts), 16) % (2**31)


def biasig_shard_items(
    prompts: pl.DataFrame,
    model: str,
    acquired_type: str,
    condition: str,
    shard: int,
    prompts_per_shard: int,
    images_per_prompt: int,
    seed_base: int = 0,
) -> list[dict]:
    """The images of one generation job, as GenerationItem keyword dicts: the prompts
    [shard * prompts_per_shard, (shard + 1) * prompts_per_shard) of (acquired_type,
    condition = the prompt table's ``visibility``) sorted by prompt_id, each with
    ``images_per_prompt`` seeds; empty past the last shard. image_id = stable_id(model,
    prompt_id, seed)."""
    _check_positive("prompts_per_shard", prompts_per_shard)
    _check_positive("images_per_prompt", images_per_prompt)
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
        raise ValueError(f"shard must be a non-negative integer, got {shard!r}")
    block = _selection(prompts, acquired_type, condition).slice(
        shard * prompts_per_shard, prompts_per_shard
    )
    items = []
    for row in block.select("prompt_id", "text", "n_persons").iter_rows(named=True):
        used: set[int] = set()
        for image_index in range(images_per_prompt):
            salt = 0
            seed = image_seed(row["prompt_id"], image_index, seed_base)
            while seed in used:  # a 2**31 collision within one prompt: vanishingly rare
                salt += 1
                seed = image_seed(row["prompt_id"], image_index, seed_base, salt)
            used.add(seed)
            items.append(
                {
                    "image_id": stable_id(model, row["prompt_id"], seed),
                    "prompt_id": row["prompt_id"],
                    "text": row["text"],
                    "seed": seed,
                    "extra": {
                        "acquired_type": acquired_type,
                        "condition": condition,
                        "n_persons": int(row["n_persons"]),
                        "image_index": image_index,
                    },
                }
            )
    return items


def generation_items(
    prompts_path: str | None,
    model: str,
    acquired_type: str,
    condition: str,
    shard: int,
    settings: dict,
    config: dict | None = None,
) -> list[dict]:
    """The plug-in's generation_items: :func:`biasig_shard_items` of the prompt table at
    ``prompts_path`` (None = the shipped prompts) under ``settings`` (prompts_per_shard,
    images_per_prompt, seed_base)."""
    from stereolens.biasig.prompts import load_prompts, read_prompt_table

    prompts = read_prompt_table(prompts_path) if prompts_path else load_prompts()
    per_shard = settings["prompts_per_shard"]
    items = biasig_shard_items(
        prompts,
        model,
        acquired_type,
        condition,
        shard,
        per_shard,
        settings["images_per_prompt"],
        settings.get("seed_base", 0),
    )
    if not items:
        raise ValueError(
            f"no prompts for {acquired_type} {condition} shard {shard} "
            f"({n_shards(prompts, acquired_type, condition, per_shard)} shard(s) of "
            f"{per_shard} prompts)"
        )
    return items


def vqa_biasig_shard(
    job: ModelJob,
    vlm_name: str,
    images_dir: str,
    prompt_path: str | None = None,
    max_attempts: int = 3,
) -> list[dict]:
    """Ask the VQA ``vlm_name`` about every image of a generation shard; write the answer
    rows (stereolens.biasig.vqa.ROW_COLUMNS) as JSONL to ``job.out_path`` atomically."""
    from stereolens.biasig.vqa import VQAPrompt, vqa_answers

    log = job.log
    prompt = VQAPrompt.load(prompt_path)
    items, rows = job.read_shard(
        vlm_name, images_dir, CARRIED_KEYS,
        lambda vlm, items: vqa_answers(
            vlm.model, items, prompt, vlm.spec,
            max_attempts=max_attempts, cache=vlm.cache, log=log.info,
        ),
    )  # fmt: skip
    expected = sum(int(it["n_persons"]) for it in items)
    if len(rows) != expected:
        raise RuntimeError(f"VQA returned {len(rows)} rows for {expected} image positions")
    write_jsonl(job.out_path, rows)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "partial", "discarded")}
    log.info("%d rows: %s", len(rows), counts)
    return rows
