"""The body of each LVLM workflow job (called by the workflow scripts, usable from
Python). Heavy imports (torch, backends) happen only inside the model-loading jobs."""

from __future__ import annotations

import logging
from typing import Any

import polars as pl

from stereolens.atomic import read_jsonl, write_jsonl, write_parquet
from stereolens.lvlm import assistant as A
from stereolens.lvlm import groups as G
from stereolens.lvlm import respond as RS
from stereolens.lvlm import tasks as T
from stereolens.lvlm import user_images as U
from stereolens.lvlm.names import group_from_slug
from stereolens.models.ask import ResponseCache
from stereolens.models.job import run_model_job
from stereolens.models.registry import ModelSpec, load_model, load_registry


def _cache(cache_dir: str | None) -> ResponseCache | None:
    return ResponseCache(cache_dir) if cache_dir else None


def build_synthetic_faces_job(out_dir: str, per_cell: int, seed: int) -> None:
    G.build_synthetic_faces(out_dir, n_per_cell=per_cell, seed=seed)


def export_hf_images_job(settings: dict[str, Any], out_dir: str) -> None:
    U.export_hf_images(
        settings["dataset"],
        out_dir,
        config_name=settings.get("dataset_config"),
        split=settings.get("split", "validation"),
        revision=settings.get("revision"),
    )


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


def respond_job(
    *,
    registry_path: str,
    model: str,
    setting: str,
    task: str,
    axis: str,
    usergroup: str,
    shard: int,
    sets_path: str,
    lv: dict[str, Any],
    cache_dir: str | None,
    out_path: str,
    log: logging.Logger,
    threads: int | None = None,
) -> None:
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
    prompts = T.load_prompts(lv.get("prompts"))
    items = RS.task_items(task, lv, prompts)
    spec = load_registry(registry_path)[model]
    if not rows:
        log.warning("no user images in this shard (the draw fell short); writing no responses")
        write_jsonl(out_path, [])
        return
    records = _timed(
        spec,
        log,
        threads,
        out_path,
        lambda vlm: RS.respond_shard(
            vlm,
            spec,
            rows,
            items,
            prompts,
            setting=setting,
            seed=int(lv["seed"]),
            max_attempts=int(lv["max_attempts"]),
            max_new_tokens=lv["tasks"][task].get("max_new_tokens"),
            mitigation_placement=lv["mitigation_placement"],
            cache=_cache(cache_dir),
            log=log.info,
        ),
    )
    write_jsonl(out_path, records)


def _timed(spec: ModelSpec, log: logging.Logger, threads: int | None, out_path: str, work):
    """Load the model once, run ``work(model)``, record <output>.timing.json."""
    return run_model_job(spec, out_path, work, log, threads=threads)


def extract_story_job(
    *,
    registry_path: str,
    assistant: str,
    response_paths: list[str],
    lv: dict[str, Any],
    cache_dir: str | None,
    out_path: str,
    log: logging.Logger,
    threads: int | None = None,
) -> None:
    stories = [r for p in response_paths for r in read_jsonl(p)]
    prompts = T.load_prompts(lv.get("prompts"))
    spec = load_registry(registry_path)[assistant]
    if not any((s.get("response") or "").strip() for s in stories):
        log.warning("no stories to read")
        write_jsonl(out_path, A.extract_story_shard(None, spec, stories, prompts, seed=0))
        return
    records = _timed(
        spec,
        log,
        threads,
        out_path,
        lambda llm: A.extract_story_shard(
            llm,
            spec,
            stories,
            prompts,
            seed=int(lv["seed"]),
            max_attempts=int(lv["max_attempts"]),
            max_new_tokens=lv["assistant_max_new_tokens"],
            cache=_cache(cache_dir),
            log=log.info,
        ),
    )
    write_jsonl(out_path, records)


def _read_responses(paths: list[str]) -> pl.DataFrame:
    rows = [r for p in paths for r in read_jsonl(p)]
    return pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()


