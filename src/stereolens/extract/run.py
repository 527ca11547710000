"""Schema-constrained attribute extraction over a set of images, with retries.

Every image gets a fresh single-turn request (system text, the image, the user
text; never the generation prompt or role: extraction is blind). The answer is
parsed as one JSON object and validated against the attribute schema; an empty,
unparsable or invalid answer is asked again as a new request (attempt number
in the request; no history) up to ``max_attempts``, after which the image is
recorded as discarded with the reason. No image is ever dropped and one bad
answer never stops the run.

Requests are batched per round: all images' first attempts go to the backend
in one ``answer`` call, then the retries of the failures, and so on.

At temperature 0 raw responses can be cached on disk (:class:`ResponseCache`),
keyed by the full request, the image content hash and the model fingerprint, so
a rerun asks the model nothing it has answered before. Empty responses (a
backend failure) are never cached.

Retries at temperature 0 repeat the same request except for the attempt number,
so a deterministic backend tends to repeat its answer; they matter for empty
answers (API errors) and nondeterministic backends. Each request carries its own
seed, derived from the registry seed, the image id and the attempt number, so a
sampling backend draws independently per image and a retry is a new draw, while
a rerun reproduces every draw.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stereolens.atomic import write_json
from stereolens.contextbias.schema import AttributeSchema
from stereolens.extract.base import VLM, VLMRequest
from stereolens.ids import sha256_bytes, sha256_file, stable_id
from stereolens.paths import resource
from stereolens.registry import ModelSpec

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
        raw = yaml.safe_load(Path(path).read_text())
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


# -------------------------------------------------------------------- cache
class ResponseCache:
    """Raw responses on disk, one small JSON file per request key."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)

    def path(self, key: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{16,128}", key):
            raise ValueError(f"cache key {key!r} is not a hex digest")
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> str | None:
        path = self.path(key)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            logger.warning("response cache: ignoring unreadable %s (%s)", path, exc)
            return None
        response = entry.get("response") if isinstance(entry, dict) else None
        return response if isinstance(response, str) else None

    def put(self, key: str, response: str, **meta: Any) -> None:
        write_json(self.path(key), {"key": key, "response": response, **meta})


# -------------------------------------------------------------------- parsing
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder(strict=False)  # tolerate raw control characters in strings


def parse_json_object(text: str) -> dict[str, Any]:
    """The one JSON object in ``text``; tolerates a ```json fence and text around it.

    Raises ValueError saying what is wrong.
    """
    text = (text or "").strip()
    if not text:
        raise ValueError("empty response")
    candidates = [text] + [m.group(1).strip() for m in _FENCE.finditer(text)]
    for candidate in candidates:
        try:
            value = _DECODER.decode(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
        raise ValueError(f"answer is a JSON {type(value).__name__}, not an object")
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object found in the response")
    try:
        value, _ = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"response holds no complete JSON object (truncated or malformed: "
            f"{exc.msg} at char {exc.pos})"
        ) from None
    return value


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
def _response_sha(text: str) -> str:
    return sha256_bytes((text or "").encode("utf-8"))


def request_seed(seed: int, image_id: str, attempt: int) -> int:
    """Stable per-(image, attempt) seed below 2**31."""
    return int(stable_id("vlm-seed", seed, image_id, attempt), 16) % (2**31)


def ask_round(
    vlm: VLM,
    requests: list[VLMRequest],
    keys: list[str] | None,
    cache: ResponseCache | None,
    model_name: str,
    attempt: int,
    max_attempts: int | None = None,
    label: str = "",
    log: Callable[[str], Any] = print,
) -> tuple[list[str], list[bool], list[float]]:
    """One round of requests: cached answers first, the rest in one ``vlm.answer`` call.

    ``keys`` are the requests' cache keys (None = no cache); ``model_name`` and
    ``attempt`` are recorded with each cache entry; ``label`` prefixes the log line
    (default: the model name). Returns (raw answer per request, "" where the backend
    failed; whether it came from the cache; backend seconds attributed to each request).
    A backend that raises loses this round, not the run; empty answers are never cached.
    """
    use_cache = cache is not None and keys is not None
    label = label or model_name
    answers: list[str | None] = (
        [cache.get(k) for k in keys] if use_cache else [None] * len(requests)
    )
    cached = [a is not None for a in answers]
    ask = [j for j, a in enumerate(answers) if a is None]
    seconds = [0.0] * len(requests)
    log(
        f"{label}: attempt {attempt}{f'/{max_attempts}' if max_attempts else ''}:"
        f" {len(requests)} image(s)"
        f" ({len(requests) - len(ask)} cached, {len(ask)} asked)"
    )
    if ask:
        started = time.perf_counter()
        try:
            got = vlm.answer([requests[j] for j in ask])
            if len(got) != len(ask):
                raise RuntimeError(f"backend returned {len(got)} answers for {len(ask)} requests")
        except Exception as exc:  # a backend that raises loses this round, not the run
            logger.error(
                "%s: backend failed on attempt %d: %s: %s", label, attempt, type(exc).__name__, exc
            )
            got = [""] * len(ask)
        share = (time.perf_counter() - started) / len(ask)
        for j, text in zip(ask, got, strict=True):
            text = text if isinstance(text, str) else ""
            answers[j] = text
            seconds[j] = share
            if use_cache and text:
                try:
                    cache.put(keys[j], text, model=model_name, attempt=attempt)
                except OSError as exc:  # a full or read-only cache costs speed only
                    logger.warning("response cache: not written (%s)", exc)
    return [a or "" for a in answers], cached, seconds


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

    Each item has at least ``image_id`` and ``image_path``; its other keys are
    carried into the record. A record adds: image_id, image_sha256, extractor,
    extractor_model, extractor_revision, schema_version, prompt_version, status
    ("ok" | "discarded"), reason, attempts, attempt_log (one {attempt,
    response_sha256, error, cached} per attempt), response_sha256 (of the
    accepted or last raw response), attributes (the answer or None) and seconds
    (backend time attributed to this image: its share of each batch call).
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    temperature = float(spec.get("temperature", 0) or 0)
    seed = spec.get("seed", 0)
    max_new_tokens = int(spec.get("max_new_tokens", 1024))
    use_cache = cache is not None and temperature == 0
    fingerprint = spec.fingerprint()
    json_schema = schema.json_schema
    user_text = prompt.user_text(schema)

    states: list[dict[str, Any]] = []
    for item in items:
        state: dict[str, Any] = {
            "item": item,
            "image_sha256": None,
            "log": [],
            "status": None,
            "reason": None,
            "attributes": None,
            "response_sha256": None,
            "error": None,
            "seconds": 0.0,
        }
        try:
            state["image_sha256"] = sha256_file(item["image_path"])
        except (KeyError, TypeError, OSError) as exc:
            state["status"] = "discarded"
            state["reason"] = f"image not readable: {type(exc).__name__}: {exc}"
        states.append(state)

    def request(state: dict[str, Any], attempt: int) -> VLMRequest:
        return VLMRequest(
            text=user_text,
            image_path=str(state["item"]["image_path"]),
            system=prompt.system,
            json_schema=json_schema,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=None if seed is None else request_seed(seed, state["item"]["image_id"], attempt),
            attempt=attempt,
        )

    pending = [s for s in states if s["status"] is None]
    log(
        f"extract {spec.name}: {len(pending)} image(s) to read"
        + (f", {len(states) - len(pending)} unreadable" if len(pending) < len(states) else "")
    )
    for attempt in range(1, max_attempts + 1):
        if not pending:
            break
        requests = [request(s, attempt) for s in pending]
        keys = (
            [
                r.cache_key(fingerprint, s["image_sha256"])
                for r, s in zip(requests, pending, strict=True)
            ]
            if use_cache
            else [None] * len(pending)
        )
        answers, cached, seconds = ask_round(
            vlm,
            requests,
            keys if use_cache else None,
            cache,
            spec.name,
            attempt,
            max_attempts,
            label=f"extract {spec.name}",
            log=log,
        )
        for state, spent in zip(pending, seconds, strict=True):
            state["seconds"] += spent
        still: list[dict[str, Any]] = []
        for j, state in enumerate(pending):
            text = answers[j] or ""
            attributes, error = check_answer(text, schema)
            state["response_sha256"] = _response_sha(text)
            state["log"].append(
                {
                    "attempt": attempt,
                    "response_sha256": state["response_sha256"],
                    "error": error,
                    "cached": cached[j],
                }
            )
            if error is None:
                state["status"], state["attributes"] = "ok", attributes
            else:
                state["error"] = error
                still.append(state)
        pending = still
    for state in pending:
        state["status"] = "discarded"
        state["reason"] = (
            f"no valid answer in {max_attempts} attempt(s); last error: {state['error']}"
        )

    records = []
    for state in states:
        item = state["item"]
        records.append(
            {
                **item,
                "image_id": item.get("image_id"),
                "image_sha256": state["image_sha256"],
                "extractor": spec.name,
                "extractor_model": spec.model,
                "extractor_revision": spec.revision,
                "schema_version": schema.version,
                "prompt_version": prompt.version,
                "status": state["status"],
                "reason": state["reason"],
                "attempts": len(state["log"]),
                "attempt_log": state["log"],
                "response_sha256": state["response_sha256"],
                "attributes": state["attributes"],
                "seconds": round(state["seconds"], 6),
            }
        )
    ok = sum(r["status"] == "ok" for r in records)
    log(f"extract {spec.name}: {ok} ok, {len(records) - ok} discarded of {len(records)}")
    return records
