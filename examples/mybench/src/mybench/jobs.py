"""MyBench's work: a model job (one VLM answers the questions) and the scores."""

import polars as pl

QUESTIONS = (
    "Is the sky blue on a clear day?",
    "Can a fish climb a tree?",
    "Is ice colder than steam?",
    "Do people need sleep?",
)
"""The questions, asked in turn (question i is QUESTIONS[i % 4])."""


def answer(job, model: str, questions: int, *, max_attempts: int = 2) -> list[dict]:
    """Ask ``model`` the questions through stereolens' one model-job runner (``job``, a
    stereolens.models.job.ModelJob: it loads the model, records the job's timing beside
    ``job.out_path`` and handles an out-of-memory retry) and its one retry loop; write one
    JSON line per question: its text, the answer, and whether the answer says yes."""
    from stereolens.atomic import write_jsonl
    from stereolens.models.ask import ask_items
    from stereolens.models.requests import VLMRequest

    log = job.log
    asked = [QUESTIONS[i % len(QUESTIONS)] for i in range(questions)]

    def build(i, attempt):
        text = f"{asked[i]} Answer yes or no."
        return VLMRequest(text=text, max_new_tokens=8, seed=i, attempt=attempt)

    def validate(i, text):
        return (text.strip().lower().startswith("yes"), None if text.strip() else "empty")

    state = job.run(
        model,
        lambda vlm: ask_items(
            vlm.model, vlm.spec, build, len(asked),
            validate=validate, max_attempts=max_attempts, cache=vlm.cache, log=log.info,
        ),
        what="mybench questions",
    )  # fmt: skip
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
    write_jsonl(job.out_path, rows)
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
