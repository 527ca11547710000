"""BiasIG protected-attribute VQA: gender, race and age of the people in each image, in
schema-constrained requests with retries (docs/methods.md, "BiasIG")."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stereolens.biasig.merge import ANSWER_DTYPES, NOT_MERGED
from stereolens.biasig.truth import ATTRIBUTES, VALUES_BY_ATTRIBUTE, positions
from stereolens.models.ask import (
    ResponseCache,
    ask_images,
    image_hashes,
    parse_json_object,
    request_seed,
)
from stereolens.models.registry import ModelSpec
from stereolens.models.requests import VLM, VLMRequest
from stereolens.paths import resource
from stereolens.validation import ConfigError, parse_yaml

DEFAULT_PROMPT = ("biasig", "vqa_prompt.v1.yaml")
UNKNOWN = "unknown"
ROW_COLUMNS = [*ANSWER_DTYPES, *NOT_MERGED]
"""Columns of an answer row (``attempt_log``: one {attempt, response_sha256, error,
unknown, cached} per attempt, the same on every row of an image)."""


# -------------------------------------------------------------------- prompt
@dataclass(frozen=True)
class VQAPrompt:
    """A versioned VQA prompt: system text, user texts, answer labels."""

    version: str
    system: str
    user_single: str
    user_pair: str
    labels: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {a: (*VALUES_BY_ATTRIBUTE[a], UNKNOWN) for a in ATTRIBUTES}
    )
    source: str = ""

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> VQAPrompt:
        """Read and check a prompt file (default: the shipped v1 prompt)."""
        path = Path(path) if path else resource(*DEFAULT_PROMPT)
        raw = parse_yaml(Path(path).read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ConfigError(f"VQA prompt {path}: expected a mapping")
        texts = ("version", "system", "user_single", "user_pair")
        missing = [k for k in texts if not isinstance(raw.get(k), str) or not raw[k].strip()]
        if missing:
            raise ConfigError(
                f"VQA prompt {path}: missing or empty key(s) {', '.join(missing)} "
                "(each must be text)"
            )
        labels = raw.get("labels")
        if not isinstance(labels, dict) or sorted(labels) != sorted(ATTRIBUTES):
            raise ConfigError(
                f"VQA prompt {path}: `labels` must map each of {list(ATTRIBUTES)} to a list"
            )
        prompt = cls(
            version=raw["version"],
            system=raw["system"],
            user_single=raw["user_single"],
            user_pair=raw["user_pair"],
            labels={a: tuple(labels[a] or ()) for a in ATTRIBUTES},
            source=str(path),
        )
        problems = prompt.problems()
        if problems:
            raise ConfigError(f"VQA prompt {path}: " + "; ".join(problems))
        return prompt

    def problems(self) -> list[str]:
        """What is wrong with the labels and user texts (empty when fine)."""
        out = []
        for a in ATTRIBUTES:
            labels = self.labels.get(a, ())
            allowed = {*VALUES_BY_ATTRIBUTE[a], UNKNOWN}
            bad = [v for v in labels if v not in allowed]
            if bad:
                out.append(
                    f"{a} labels {bad} are not spellings the metrics count ({sorted(allowed)})"
                )
            if sorted(set(labels)) != sorted(labels):
                out.append(f"{a} labels repeat a value: {list(labels)}")
            if UNKNOWN not in labels:
                out.append(f"{a} labels must include {UNKNOWN!r}")
            if not set(labels) - {UNKNOWN}:
                out.append(f"{a} labels list no value besides {UNKNOWN!r}")
            for name, text in (("user_single", self.user_single), ("user_pair", self.user_pair)):
                absent = [v for v in labels if v not in text]
                if absent:
                    out.append(f"{name} does not mention the {a} label(s) {absent}")
        return out

    def person_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {a: {"type": "string", "enum": list(self.labels[a])} for a in ATTRIBUTES},
            "required": list(ATTRIBUTES),
            "additionalProperties": False,
        }

    def json_schema(self, n_persons: int) -> dict[str, Any]:
        """The answer schema of a one-person or two-person image."""
        if n_persons == 1:
            return {"title": "Person", **self.person_schema()}
        if n_persons == 2:
            person = self.person_schema()
            return {
                "title": "TwoPersons",
                "type": "object",
                "properties": {"left": person, "right": person},
                "required": ["left", "right"],
                "additionalProperties": False,
            }
        raise ValueError(f"n_persons must be 1 or 2, got {n_persons!r}")

    def user_text(self, n_persons: int) -> str:
        if n_persons not in (1, 2):
            raise ValueError(f"n_persons must be 1 or 2, got {n_persons!r}")
        return self.user_single if n_persons == 1 else self.user_pair


def check_vqa_answer(
    text: str, prompt: VQAPrompt, n_persons: int
) -> tuple[dict[str, dict[str, str]] | None, str | None]:
    """({position: {attribute: label}}, None) for a valid answer, else (None, what is
    wrong)."""
    import jsonschema

    try:
        answer = parse_json_object(text)
    except ValueError as exc:
        return None, str(exc)
    validator = jsonschema.Draft202012Validator(prompt.json_schema(n_persons))
    errors = sorted(validator.iter_errors(answer), key=lambda e: list(e.absolute_path))
    if errors:
        shown = "; ".join(
            f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in errors[:3]
        )
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        return None, f"schema: {shown}{more}"
    if n_persons == 1:
        return {"single": dict(answer)}, None
    return {"left": dict(answer["left"]), "right": dict(answer["right"])}, None


# -------------------------------------------------------------------- VQA
def _n_persons(item: dict) -> int:
    n = item.get("n_persons")
    try:
        n = int(n)
    except (TypeError, ValueError):
        n = None
    if n not in (1, 2):
        raise ValueError(
            f"image {item.get('image_id')!r}: n_persons must be 1 or 2, got "
            f"{item.get('n_persons')!r}"
        )
    return n


def vqa_answers(
    vlm: VLM,
    items: list[dict],
    prompt: VQAPrompt,
    spec: ModelSpec,
    max_attempts: int = 3,
    cache: ResponseCache | None = None,
    log: Callable[[str], Any] = print,
) -> list[dict]:
    """Gender, race and age per image and position (``ROW_COLUMNS``; left then right for
    two persons) of ``items`` (image_id, image_path, prompt_id, model, n_persons), in input
    order. Retries and statuses: docs/methods.md."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    temperature = float(spec.get("temperature", 0) or 0)
    seed = spec.get("seed", 0)
    max_new_tokens = int(spec.get("max_new_tokens", 256))
    label = f"vqa {spec.name}"

    shas, unreadable = image_hashes(items)
    states: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        n = _n_persons(item)
        states.append(
            {
                "item": item,
                "n": n,
                "image_sha256": shas[i],
                "answers": {p: dict.fromkeys(ATTRIBUTES) for p in positions(n)},
                "valid": False,
                "discard": unreadable.get(i),
            }
        )

    def request(i: int, attempt: int) -> VLMRequest:
        n = states[i]["n"]
        image_id = states[i]["item"]["image_id"]
        return VLMRequest(
            text=prompt.user_text(n),
            image_path=str(states[i]["item"]["image_path"]),
            system=prompt.system,
            json_schema=prompt.json_schema(n),
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=None if seed is None else request_seed(seed, image_id, attempt),
            attempt=attempt,
        )

    def unknown(state: dict[str, Any]) -> list[str]:
        return [
            f"{a}" if p == "single" else f"{p}.{a}"
            for p, values in state["answers"].items()
            for a, v in values.items()
            if v in (None, UNKNOWN)
        ]

    def validate(i: int, text: str):
        """Keep the first non-unknown answer per attribute and position; ask again while
        an answer is invalid or an attribute is still unknown."""
        state = states[i]
        parsed, error = check_vqa_answer(text, prompt, state["n"])
        if parsed is not None:
            state["valid"] = True
            for position, values in parsed.items():
                kept = state["answers"][position]
                for a in ATTRIBUTES:
                    if kept[a] in (None, UNKNOWN):
                        kept[a] = values[a]
        missing = unknown(state)
        retry = error or (f"unknown: {', '.join(missing)}" if missing else None)
        # the attempt log records the answer's own validity error (None for a valid answer
        # with unknowns) and the attributes still unknown
        return parsed, retry, {"error": error, "unknown": missing if parsed is not None else None}

    skip = [i for i, s in enumerate(states) if s["discard"] is not None]
    asked = ask_images(
        vlm, spec, request, [s["image_sha256"] for s in states], temperature=temperature,
        cache=cache, label=label, log=log, skip=skip, validate=validate, max_attempts=max_attempts,
    )  # fmt: skip
    for state, a in zip(states, asked, strict=True):
        state["log"] = a.log
        state["response_sha256"] = a.log[-1]["response_sha256"] if a.log else None
        state["error"] = next((e["error"] for e in reversed(a.log) if e["error"]), None)
        if a.failure is not None:
            state["discard"] = a.failure

    rows: list[dict] = []
    counts = {"ok": 0, "partial": 0, "discarded": 0}
    for state in states:
        item = state["item"]
        n_attempts = len(state.get("log", []))
        if state["discard"] is None and not state["valid"]:
            state["discard"] = (
                f"no valid answer in {n_attempts} attempt(s); last error: {state['error']}"
            )
        for position, values in state["answers"].items():
            if state["discard"] is not None:
                status, reason = "discarded", state["discard"]
                values = dict.fromkeys(ATTRIBUTES)
            else:
                still_unknown = [a for a in ATTRIBUTES if values[a] in (None, UNKNOWN)]
                if still_unknown:
                    status = "partial"
                    reason = f"{', '.join(still_unknown)} unknown after {n_attempts} attempt(s)"
                    values = {a: v or UNKNOWN for a, v in values.items()}
                else:
                    status, reason = "ok", None
            counts[status] += 1
            rows.append(
                {
                    "model": item.get("model"),
                    "prompt_id": item.get("prompt_id"),
                    "image_id": item.get("image_id"),
                    "position": position,
                    **values,
                    "attempts": n_attempts,
                    "status": status,
                    "reason": reason,
                    "response_sha256": state.get("response_sha256"),
                    "prompt_version": prompt.version,
                    "vqa_model": spec.name,
                    "vqa_revision": spec.revision,
                    "attempt_log": state.get("log", []),
                }
            )
    log(
        f"{label}: {len(states)} image(s), {len(rows)} row(s): "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
    )
    return rows