def judge_terms_job(
    *,
    registry_path: str,
    assistant: str,
    response_paths: list[str],
    lv: dict[str, Any],
    cache_dir: str | None,
    out_path: str,
    log: logging.Logger,
    threads: int | None = None,
) -> None:
    responses = _read_responses(response_paths)
    prompts = T.load_prompts(lv.get("prompts"))
    spec = load_registry(registry_path)[assistant]
    if responses.height == 0 or responses.filter(pl.col("status") == "ok").height == 0:
        log.warning("no explanations to judge")
        write_parquet(out_path, pl.DataFrame())
        return
    judged = _timed(
        spec,
        log,
        threads,
        out_path,
        lambda llm: A.judge_term_explanations(
            llm,
            spec,
            responses,
            prompts,
            seed=int(lv["seed"]),
            max_attempts=int(lv["max_attempts"]),
            cache=_cache(cache_dir),
            log=log.info,
        ),
    )
    write_parquet(out_path, judged)


def refusals_job(
    *,
    registry_path: str,
    judge: str | None,
    response_paths: list[str],
    lv: dict[str, Any],
    cache_dir: str | None,
    out_path: str,
    log: logging.Logger,
    threads: int | None = None,
) -> None:
    responses = _read_responses(response_paths)
    if responses.height == 0:
        write_parquet(out_path, pl.DataFrame())
        return
    kw: dict[str, Any] = {}
    if judge:
        spec = load_registry(registry_path)[judge]
        kw = {
            "judge_model": load_model(spec),
            "judge_spec": spec,
            "prompts": T.load_prompts(lv.get("prompts")),
            "seed": int(lv["seed"]),
            "cache": _cache(cache_dir),
        }
    labelled = A.label_refusal_table(
        responses, phrases=lv.get("refusal_phrases"), log=log.info, **kw
    )
    log.info(
        "%d response(s): %d refusal(s) (%d by phrase rules)",
        labelled.height,
        int(labelled["refusal"].sum()),
        int(labelled["refusal_rule"].sum()),
    )
    write_parquet(out_path, labelled)


def merge_job(
    *,
    response_paths: list[str],
    refusal_paths: list[str],
    story_paths: list[str],
    judgement_paths: list[str],
    out: dict[str, str],
    log: logging.Logger,
) -> None:
    """The merged tables straight from the per-job files (stereolens.lvlm.merge; the
    workflow merges per model, then concatenates)."""
    from stereolens.lvlm.merge import merge_model_tables

    counts = merge_model_tables(
        response_paths=response_paths,
        refusal_paths=refusal_paths,
        story_paths=story_paths,
        judgement_paths=judgement_paths,
        out=out,
    )
    for name, rows in counts.items():
        log.info("%s: %d row(s) -> %s", name, rows, out[name])


def run_rule(smk, log: logging.Logger) -> None:
    """Entry point of the model-loading LVLM rules (one workflow script for all four):
    the job function is chosen by the rule's name, its arguments come from the rule."""
    common = {
        "registry_path": smk.params.registry,
        "lv": smk.config["lvlm"],
        "cache_dir": smk.params.cache_dir,
        "out_path": smk.output[0],
        "log": log,
        "threads": smk.threads,
    }
    if smk.rule == "respond_lvlm":
        w = smk.wildcards
        respond_job(
            model=w.model,
            setting=w.setting,
            task=w.task,
            axis=w.axis,
            usergroup=w.usergroup,
            shard=int(w.shard),
            sets_path=smk.input.sets,
            **common,
        )
    elif smk.rule == "extract_lvlm_story_attributes":
        extract_story_job(
            assistant=smk.params.assistant, response_paths=list(smk.input.responses), **common
        )
    elif smk.rule == "judge_lvlm_terms":
        judge_terms_job(
            assistant=smk.params.assistant, response_paths=list(smk.input.responses), **common
        )
    elif smk.rule == "label_lvlm_refusals":
        refusals_job(judge=smk.params.judge, response_paths=list(smk.input.responses), **common)
    else:
        raise ValueError(f"rule {smk.rule!r} has no LVLM job function")
