"""Asking a model: request seeds, the response cache, JSON answers, failures, and the one
validate-and-retry loop every model stage uses (what each outcome becomes: docs/architecture.md,
"Inside a model job")."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stereolens.atomic import write_json
from stereolens.ids import sha256_bytes, sha256_file, stable_id

logger = logging.getLogger(__name__)

Log = Callable[[str], Any]


# -------------------------------------------------------------------- failures
@dataclass(frozen=True)
class ItemFailure:
    """A request that cannot be asked (not the model's answer, not a transport failure)."""

    reason: str


class BackendFailure(RuntimeError):
    """The backend could not answer for a reason outside the model. ``retry_in_job``:
    worth asking again after a pause (network, rate limit, server error, a malformed
    response); False = fail the job now (out of memory, a CUDA error, bad credentials).
    ``retry_after_s``: how long the server asked to be left alone (HTTP Retry-After), or
    None."""

    def __init__(
        self, message: str, *, retry_in_job: bool = True, retry_after_s: float | None = None
    ):
        super().__init__(message)
        self.retry_in_job = retry_in_job
        self.retry_after_s = retry_after_s


class TransportError(RuntimeError):
    """Backend failures that persisted through the in-job retries: the job fails, writes
    nothing, and a rerun redoes it."""


@dataclass(frozen=True)
class TransportPolicy:
    """How long a job keeps asking again after backend failures: ``retries`` more rounds,
    waiting ``backoff_s`` seconds before the first and doubling up to ``max_backoff_s``,
    or the server's Retry-After where it is longer, at most ``retry_after_max_s``."""

    retries: int = 2
    backoff_s: float = 10.0
    max_backoff_s: float = 60.0
    retry_after_max_s: float = 30.0

    @classmethod
    def from_spec(cls, spec: Any) -> TransportPolicy:
        return cls(
            retries=int(spec.get("transport_retries", cls.retries)),
            backoff_s=float(spec.get("transport_backoff_s", cls.backoff_s)),
            max_backoff_s=float(spec.get("transport_max_backoff_s", cls.max_backoff_s)),
            retry_after_max_s=float(spec.get("retry_after_max_s", cls.retry_after_max_s)),
        )

    def wait(self, retry: int, retry_after_s: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based): the backoff, or the
        server's ``retry_after_s`` (capped at ``retry_after_max_s``) where that is longer."""
        backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (retry - 1))
        if retry_after_s is None or not retry_after_s > 0:
            return backoff
        return max(backoff, min(float(retry_after_s), self.retry_after_max_s))

    def longest_waits_s(self) -> float:
        """The most a job can wait between its rounds in all: every wait at the longer of
        the backoff and the Retry-After cap."""
        return sum(
            max(min(self.max_backoff_s, self.backoff_s * 2 ** (k - 1)), self.retry_after_max_s)
            for k in range(1, self.retries + 1)
        )


def out_of_memory_errors() -> tuple[type[BaseException], ...]:
    """MemoryError and torch's out-of-memory exception where torch is already imported (a
    backend that could raise it has imported torch)."""
    import sys

    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return (MemoryError, oom) if oom is not None else (MemoryError,)


# -------------------------------------------------------------------- seeds and cache
def request_seed(seed: int, unit: str, attempt: int) -> int:
    """Stable per-(unit, attempt) seed below 2**31: a sampling backend draws independently
    per item, a retry is a new draw, and a rerun reproduces every draw."""
    return int(stable_id("vlm-seed", seed, unit, attempt), 16) % (2**31)


class ResponseCache:
    """Raw responses on disk, one small JSON file per request key. Only answers are cached,
    never failures."""

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
        try:
            write_json(self.path(key), {"key": key, "response": response, **meta})
        except OSError as exc:  # a full or read-only cache costs speed only
            logger.warning("response cache: not written (%s)", exc)


# -------------------------------------------------------------------- JSON answers
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


# -------------------------------------------------------------------- one round
BODY_PREVIEW = 200
"""Characters of a malformed response that a failure quotes."""


@dataclass
class Answer:
    """What one request of a round got: the text ("" when none), whether it came from the
    cache, the backend seconds attributed to it, and an item failure's reason."""

    text: str = ""
    cached: bool = False
    seconds: float = 0.0
    failure: str | None = None


