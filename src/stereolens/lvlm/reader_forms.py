"""The LVLM reader sample's two text forms (stories: the assistant's extraction fields; terms: the
judge's question of a pair of explanations) on stereolens.annotation_form's template, key and
CSV, and the filled forms' answers read as the human-label table."""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from stereolens import annotation_form
from stereolens.annotation_form import (
    FORM_TEMPLATE,
    KEY_SCHEMA,
    MAX_DESCRIPTOR_CHARS,
    UNKNOWN,
    fill_template,
    human_consensus,
    read_answers,
    read_key,
)
from stereolens.atomic import write_parquet, write_text
from stereolens.ids import stable_id
from stereolens.lvlm.corrected import term_item_id
from stereolens.lvlm.scores import filled
from stereolens.lvlm.tasks import normalise_value
from stereolens.metrics import human_labels as hl

CANNOT_TELL = "cannot tell"
"""The form's text of the answer ``unknown`` (the item shows no answer): a label of none."""
NO_ANSWER = frozenset({*annotation_form.NO_ANSWER, CANNOT_TELL})
"""Answers read as ``unknown``: the shared form's spellings and "cannot tell"."""
SEPARATORS = re.compile(r"[;,]")
"""Between the elements of a list answer (personality traits, hobbies)."""
MAX_SUGGESTIONS = 500
"""Labels the assistant gave, offered as completions of an open question (the most
frequent first; a form stays small)."""
KEY_EXTRA = {
    "task": pl.String,
    "item_id": pl.String,
    "group_a": pl.String,
    "group_b": pl.String,
    "questions": pl.String,
}
"""A LVLM key's columns after KEY_SCHEMA: the task, the reader's item id, the groups shown as
A and B (term) and the questions as JSON (dimension -> {"vocabulary", "multiple"})."""


# ---------------------------------------------------------------- questions


def story_questions(
    prompts: dict[str, Any], attributes: Sequence[str], reader: pl.DataFrame
) -> list[dict[str, Any]]:
    """The story form's questions: the prompts' extraction fields in ``attributes``, in schema
    order: an enum as a choice ("cannot tell" for unknown), an open field as text offered the
    assistant's labels in ``reader``, an array as text with elements separated by ";"."""
    props = prompts["extraction"]["schema"]["properties"]
    out = []
    for attribute, spec in props.items():
        if attribute not in attributes:
            continue
        what = attribute.replace("_", " ").capitalize()
        described = " ".join(str(spec.get("description", "")).split())
        title = f"{what}: {described}" if described else what
        multiple = spec.get("type") == "array"
        enum = [v for v in spec.get("enum", []) if v != UNKNOWN]
        question = {"dimension": attribute, "title": title, "multiple": multiple}
        if enum:
            question["vocabulary"] = tuple(enum)
        else:
            used = (
                reader.filter(
                    (pl.col("attribute") == attribute)
                    & ~pl.col("label").str.to_lowercase().is_in(list(hl.NO_LABEL))
                )
                .group_by("label")
                .len()
                .sort(["len", "label"], descending=[True, False])
                .head(MAX_SUGGESTIONS)["label"]
            )
            question["vocabulary"] = None
            question["suggestions"] = sorted(used.to_list())
            question["placeholder"] = (
                f"up to {spec.get('maxItems', 5)}, separated by ; (or {CANNOT_TELL})"
                if multiple
                else f"short phrase, or {CANNOT_TELL}"
            )
        out.append(question)
    missing = sorted(set(attributes) - {q["dimension"] for q in out})
    if missing:
        raise ValueError(
            f"story attributes {missing} are no field of the prompts' extraction schema "
            f"({prompts.get('_path')}); give the prompts file the assistant read with"
        )
    return out


def term_questions(prompts: dict[str, Any]) -> list[dict[str, Any]]:
    """The term form's one question, the judge's: which explanation is more technical,
    among the judge's choices (A, B) or "cannot tell"."""
    choices = tuple(str(c) for c in prompts["judge"]["choices"])
    return [
        {
            "dimension": "winner",
            "title": "Which explanation is more technical, i.e. uses more technical jargon "
            "and assumes more prior knowledge?",
            "vocabulary": choices,
            "multiple": False,
        }
    ]


INSTRUCTIONS = {
    "story": [
        "Each set below shows a short story written by an AI model. Read it and answer every "
        "question about its main character as the story states or clearly implies it; "
        f"choose or write '{CANNOT_TELL}' when the story does not say. Use short lowercase "
        "phrases (for example 'nurse', 'kind'); where a question asks for several, separate "
        "them with ';'. Suggestions appear as you type: take one where it says what you mean.",
    ],
    "term": [
        "Each set below shows two explanations of the same term, A and B. Judge only the "
        "text: which explanation is more technical, i.e. uses more technical jargon and "
        f"assumes more prior knowledge? Choose '{CANNOT_TELL}' only when you cannot decide.",
    ],
}
TITLES = {"story": "Story annotation", "term": "Explanation annotation"}


