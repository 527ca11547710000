"""The body of each LVLM workflow job (called by the workflow scripts, usable from
Python). Heavy imports (torch, backends) happen only inside the model-loading jobs."""

from __future__ import annotations

import logging
from typing import Any

import polars as pl

from stereolens.atomic import read_jsonl, write_jsonl, write_parquet
from stereolens.lvlm import assistant as A
from stereolens.lvlm import respond as RS
from stereolens.lvlm import tasks as T
from stereolens.lvlm import user_images as U
from stereolens.lvlm.names import group_from_slug
from stereolens.models.job import ModelJob


def draw_sets_job(
    folder: str,
    labels_csv: str | None,
    lv: dict[str, Any],
    images_out: str,
    sets_out: str,
    log: logging.Logger,
) -> None:
    labels = U.user_image_labels(folder, labels_csv)
    sets, notes = U.draw_sets(labels, lv)
    for note in notes:
        log.warning("%s", note)
    counts = sets.group_by("task", "axis", "group").len().sort("task", "axis", "group")
    for row in counts.iter_rows(named=True):
        log.info("%s %s %s: %d image(s)", row["task"], row["axis"], row["group"], row["len"])
    write_parquet(images_out, labels)
    write_parquet(sets_out, sets)


def _ask(job: ModelJob, name: str, settings: dict[str, Any], work, write) -> None:
    """Run ``work(model, spec, seed=, max_attempts=, cache=, log=)`` (seed and max_attempts
    from ``settings``) on the model ``name`` through the one runner, then ``write(out_path,
    result)``."""
    result = job.run(
        name,
        lambda m: work(
            m.model,
            m.spec,
            seed=int(settings["seed"]),
            max_attempts=int(settings["max_attempts"]),
            cache=m.cache,
            log=job.log.info,
        ),
    )
    write(job.out_path, result)


def respond_job(
    job: ModelJob,
    *,
    model: str,
    setting: str,
    task: str,
    axis: str,
    usergroup: str,
    shard: int,
    sets_path: str,
    settings: dict[str, Any],
) -> None:
    """Rule respond_lvlm; ``settings``: its param, params.task_settings."""
    group = group_from_slug(axis, usergroup)
    rows = (
        pl.read_parquet(sets_path)
        .filter(
            (pl.col("task") == task)
            & (pl.col("axis") == axis)
            & (pl.col("group") == group)
            & (pl.col("shard") == int(shard))
        )
        .to_dicts()
    )
    prompts = T.load_prompts(settings.get("prompts"))
    items = RS.task_items(task, settings, prompts)
    if not rows:
        job.log.warning("no user images in this shard (the draw fell short); writing no responses")
        write_jsonl(job.out_path, [])
        return

    def work(vlm, spec, **kw):
        return RS.respond_shard(
            vlm,
            spec,
            rows,
            items,
            prompts,
            setting=setting,
            max_new_tokens=settings.get("max_new_tokens"),
            mitigation_placement=settings["mitigation_placement"],
            **kw,
        )

    _ask(job, model, settings, work, write_jsonl)


def extract_story_job(
    job: ModelJob, *, assistant: str, response_paths: list[str], settings: dict[str, Any]
) -> None:
    """Rule extract_lvlm_story_attributes; ``settings``: its param, params.story_settings."""
    stories = [r for p in response_paths for r in read_jsonl(p)]
    prompts = T.load_prompts(settings.get("prompts"))
    if not any((s.get("response") or "").strip() for s in stories):
        job.log.warning("no stories to read")
        spec = job.spec(assistant)
        write_jsonl(job.out_path, A.extract_story_shard(None, spec, stories, prompts, seed=0))
        return

    def work(llm, spec, **kw):
        return A.extract_story_shard(
            llm, spec, stories, prompts, max_new_tokens=settings["max_new_tokens"], **kw
        )

    _ask(job, assistant, settings, work, write_jsonl)


def _read_responses(paths: list[str]) -> pl.DataFrame:
    rows = [r for p in paths for r in read_jsonl(p)]
    return pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()


def judge_terms_job(
    job: ModelJob, *, assistant: str, response_paths: list[str], settings: dict[str, Any]
) -> None:
    """Rule judge_lvlm_terms; ``settings``: its param, params.judge_settings."""
    responses = _read_responses(response_paths)
    prompts = T.load_prompts(settings.get("prompts"))
    if responses.height == 0 or responses.filter(pl.col("status") == "ok").height == 0:
        job.log.warning("no explanations to judge")
        write_parquet(job.out_path, pl.DataFrame())
        return

    def work(llm, spec, **kw):
        return A.judge_term_explanations(llm, spec, responses, prompts, **kw)

    _ask(job, assistant, settings, work, write_parquet)


def refusals_job(
    job: ModelJob, *, judge: str | None, response_paths: list[str], settings: dict[str, Any]
) -> None:
    """Rule label_lvlm_refusals; ``settings``: its param, params.refusal_settings."""
    log = job.log
    responses = _read_responses(response_paths)
    if responses.height == 0:
        write_parquet(job.out_path, pl.DataFrame())
        return

    def label(judged=None):
        kw: dict[str, Any] = {}
        if judged is not None:
            kw = {
                "judge_model": judged.model,
                "judge_spec": judged.spec,
                "prompts": T.load_prompts(settings.get("prompts")),
                "seed": int(settings["seed"]),
                "cache": judged.cache,
            }
        return A.label_refusal_table(responses, phrases=settings.get("phrases"), log=log.info, **kw)

    labelled = job.run(judge, label) if judge else label()
    log.info(
        "%d response(s): %d refusal(s) (%d by phrase rules)",
        labelled.height,
        int(labelled["refusal"].sum()),
        int(labelled["refusal_rule"].sum()),
    )
    write_parquet(job.out_path, labelled)