def ask_round(
    vlm: Any,
    requests: list,
    keys: list[str] | None,
    cache: ResponseCache | None,
    model_name: str,
    attempt: int,
    max_attempts: int | None = None,
    *,
    label: str = "",
    log: Log = print,
    policy: TransportPolicy | None = None,
    cache_if: Callable[[int, str], bool] | None = None,
    sleep: Callable[[float], Any] = time.sleep,
    legacy_keys: list[str] | None = None,
) -> list[Answer]:
    """One round of requests: cached answers first, the rest in one ``vlm.answer`` call.
    ``keys``: the cache keys (None = no cache); ``legacy_keys``: under the legacy fingerprint,
    looked up where ``keys`` miss. Backend failures are asked again after ``policy``'s backoff,
    then raise :class:`TransportError`. Cached: answers where ``cache_if(i, text)`` (default:
    non-empty)."""
    policy = policy or TransportPolicy()
    use_cache = cache is not None and keys is not None
    label = label or model_name
    out = [Answer() for _ in requests]
    if use_cache:
        for j, key in enumerate(keys):
            hit = cache.get(key)
            if hit is None and legacy_keys is not None:
                hit = cache.get(legacy_keys[j])
                if hit is not None:
                    cache.put(key, hit, model=model_name, attempt=attempt)
            if hit is not None:
                out[j] = Answer(text=hit, cached=True)
    ask = [j for j, a in enumerate(out) if not a.cached]
    log(
        f"{label}: attempt {attempt}{f'/{max_attempts}' if max_attempts else ''}:"
        f" {len(requests)} request(s) ({len(requests) - len(ask)} cached, {len(ask)} asked)"
    )
    oom = out_of_memory_errors()
    retry = 0
    while ask:
        started = time.perf_counter()
        try:
            got = vlm.answer([requests[j] for j in ask])
        except oom:
            raise
        except BackendFailure as exc:
            if not exc.retry_in_job:
                raise
            got = [exc] * len(ask)
        if len(got) != len(ask):
            raise RuntimeError(
                f"{label}: backend returned {len(got)} answers for {len(ask)} requests"
            )
        share = (time.perf_counter() - started) / len(ask)
        failed: list[int] = []
        reasons: list[str] = []
        retry_after: list[float] = []
        for j, result in zip(ask, got, strict=True):
            out[j].seconds += share
            if not isinstance(result, (str, ItemFailure, BackendFailure)):
                result = BackendFailure(
                    f"{label}: malformed response: the backend returned a "
                    f"{type(result).__name__}, not a text: {repr(result)[:BODY_PREVIEW]}",
                    retry_in_job=True,
                )
            if isinstance(result, BackendFailure):
                if result.retry_after_s is not None:
                    retry_after.append(result.retry_after_s)
                if not result.retry_in_job:
                    raise result
                failed.append(j)
                reasons.append(str(result))
            elif isinstance(result, ItemFailure):
                out[j].failure = result.reason
            else:
                text = result
                out[j].text = text
                keep = cache_if(j, text) if cache_if else bool(text)
                if use_cache and keep:
                    cache.put(keys[j], text, model=model_name, attempt=attempt)
        if not failed:
            break
        retry += 1
        if retry > policy.retries:
            raise TransportError(
                f"{label}: {len(failed)} of {len(requests)} request(s) failed in the backend "
                f"after {policy.retries} retries (last: {reasons[-1]}). Nothing of this job "
                "was written; the answers that came back are cached. Rerun when the backend "
                "is back (after a killed run, `snakemake --unlock` first)."
            )
        asked_for = max(retry_after) if retry_after else None
        wait = policy.wait(retry, asked_for)
        log(
            f"{label}: {len(failed)} request(s) failed in the backend ({reasons[-1]}); "
            f"retry {retry}/{policy.retries} in {wait:g} s"
            + (f" (the server asked for {asked_for:g} s)" if asked_for is not None else "")
        )
        sleep(wait)
        ask = failed
    return out


# -------------------------------------------------------------------- the retry loop
@dataclass
class Asked:
    """The outcome of one item over its attempts."""

    response: str = ""
    """The last answer's text ("" when none came)."""
    value: Any = None
    """What ``validate`` returned for the last answer."""
    error: str | None = None
    """Why the last answer was not accepted (None = accepted)."""
    failure: str | None = None
    """Why the item could not be asked (an ItemFailure's reason), else None."""
    attempts: int = 0
    cached: bool = False
    """Whether the last answer came from the cache."""
    seconds: float = 0.0
    request_key: str | None = None
    log: list[dict[str, Any]] = field(default_factory=list)
    """One entry per attempt: attempt, response_sha256, error, cached (+ validate's extra)."""

    @property
    def accepted(self) -> bool:
        return self.attempts > 0 and self.error is None and self.failure is None


