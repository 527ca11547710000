"""ContextBias attribute extraction: the versioned extraction prompt, the schema as prompt text,
and blind, schema-constrained extraction over a set of images with retries through
stereolens.models.ask (docs/methods.md, "Extraction")."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stereolens.contextbias.schema import AttributeSchema
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
from stereolens.validation import parse_yaml

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = ("contextbias", "extraction_prompt.v1.yaml")
DIMENSIONS_PLACEHOLDER = "{dimensions}"


# -------------------------------------------------------------------- prompt
def describe_dimensions(schema: AttributeSchema) -> str:
    """The schema as prompt text: one line per field with its allowed answers."""
    lines: list[str] = []
    for cohort in schema.cohorts:
        dims = [d for d in schema.dimensions if d.cohort == cohort]
        per_person = dims[0].per_person
        lines.append(
            f"{cohort}" + (" (a list: one object per visible person)" if per_person else "") + ":"
        )
        for d in dims:
            if d.kind == "identifier":
                text = "p1, p2, ... (identifies the person within this image)"
            elif d.vocabulary:
                labels = ", ".join(v for v in d.vocabulary if v != "unknown")
                text = (
                    f"one of {labels}; or unknown"
                    if d.kind == "scalar"
                    else f"a list of zero or more of {labels}"
                )
            else:
                text = (
                    "short noun phrase, or unknown"
                    if d.kind == "scalar"
                    else "a list of short noun phrases (open vocabulary)"
                )
            lines.append(f"  - {d.name}: {text}")
    return "\n".join(lines)


@dataclass(frozen=True)
class ExtractionPrompt:
    """A versioned extraction prompt (system text and user text)."""

    version: str
    system: str
    user: str
    """User text; ``{dimensions}`` is replaced by :func:`describe_dimensions`."""
    source: str = ""

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> ExtractionPrompt:
        """Read a prompt file (default: the shipped v1 prompt)."""
        path = Path(path) if path else resource(*DEFAULT_PROMPT)
        raw = parse_yaml(Path(path).read_text())
        if not isinstance(raw, dict):
            raise ValueError(
                f"extraction prompt {path}: expected a mapping with keys version, system, user"
            )
        missing = [
            k
            for k in ("version", "system", "user")
            if not isinstance(raw.get(k), str) or not raw[k].strip()
        ]
        if missing:
            raise ValueError(
                f"extraction prompt {path}: missing or empty key(s) "
                f"{', '.join(missing)} (each must be text)"
            )
        return cls(version=raw["version"], system=raw["system"], user=raw["user"], source=str(path))

    def user_text(self, schema: AttributeSchema) -> str:
        return self.user.replace(DIMENSIONS_PLACEHOLDER, describe_dimensions(schema))


# -------------------------------------------------------------------- answers
def check_answer(text: str, schema: AttributeSchema) -> tuple[dict[str, Any] | None, str | None]:
    """(parsed answer, None) when valid, else (None, what is wrong)."""
    try:
        answer = parse_json_object(text)
    except ValueError as exc:
        return None, str(exc)
    problems = schema.validate(answer)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        return None, "schema: " + "; ".join(problems[:3]) + more
    return answer, None


# -------------------------------------------------------------------- extraction
def extract_images(
    vlm: VLM,
    items: list[dict],
    schema: AttributeSchema,
    prompt: ExtractionPrompt,
    spec: ModelSpec,
    max_attempts: int = 3,
    cache: ResponseCache | None = None,
    log: Callable[[str], Any] = print,
) -> list[dict]:
    """Extract attributes for every item; one record per item, in input order.

    Each item has at least ``image_id`` and ``image_path`` (and ``image_sha256`` when the
    job verified it; else it is computed here); its other keys are carried into the
    record. A record adds: image_id, image_sha256, extractor, extractor_model,
    extractor_revision, schema_version, prompt_version, status ("ok" | "discarded"),
    reason, attempts, attempt_log (one {attempt, response_sha256, error, cached} per
    attempt), response_sha256 (of the accepted or last raw response), attributes (the
    answer or None) and seconds (backend time attributed to this image: its share of each
    batch call). Backend failures are not records: they fail the job (models.ask).
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    temperature = float(spec.get("temperature", 0) or 0)
    seed = spec.get("seed", 0)
    max_new_tokens = int(spec.get("max_new_tokens", 1024))
    json_schema = schema.json_schema
    user_text = prompt.user_text(schema)

    shas, unreadable = image_hashes(items)

    def request(i: int, attempt: int) -> VLMRequest:
        item = items[i]
        return VLMRequest(
            text=user_text,
            image_path=str(item["image_path"]),
            system=prompt.system,
            json_schema=json_schema,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=None if seed is None else request_seed(seed, item["image_id"], attempt),
            attempt=attempt,
        )

    asked = ask_images(
        vlm, spec, request, shas, temperature=temperature, cache=cache,
        label=f"extract {spec.name}", log=log, skip=list(unreadable),
        validate=lambda _i, text: check_answer(text, schema), max_attempts=max_attempts,
    )  # fmt: skip

    records = []
    for i, (item, a) in enumerate(zip(items, asked, strict=True)):
        if i in unreadable:
            status, reason = "discarded", unreadable[i]
        elif a.accepted:
            status, reason = "ok", None
        elif a.failure is not None:
            status, reason = "discarded", a.failure
        else:
            status = "discarded"
            reason = f"no valid answer in {a.attempts} attempt(s); last error: {a.error}"
        records.append(
            {
                **item,
                "image_id": item.get("image_id"),
                "image_sha256": shas[i],
                "extractor": spec.name,
                "extractor_model": spec.model,
                "extractor_revision": spec.revision,
                "schema_version": schema.version,
                "prompt_version": prompt.version,
                "status": status,
                "reason": reason,
                "attempts": a.attempts,
                "attempt_log": a.log,
                "response_sha256": a.log[-1]["response_sha256"] if a.log else None,
                "attributes": a.value if status == "ok" else None,
                "seconds": round(a.seconds, 6),
            }
        )
    ok = sum(r["status"] == "ok" for r in records)
    log(f"extract {spec.name}: {ok} ok, {len(records) - ok} discarded of {len(records)}")
    return records
