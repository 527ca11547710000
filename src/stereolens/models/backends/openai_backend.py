"""Vision-language models behind any OpenAI-compatible chat-completions endpoint (hosted APIs
or a local ``vllm serve``): keys, structured outputs, concurrency and failures are described in
docs/adding-a-model.md, "The backends in detail"."""

from __future__ import annotations

import copy
import email.utils
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stereolens.images import ImageUnreadable
from stereolens.models.api_wait import API_MAX_RETRIES, API_TIMEOUT_S
from stereolens.models.ask import BODY_PREVIEW, BackendFailure, ItemFailure
from stereolens.models.backends.vllm_backend import build_vllm_messages
from stereolens.models.registry import ModelSpec
from stereolens.models.requests import VLMRequest
from stereolens.validation import ConfigError

logger = logging.getLogger(__name__)

PLACEHOLDER_KEY = "EMPTY"
OPENAI_URL = "https://api.openai.com/v1"

STRICT_UNSUPPORTED = frozenset(
    {
        "minLength",
        "maxLength",
        "patternProperties",
        "unevaluatedProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "unevaluatedItems",
        "contains",
        "minContains",
        "maxContains",
        "uniqueItems",
        "$schema",
        "$id",
    }
)
"""Keywords dropped for OpenAI strict mode (it rejects them). The answer is still
validated against the full schema afterwards, so nothing is lost but the
decoding-time guarantee for these bounds."""

_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


