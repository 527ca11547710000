"""Refusal detection: phrase rules (resources/lvlm/refusal_phrases.v1.yaml) plus an optional
LLM judge, and refusal rates per model x task x group."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from stereolens.models.requests import VLMRequest
from stereolens.paths import resource
from stereolens.validation import ConfigError, load_yaml

_APOS = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})


@dataclass(frozen=True)
class RefusalRules:
    phrases: tuple[str, ...]
    window: int | None
    """Only the first ``window`` characters of a reply are searched (None = all)."""
    pattern: re.Pattern

    def match(self, text: str | None) -> str | None:
        """The first phrase found (as written in the rules), or None."""
        if not text:
            return None
        body = text.translate(_APOS)
        if self.window is not None:
            body = body[: self.window]
        m = self.pattern.search(body)
        if not m:
            return None
        return self.phrases[int(m.lastgroup[1:])]


def compile_rules(phrases: Sequence[str], window: int | None = 300) -> RefusalRules:
    """Whole-phrase, case-insensitive rules: a phrase matches only between non-word
    characters, any run of whitespace matches a space, curly apostrophes match straight."""
    if not phrases:
        raise ConfigError("no refusal phrases")
    parts = []
    for i, p in enumerate(phrases):
        words = p.translate(_APOS).split()
        body = r"\s+".join(re.escape(w) for w in words)
        parts.append(rf"(?P<p{i}>(?<!\w){body}(?!\w))")
    return RefusalRules(tuple(phrases), window, re.compile("|".join(parts), re.I))


def load_rules(path: str | os.PathLike | None = None) -> RefusalRules:
    path = Path(path) if path is not None else resource("lvlm", "refusal_phrases.v1.yaml")
    data = load_yaml(path, "refusal phrase rules")
    return compile_rules([str(p) for p in data.get("phrases") or []], data.get("window"))


Judge = Callable[[list[str], list[str]], list[bool | None]]
"""An LLM refusal judge: (requests, responses) -> refusal flag per item (None = no verdict)."""


def llm_refusal_judge(
    answer: Callable[[list[VLMRequest]], list[str]],
    prompts: dict[str, Any],
    **request_kw: Any,
) -> Judge:
    """Wrap a model's ``answer`` (e.g. ``VLM.answer``) as a Judge using prompts["refusal_judge"]."""
    from stereolens.lvlm.tasks import parse_choice

    cfg = prompts["refusal_judge"]
    choices = tuple(cfg["choices"])

    def judge(requests: list[str], responses: list[str]) -> list[bool | None]:
        reqs = [
            VLMRequest(
                text=cfg["prompt"].format(request=q, response=r or ""),
                system=" ".join(cfg["system"].split()),
                choices=choices,
                **request_kw,
            )
            for q, r in zip(requests, responses, strict=True)
        ]
        out = []
        for a in answer(reqs):
            c = parse_choice(a, choices)
            out.append(None if c is None else c == choices[0])
        return out

    return judge


def label_refusals(
    responses: pl.DataFrame,
    *,
    rules: RefusalRules | None = None,
    judge: Judge | None = None,
) -> pl.DataFrame:
    """Add ``refusal_phrase`` (matched phrase or null), ``refusal_rule`` (bool),
    ``refusal_judge`` (bool or null; null without a judge) and ``refusal`` = rule OR judge.
    Empty replies (backend failures) are never refusals; ``empty`` flags them."""
    rules = rules or load_rules()
    texts = responses["response"].to_list()
    phrases = [rules.match(t) for t in texts]
    out = responses.with_columns(
        pl.Series("refusal_phrase", phrases, dtype=pl.String),
        pl.Series("refusal_rule", [p is not None for p in phrases]),
        pl.Series("empty", [not (t or "").strip() for t in texts]),
    )
    verdicts: list[bool | None] = [None] * len(texts)
    if judge is not None:
        reqs = (
            responses["request"].to_list() if "request" in responses.columns else [""] * len(texts)
        )
        todo = [i for i, t in enumerate(texts) if (t or "").strip()]
        got = judge([reqs[i] or "" for i in todo], [texts[i] for i in todo])
        for i, v in zip(todo, got, strict=True):
            verdicts[i] = v
    return out.with_columns(pl.Series("refusal_judge", verdicts, dtype=pl.Boolean)).with_columns(
        (pl.col("refusal_rule") | pl.col("refusal_judge").fill_null(False)).alias("refusal")
    )


REFUSAL_COUNTS = {
    "n": pl.len(),
    "n_empty": pl.col("empty").sum(),
    "n_refusal": pl.col("refusal").sum(),
    "n_rule": pl.col("refusal_rule").sum(),
    "n_judge": pl.col("refusal_judge").fill_null(False).sum(),
}
"""The counts of a refusal rate's cell, from the labelled responses."""
RATE = (100.0 * pl.col("n_refusal") / (pl.col("n") - pl.col("n_empty"))).alias("rate")


def refusal_rates(
    labelled: pl.DataFrame, by: Sequence[str] = ("model", "task", "group")
) -> pl.DataFrame:
    """Refusal rate (%) per ``by`` cell: columns *by, n, n_empty, n_refusal, n_rule, n_judge,
    rate (= 100 n_refusal / (n - n_empty))."""
    by = [c for c in by if c in labelled.columns]
    return labelled.group_by(by).agg(**REFUSAL_COUNTS).with_columns(RATE).sort(by)
