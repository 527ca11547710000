"""The body of one ContextBias generation or extraction job (called by the
workflow scripts, usable from Python). Heavy imports happen only inside."""

from __future__ import annotations

import polars as pl

from stereolens.atomic import write_jsonl
from stereolens.contextbias.prompts import build_prompts, shard_items
from stereolens.models.job import ModelJob

VALIDATION = "VAL"
"""Condition name of the explicit-attribute validation prompts (paper Table 1)."""

CARRIED_KEYS = (
    "image_id",
    "prompt_id",
    "seed",
    "seed_index",
    "model",
    "revision",
    "role",
    "condition",
    "variant",
    "prompt",
    "image_sha256",
)


def generation_items(
    prompts_path: str | None,
    model: str,
    role: str,
    condition: str,
    shard: int,
    seed_settings: dict,
    config: dict,
) -> list[dict]:
    """Generation adapter of ContextBias (its plug-in's generation_items): the images of
    one job, every prompt of (role, condition) times the seed indices of ``shard``, as
    GenerationItem keyword dicts.

    ``prompts_path`` is the prompt bank (None = the shipped bank); ``seed_settings`` the
    rule's seed settings (per_prompt, bank_key, default_bank_key, fix_articles; for the
    validation condition VAL: per_prompt, seed_key); ``config`` the contextbias config
    section (its ``seeds.per_shard``)."""
    seeds_per_shard = config["seeds"]["per_shard"]
    if condition == VALIDATION:
        from stereolens.contextbias.validation import build_validation_prompts

        prompts = build_validation_prompts(
            models=[model],
            seeds_per_prompt=seed_settings["per_prompt"],
            seed_key=seed_settings.get("seed_key"),
        ).filter(pl.col("role") == role)
    else:
        bank_key = seed_settings.get("bank_key")
        prompts = build_prompts(
            models=[model],
            seeds_per_prompt=seed_settings["per_prompt"],
            bank_keys={model: bank_key} if bank_key else {},
            default_bank_key=seed_settings.get("default_bank_key"),
            roles=[role],
            bank_path=prompts_path,
            fix_articles=seed_settings.get("fix_articles", False),
        )
    items = shard_items(prompts, model, role, condition, shard, seeds_per_shard)
    if not items:
        raise ValueError(
            f"no prompts for role {role!r}, condition {condition!r}, shard {shard}; "
            "check contextbias.roles/conditions and seeds.per_prompt"
        )
    return items


def extract_contextbias_shard(
    job: ModelJob,
    extractor: str,
    images_dir: str,
    schema_path: str,
    prompt_path: str,
    max_attempts: int,
) -> list[dict]:
    """Extract the attributes of every image of a generation shard with ``extractor``; write
    one JSON line per image to ``job.out_path`` (results do not depend on the batch size)."""
    from stereolens.contextbias.extract import ExtractionPrompt, extract_images
    from stereolens.contextbias.schema import AttributeSchema

    log = job.log
    schema = AttributeSchema.load(schema_path)
    prompt = ExtractionPrompt.load(prompt_path)
    items, records = job.read_shard(
        extractor, images_dir, CARRIED_KEYS,
        lambda vlm, items: extract_images(
            vlm.model, items, schema, prompt, vlm.spec,
            max_attempts=max_attempts, cache=vlm.cache, log=log.info,
        ),
    )  # fmt: skip
    if len(records) != len(items):
        raise RuntimeError(f"extraction returned {len(records)} records for {len(items)} images")
    write_jsonl(job.out_path, records)
    ok = sum(r["status"] == "ok" for r in records)
    log.info("%d of %d images extracted, %d discarded", ok, len(records), len(records) - ok)
    return records
