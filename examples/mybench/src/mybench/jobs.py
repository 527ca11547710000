"""MyBench's work: a model job (one VLM answers the questions) and the scores."""

import logging

import polars as pl

QUESTIONS = (
    "Is the sky blue on a clear day?",
    "Can a fish climb a tree?",
    "Is ice colder than steam?",
    "Do people need sleep?",
)
"""The questions, asked in turn (question i is QUESTIONS[i % 4])."""


def answer(
    registry_path: str,
    model: str,
    questions: int,
    out_path: str,
    log: logging.Logger,
    *,
    cache_dir: str | None = None,
    threads: int | None = None,
    batch_size: int | None = None,
    job_resources: dict | None = None,
    max_attempts: int = 2,
) -> list[dict]:
    """Ask ``model`` the questions (through stereolens' one retry loop and the one model-job
    runner, which records the job's timing beside ``out_path``); write one JSON line per
    question: its text, the answer, and whether the answer says yes."""
    from stereolens.atomic import write_jsonl
    from stereolens.models.ask import ResponseCache, ask_items
    from stereolens.models.job import log_job_resources, run_model_job
    from stereolens.models.registry import load_registry
    from stereolens.models.requests import VLMRequest

    spec = load_registry(registry_path)[model].with_batch_size(batch_size)
    log_job_resources(log, job_resources)
    asked = [QUESTIONS[i % len(QUESTIONS)] for i in range(questions)]

    def build(i, attempt):
        text = f"{asked[i]} Answer yes or no."
        return VLMRequest(text=text, max_new_tokens=8, seed=i, attempt=attempt)

    def validate(i, text):
        return (text.strip().lower().startswith("yes"), None if text.strip() else "empty")

    state = run_model_job(
        spec,
        out_path,
        lambda vlm: ask_items(
            vlm,
            spec,
            build,
            len(asked),
            validate=validate,
            max_attempts=max_attempts,
            cache=ResponseCache(cache_dir) if cache_dir else None,
            log=log.info,
        ),
        log,
        threads=threads,
        what="mybench questions",
    )
    rows = [
        {
            "model": model,
            "question_id": i,
            "question": asked[i],
            "answer": s.response,
            "yes": bool(s.value),
            "attempts": s.attempts,
            "error": s.error,
        }
        for i, s in enumerate(state)
    ]
    write_jsonl(out_path, rows)
    log.info("%d answers, %d yes", len(rows), sum(r["yes"] for r in rows))
    return rows


def scores(answer_paths: list[str]) -> pl.DataFrame:
    """One row per model: questions answered and the share of yes (``score``)."""
    frames = [pl.read_ndjson(p) for p in answer_paths]
    return (
        pl.concat(frames, how="diagonal_relaxed")
        .group_by("model", maintain_order=True)
        .agg(pl.len().alias("questions"), pl.col("yes").mean().alias("score"))
    )