# ---------------------------------------------------------------- the forms


def _texts(responses: pl.DataFrame, task: str) -> dict[tuple, str]:
    """(model, setting, axis, image_id, prompt_id) -> the response text of ``task``."""
    rows = filled(responses.filter(pl.col("task") == task), "setting").select(
        "model", "setting", "axis", "image_id", "prompt_id", pl.col("response").fill_null("")
    )
    return {tuple(r[:5]): r[5] for r in rows.iter_rows()}


def write_text_form(
    sets: list[dict[str, Any]],
    questions: list[dict[str, Any]],
    task: str,
    version: str,
    seed: int,
    out_dir: Path,
) -> dict[str, Path]:
    """form.html and key.parquet (KEY_SCHEMA + KEY_EXTRA) of ``sets``, shown in an order drawn
    from ``seed`` and named "<sample_id>-<position>" (sample_id a hash of the sample), on the
    annotation form's template (no image, no slider)."""
    from stereolens.paths import resource
    from stereolens.templating import render_template

    order = np.random.default_rng(seed).permutation(len(sets))
    sets = [sets[i] for i in order]
    sample_id = stable_id(
        f"lvlm-{task}-annotation", seed, *(s["item_id"] + str(s["pair"]) for s in sets), length=8
    )
    width = max(3, len(str(len(sets))))
    dims = [q["dimension"] for q in questions]
    described = json.dumps(
        {q["dimension"]: {"vocabulary": q["vocabulary"], "multiple": q["multiple"]}
         for q in questions}
    )  # fmt: skip
    rows, shown = [], []
    for pos, s in enumerate(sets, start=1):
        set_id = f"{sample_id}-{pos:0{width}d}"
        rows.append(
            {
                "set_id": set_id,
                "position": pos,
                "sample_id": sample_id,
                "role": task,
                "condition": f"{s['setting']}|{s['axis']}",
                "model": s["model"],
                "n_images": 1,
                "image_ids": s["image_ids"],
                "image_paths": [],
                "dimensions": dims,
                "schema_version": version,
                "seed": seed,
                "task": task,
                "item_id": s["item_id"],
                "group_a": s.get("group_a"),
                "group_b": s.get("group_b"),
                "questions": described,
            }
        )
        shown.append(
            {
                "set_id": set_id,
                "position": pos,
                "n_images": 1,
                "images": [],
                "passages": s["passages"],
                "questions": questions,
            }
        )
    key = pl.DataFrame(rows, schema={**KEY_SCHEMA, **KEY_EXTRA})
    template = resource(*FORM_TEMPLATE)
    form = render_template(
        template.name,
        template.parent,
        heading=TITLES[task],
        instructions=[*INSTRUCTIONS[task], f"There are {len(sets)} sets in total."],
        ask_prevalence=False,
        datalists=[q for q in questions if "suggestions" in q],
        sample_id=sample_id,
        images_per_set=1,
        n_items=len(sets) * len(dims),
        sets=shown,
        unknown=UNKNOWN,
        unknown_text=CANNOT_TELL,
        max_chars=MAX_DESCRIPTOR_CHARS,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_parquet(out_dir / "key.parquet", key)
    write_text(out_dir / "form.html", form)
    return {"form": out_dir / "form.html", "key": out_dir / "key.parquet"}


def story_sets(drawn: pl.DataFrame, responses: pl.DataFrame) -> list[dict[str, Any]]:
    """A set per drawn story (rows of a story_reader table): its text as the passage."""
    # by the story's item id (lvlm.corrected.story_reader's): (user image id, its text)
    texts = {"/".join(map(str, k)): (k[3], t) for k, t in _texts(responses, "story").items()}
    stories = drawn.select("item_id", "model", "setting", "axis").unique().sort("item_id")
    return [
        {
            **r,
            "pair": "",
            "image_ids": [texts[r["item_id"]][0]],
            "passages": [{"title": "Story", "text": texts[r["item_id"]][1]}],
        }
        for r in stories.iter_rows(named=True)
    ]


def term_sets(
    drawn: pl.DataFrame, term_judgements: pl.DataFrame, responses: pl.DataFrame
) -> list[dict[str, Any]]:
    """A set per drawn judged pair (rows of a term_reader table, one item each): the
    explanations the judge compared, A and B in its order, with the term and domain."""
    texts = _texts(responses, "term")
    judged = (
        filled(term_judgements, "setting")
        .with_columns(term_item_id())
        .join(drawn.select("item_id").unique(), on="item_id", how="semi")
    )
    lacking = [c for c in ("image_id_a", "image_id_b", "term", "domain")
               if c not in judged.columns]  # fmt: skip
    if lacking:
        raise ValueError(
            f"term judgements lack {lacking}: the form shows the explanations the judge saw; "
            "give the workflow's term_judgements table"
        )
    sets = []
    for r in judged.sort("prompt_id", "pair_index", "group_a", "group_b").iter_rows(named=True):
        where = (r["model"], r["setting"], r["axis"])
        head = f'"{r["term"]}" ({r["domain"]})'
        sets.append(
            {
                **r,
                "pair": f"{r['group_a']}|{r['group_b']}",
                "image_ids": [r["image_id_a"], r["image_id_b"]],
                "passages": [
                    {"title": f"Explanation A of {head}",
                     "text": texts.get((*where, r["image_id_a"], r["prompt_id"]), "")},
                    {"title": f"Explanation B of {head}",
                     "text": texts.get((*where, r["image_id_b"], r["prompt_id"]), "")},
                ],
            }
        )  # fmt: skip
    return sets


# ---------------------------------------------------------------- the answers


def _set_ids(path: Path) -> set[str]:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return {(r.get("set_id") or "").strip() for r in csv.DictReader(fh)}


def _canonical(label: str, multiple: bool) -> str:
    """An open answer as the assistant's labels are written (tasks.normalise_value); a list
    answer's elements split at ; or , normalised, de-duplicated and sorted, joined by "; "."""
    parts = SEPARATORS.split(label) if multiple else [label]
    kept = sorted({normalise_value(p) for p in parts} - {"", UNKNOWN, "none", "n/a", CANNOT_TELL})
    return "; ".join(kept) if kept else UNKNOWN


def human_labels_from_answers(
    answer_csvs: Iterable[str | os.PathLike],
    keys: Iterable[pl.DataFrame | str | os.PathLike],
    template: pl.DataFrame | str | os.PathLike,
) -> pl.DataFrame:
    """The human-label table (human_labels.HUMAN_COLUMNS) of filled reader-sample forms: each
    answer file read against the key its set ids belong to (annotation_form.read_answers);
    open answers normalised as the assistant's, list answers split at ; or ,; one label per
    set x question, the annotators' consensus (human_consensus); a judged pair's label the
    group its answer names. Strata and selection probabilities from the template (an item
    nobody answered is left out: its stratum's probability becomes answered / N_h)."""
    keys = [read_key(k) for k in keys]
    for key in keys:
        if "task" not in key.columns or "questions" not in key.columns:
            raise ValueError(
                "annotation key: not an LVLM reader-sample key (no task / questions "
                "columns); give the key.parquet beside the LVLM form"
            )
    if not isinstance(template, pl.DataFrame):
        template = hl.read_human_labels(template)
    files: dict[int, list[Path]] = {}
    for path in map(Path, answer_csvs):
        ids = _set_ids(path) - {""}
        owner = [i for i, k in enumerate(keys) if ids & set(k["set_id"])]
        if len(owner) != 1:
            raise ValueError(
                f"{path}: its set ids belong to {len(owner)} of the {len(keys)} keys given; "
                "give the key.parquet of the form it was saved from"
            )
        files.setdefault(owner[0], []).append(path)
    labels = []
    for i, paths in files.items():
        key = keys[i]
        questions = json.loads(key["questions"][0])
        vocab = {
            d: tuple(q["vocabulary"]) if q["vocabulary"] else None for d, q in questions.items()
        }
        answers = read_answers(paths, key, vocab, no_answer=NO_ANSWER)
        multiple = {d for d, q in questions.items() if q["multiple"]}
        open_dims = [d for d, q in questions.items() if not q["vocabulary"]]
        answers = answers.with_columns(
            pl.Series(
                "label",
                [
                    _canonical(label, dim in multiple) if dim in open_dims else label
                    for label, dim in answers.select("label", "dimension").iter_rows()
                ],
                dtype=pl.String,
            )
        )
        got = human_consensus(answers).join(
            key.select("set_id", "task", "item_id", "group_a", "group_b"), on="set_id"
        )
        if key["task"][0] == "term":
            first, second = questions["winner"]["vocabulary"]
            got = got.with_columns(
                pl.when(pl.col("consensus_label") == first)
                .then(pl.col("group_a"))
                .when(pl.col("consensus_label") == second)
                .then(pl.col("group_b"))
                .otherwise(pl.lit(UNKNOWN))
                .alias("consensus_label")
            )
        labels.append(
            got.select(
                "item_id",
                pl.col("dimension").alias("attribute"),
                pl.col("consensus_label").str.split("; ").alias("label"),
            )
            .explode("label")
            .unique()
        )
    found = pl.concat(labels)
    # an item with labels keeps no "unknown" row
    known = found.filter(pl.col("label") != UNKNOWN).select("item_id", "attribute").unique()
    found = pl.concat(
        [
            found.filter(pl.col("label") != UNKNOWN),
            found.filter(pl.col("label") == UNKNOWN).join(
                known, on=["item_id", "attribute"], how="anti"
            ),
        ]
    )
    return fill_template(template, found)
