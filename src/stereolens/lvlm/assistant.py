"""The LLM assistant's side of the LVLM audit: story readings into the extraction schema, term
judgements between two explanations, and refusal labels by phrase rules plus an optional judge."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import polars as pl

from stereolens.ids import sha256_bytes
from stereolens.lvlm import tasks as T
from stereolens.lvlm.merge import KEYS
from stereolens.lvlm.refusal import label_refusals, llm_refusal_judge, load_rules
from stereolens.lvlm.respond import Log, ask_with_retries, request_options
from stereolens.models.ask import ResponseCache, TransportPolicy, ask_round, request_seed
from stereolens.models.registry import ModelSpec
from stereolens.models.requests import VLM, VLMRequest

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
    """The assistant's reading of each story (respond_shard's story records): the request holds
    the story text only (tasks.extraction_request). An unparsable answer is asked again up to
    ``max_attempts``, then recorded "discarded" with no attributes; an empty story (the
    audited model's backend failed) is recorded "no_story" without asking."""
    todo = [i for i, s in enumerate(stories) if (s.get("response") or "").strip()]
    kw = request_options(spec, max_new_tokens)

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
        pairs = None if j is None else parsed.get(j)
        out.append(
            {
                **base,
                "assistant": spec.name,
                "status": "no_story" if j is None else "ok" if pairs is not None else "discarded",
                "attempts": 0 if j is None else got[j]["attempts"],
                "cached": False if j is None else got[j]["cached"],
                "response_sha256": None
                if j is None
                else sha256_bytes(got[j]["response"].encode("utf-8")),
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
    """Judge pairs of explanations of one term written for users of different groups.

    ``responses``: term records of one (model, setting, axis); pairs from
    tasks.make_judge_pairs (empty explanations left out). Returns the pairs with answer,
    winner (the group judged more technical; null without a valid answer after
    ``max_attempts``), attempts and the setting and assistant."""
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
    kw = request_options(spec, None)

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
    answers cached); the response keys and refusal_phrase, refusal_rule, refusal_judge, empty,
    refusal (refusal.label_refusals)."""
    rules = load_rules(phrases)
    judge = None
    if judge_model is not None:
        if judge_spec is None or prompts is None:
            raise ValueError("an LLM refusal judge needs its spec and the prompts")
        fingerprint = judge_spec.fingerprint()
        legacy = judge_spec.legacy_fingerprint()

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
                legacy_keys=[r.cache_key(legacy, None) for r in seeded] if legacy else None,
            )
            return [a.text for a in answers]

        judge = llm_refusal_judge(cached_answer, prompts, **request_options(judge_spec, 16))
    labelled = label_refusals(responses, rules=rules, judge=judge)
    return labelled.select(
        *KEYS, "refusal_phrase", "refusal_rule", "refusal_judge", "empty", "refusal"
    )