def strict_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` that OpenAI strict mode accepts: every object gets
    ``additionalProperties: false`` and all its properties required (an optional one should
    be nullable instead); STRICT_UNSUPPORTED keywords are dropped."""

    def fix(node: Any) -> Any:
        if isinstance(node, list):
            return [fix(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: v for k, v in node.items() if k not in STRICT_UNSUPPORTED}
        for key in _SUBSCHEMA_MAPS:
            if isinstance(out.get(key), dict):
                out[key] = {name: fix(sub) for name, sub in out[key].items()}
        for key in _SUBSCHEMA_LISTS:
            if isinstance(out.get(key), list):
                out[key] = [fix(sub) for sub in out[key]]
        if isinstance(out.get("items"), dict):
            out["items"] = fix(out["items"])
        types = out.get("type")
        is_object = types == "object" or (isinstance(types, list) and "object" in types)
        if is_object or "properties" in out:
            out.setdefault("properties", {})
            out["additionalProperties"] = False
            out["required"] = list(out["properties"])
        return out

    return fix(copy.deepcopy(schema))


def choice_schema(choices: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """The one-field JSON schema used for choice requests."""
    return {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": list(choices)}},
        "required": ["answer"],
        "additionalProperties": False,
    }


def build_chat_kwargs(request: VLMRequest, spec: ModelSpec) -> dict[str, Any]:
    """Keyword arguments of ``client.chat.completions.create`` for one request."""
    kwargs: dict[str, Any] = {
        "model": spec.model,
        "messages": build_vllm_messages(request, spec.get("image_max_side")),
        "max_completion_tokens": int(request.max_new_tokens),
    }
    effort = spec.get("reasoning_effort")
    if effort:
        kwargs["reasoning_effort"] = effort
    else:
        kwargs["temperature"] = float(request.temperature)
    if request.seed is not None:
        kwargs["seed"] = int(request.seed)
    if request.json_schema is not None and request.choices is not None:
        raise ValueError("a request constrains its answer by json_schema or choices, not both")
    if request.json_schema is not None:
        strict = bool(spec.get("strict_schema", True))
        schema = request.json_schema
        name = re.sub(r"[^A-Za-z0-9_-]", "_", str(schema.get("title") or "answer"))[:64]
        schema = strict_json_schema(schema) if strict else copy.deepcopy(schema)
    elif request.choices is not None:
        name, schema, strict = "choice", choice_schema(request.choices), True
    else:
        return kwargs
    kwargs["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": schema, "strict": strict},
    }
    return kwargs


class OpenAIVLM:
    """A VLM behind an OpenAI-compatible endpoint; see docs/adding-a-model.md."""

    def __init__(self, spec: ModelSpec):
        from openai import OpenAI

        self.spec = spec
        env = spec.get("api_key_env")
        base_url = spec.get("base_url")
        if env:
            key = os.environ.get(env)
            if not key:
                raise ConfigError(
                    f"model {spec.name!r}: environment variable {env} is not set; it must hold "
                    f"the API key for {base_url or 'the OpenAI API'} (registry key api_key_env)"
                )
        elif base_url:
            key = PLACEHOLDER_KEY  # local servers (vllm serve without --api-key)
        else:
            raise ConfigError(
                f"model {spec.name!r}: set api_key_env to the name of the environment "
                "variable that holds the API key (or base_url for a local endpoint)"
            )
        self._secret = key if key != PLACEHOLDER_KEY else None
        self.server = base_url or OPENAI_URL
        self._down: threading.Event | None = None
        self._down_reason = ""
        self._lock = threading.Lock()
        self.timeout_s = float(spec.get("timeout_s", API_TIMEOUT_S))
        self.max_concurrency = int(spec.get("max_concurrency", 4))
        self._limiter = RateLimiter(spec.get("requests_per_minute"))
        self._client = OpenAI(
            api_key=key,
            base_url=base_url,
            timeout=self.timeout_s,
            max_retries=int(spec.get("max_retries", API_MAX_RETRIES)),
        )

    def __repr__(self) -> str:
        return f"OpenAIVLM({self.spec.name!r}, model={self.spec.model!r})"

    def mask(self, text: str) -> str:
        """``text`` with the API key replaced by ***."""
        return text.replace(self._secret, "***") if self._secret else text

    def _answer_one(self, index: int, request: VLMRequest) -> str | ItemFailure | BackendFailure:
        """The model's answer (a refusal's text too), an ItemFailure when the API rejects
        this input (ITEM_STATUS, an unreadable image), or a BackendFailure for everything
        outside the model (see :func:`classify_api_error`)."""
        try:
            kwargs = build_chat_kwargs(request, self.spec)
        except ImageUnreadable as exc:
            return ItemFailure(str(exc))
        self._limiter.wait()
        down = self._down
        if down is not None and down.is_set():
            return BackendFailure(
                f"not sent, after an earlier failure of this round: {self._down_reason}",
                retry_in_job=True,
            )
        try:
            raw = self._client.chat.completions.with_raw_response.create(
                **kwargs, timeout=self.timeout_s
            )
        except Exception as exc:  # after the client's own retries
            failure = classify_api_error(exc, self.mask, server=self.server)
            if isinstance(failure, BackendFailure) and status_of(exc) in ENDPOINT_DOWN:
                self._stop_round(failure)
            logger.error("openai backend %s: request %d failed: %s", self.spec.name, index, failure)
            return failure
        try:
            text, refusal = completion_text(raw.parse())
        except Exception as exc:  # not JSON, or JSON that is not a chat completion
            failure = malformed_response(raw, f"{type(exc).__name__}: {exc}", self.server)
            failure = BackendFailure(self.mask(str(failure)), retry_in_job=True)
            self._stop_round(failure)
            logger.error("openai backend %s: request %d: %s", self.spec.name, index, failure)
            return failure
        if refusal:
            logger.warning(
                "openai backend %s: request %d refused: %s",
                self.spec.name,
                index,
                self.mask(refusal),
            )
            return refusal
        if request.choices is not None and text:
            try:
                answer = json.loads(text).get("answer")
            except (ValueError, AttributeError):
                return text  # not the wrapped choice: the caller's validation decides
            return answer if answer in request.choices else text
        return text

    def _stop_round(self, failure: BackendFailure) -> None:
        """After ``failure`` the rest of this ``answer`` call is not sent (see the module
        docstring): a dead endpoint costs one timeout per round."""
        with self._lock:
            if self._down is not None and not self._down.is_set():
                self._down_reason = str(failure)
                self._down.set()

    def answer(self, requests: list[VLMRequest]) -> list[str | ItemFailure | BackendFailure]:
        if not requests:
            return []
        workers = max(1, min(self.max_concurrency, len(requests)))
        self._down = threading.Event()  # set by this call's first backend failure
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="openai-vlm") as pool:
            return list(pool.map(self._answer_one, range(len(requests)), requests))


def completion_text(response: Any) -> tuple[str, str | None]:
    """(text, refusal) of a parsed chat completion; ValueError when ``response`` is not one
    (the client hands back a non-JSON body as a str, and JSON of another shape as an
    object without choices)."""
    choices = getattr(response, "choices", None)
    if isinstance(response, (str, bytes)) or not isinstance(choices, list) or not choices:
        raise ValueError("no choices in the response")
    message = getattr(choices[0], "message", None)
    if message is None or isinstance(message, dict):
        raise ValueError("the first choice has no message")
    content = getattr(message, "content", None)
    refusal = getattr(message, "refusal", None)
    if content is not None and not isinstance(content, str):
        raise ValueError(f"the message content is a {type(content).__name__}, not a text")
    if refusal is not None and not isinstance(refusal, str):
        raise ValueError(f"the message refusal is a {type(refusal).__name__}, not a text")
    return content or "", refusal or None


def malformed_response(raw: Any, why: str, server: str) -> BackendFailure:
    """A retried BackendFailure for a response that is not a chat completion, naming the
    server, the status, the content type and the first bytes of the body."""
    try:
        body = raw.text
    except Exception:  # an undecodable body: its bytes
        body = repr(getattr(raw, "content", b""))
    status = getattr(raw, "status_code", "?")
    ctype = getattr(raw, "headers", {}).get("content-type", "no content type")
    preview = body[:BODY_PREVIEW]
    more = f" ... ({len(body)} characters)" if len(body) > BODY_PREVIEW else ""
    return BackendFailure(
        f"{server}: malformed response (HTTP {status}, {ctype}; {why}); the body starts "
        f"{preview!r}{more}",
        retry_in_job=True,
    )


def retry_after_s(headers: Any) -> float | None:
    """Seconds a response's ``retry-after-ms`` or ``Retry-After`` header (seconds or an
    HTTP date) asks the client to wait, or None."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                continue
            seconds = when.timestamp() - time.time()
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None


RETRY_STATUS = frozenset({408, 409, 429})
"""HTTP statuses worth asking again (with every 5xx)."""
ITEM_STATUS = frozenset({400, 413, 415, 422})
"""HTTP statuses that reject this request's input: the item's own failure."""


ENDPOINT_DOWN = frozenset({None, 429, 502, 503, 504})
"""Failures that say the endpoint, not one request, is failing (no HTTP status: refused,
timed out, cut off; rate limited; a gateway without its upstream): the rest of the round is
not sent. A malformed response counts too; an HTTP 500 may be one request's own."""


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an OpenAI client exception, or None (no response)."""
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return None if status is None else int(status)


def classify_api_error(
    exc: BaseException, mask: Callable[[str], str] = lambda t: t, server: str = ""
) -> ItemFailure | BackendFailure:
    """What an exception of the OpenAI client means for the run (see OpenAIVLM._answer_one).
    ``server`` (the endpoint) starts the message of a BackendFailure."""
    response = getattr(exc, "response", None)
    status = status_of(exc)
    where = f"{server}: " if server else ""
    text = f"{type(exc).__name__}: {mask(str(exc))}"
    if status is None:  # connection refused, DNS, timeout, a broken stream, a bad body
        return BackendFailure(where + text, retry_in_job=True)
    status = int(status)
    if status in ITEM_STATUS:
        return ItemFailure(f"rejected by the API (HTTP {status}): {mask(str(exc))}")
    return BackendFailure(
        f"{where}HTTP {status}: {text}",
        retry_in_job=status in RETRY_STATUS or status >= 500,
        retry_after_s=retry_after_s(getattr(response, "headers", None))
        if status in (429, 503)
        else None,
    )


class RateLimiter:
    """At most ``per_minute`` request starts per minute, shared by the worker threads
    (None = no limit)."""

    def __init__(self, per_minute: float | None, clock=time.monotonic, sleep=time.sleep):
        self.interval = 60.0 / float(per_minute) if per_minute else 0.0
        self._next = 0.0
        self._lock = threading.Lock()
        self._clock, self._sleep = clock, sleep

    def wait(self) -> None:
        if not self.interval:
            return
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            self._sleep(start - now)