Validate = Callable[[int, str], tuple]
"""validate(i, text) -> (value, error) or (value, error, extra log fields); error None =
accepted."""


def ask_items(
    vlm: Any,
    spec: Any,
    build: Callable[[int, int], Any],
    n: int,
    *,
    validate: Validate,
    max_attempts: int,
    cache: ResponseCache | None = None,
    image_sha: Sequence[str | None] | None = None,
    label: str = "",
    log: Log = print,
    cache_if: Callable[[int, str], bool] | None = None,
    skip: Sequence[int] = (),
) -> list[Asked]:
    """Ask ``n`` items in rounds: round k sends ``build(i, k)`` for every item not yet
    accepted, in one backend call, until ``validate`` accepts it or ``max_attempts`` is
    reached. ``cache`` (None = off) keys answers by the request and ``image_sha[i]``;
    ``cache_if`` as in :func:`ask_round`; items in ``skip`` are not asked (attempts 0)."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    fingerprint = spec.fingerprint()
    legacy = getattr(spec, "legacy_fingerprint", lambda: None)()
    policy = TransportPolicy.from_spec(spec)
    state = [Asked() for _ in range(n)]
    shas = list(image_sha) if image_sha is not None else [None] * n
    skipped = set(skip)
    pending = [i for i in range(n) if i not in skipped]
    for attempt in range(1, max_attempts + 1):
        if not pending:
            break
        requests = [build(i, attempt) for i in pending]
        keys = legacy_keys = None
        if cache is not None:
            asked = list(zip(requests, pending, strict=True))
            keys = [r.cache_key(fingerprint, shas[i]) for r, i in asked]
            if legacy is not None:
                legacy_keys = [r.cache_key(legacy, shas[i]) for r, i in asked]
        answers = ask_round(
            vlm,
            requests,
            keys,
            cache,
            spec.name,
            attempt,
            max_attempts,
            label=label or spec.name,
            log=log,
            policy=policy,
            cache_if=(lambda j, text, batch=pending: cache_if(batch[j], text))
            if cache_if
            else None,
            legacy_keys=legacy_keys,
        )
        still = []
        for j, i in enumerate(pending):
            s, a = state[i], answers[j]
            s.attempts = attempt
            s.seconds += a.seconds
            s.cached = a.cached
            s.request_key = keys[j] if keys else None
            if a.failure is not None:
                s.failure, s.response, s.value = a.failure, "", None
                s.error = a.failure
                s.log.append(
                    {
                        "attempt": attempt,
                        "response_sha256": None,
                        "error": a.failure,
                        "cached": False,
                    }
                )
                continue
            result = validate(i, a.text)
            value, error = result[0], result[1]
            extra = result[2] if len(result) > 2 else {}
            s.response, s.value, s.error = a.text, value, error
            s.log.append(
                {
                    "attempt": attempt,
                    "response_sha256": sha256_bytes(a.text.encode("utf-8")),
                    "error": error,
                    **extra,
                    "cached": a.cached,
                }
            )
            if error is not None:
                still.append(i)
        pending = still
    return state


def image_hashes(items: Sequence[Any]) -> tuple[list[str | None], dict[int, str]]:
    """Each item's ``image_sha256``, its ``image_path`` hashed where it has none, and by
    item index why an image could not be read (that item's hash None)."""
    shas: list[str | None] = []
    unreadable: dict[int, str] = {}
    for i, item in enumerate(items):
        sha = item.get("image_sha256") if isinstance(item, dict) else None
        if sha is None:
            try:
                sha = sha256_file(item["image_path"])
            except (KeyError, TypeError, OSError) as exc:
                unreadable[i] = f"image not readable: {type(exc).__name__}: {exc}"
        shas.append(sha)
    return shas, unreadable


def ask_images(
    vlm: Any,
    spec: Any,
    build: Callable[[int, int], Any],
    image_sha: Sequence[str | None],
    *,
    temperature: float,
    cache: ResponseCache | None,
    label: str,
    log: Log,
    skip: Sequence[int] = (),
    **options: Any,
) -> list[Asked]:
    """:func:`ask_items` over one item per image (``image_sha``), the images in ``skip``
    unreadable: logs how many are read, and caches only deterministic requests
    (``temperature`` 0)."""
    n = len(image_sha)
    log(f"{label}: {n - len(skip)} image(s) to read" + (f", {len(skip)} unreadable" * bool(skip)))
    cache = cache if temperature == 0 else None
    return ask_items(
        vlm, spec, build, n, cache=cache, image_sha=image_sha, label=label, log=log, skip=skip,
        **options,
    )  # fmt: skip
