"""How long an API model's job can wait on an endpoint that fails: the openai backend's
defaults, and the worst case that ``stereolens check-config`` prints per API model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stereolens.models.ask import TransportPolicy

API_TIMEOUT_S = 60.0
"""Default per-request timeout of the openai backend (registry ``timeout_s``)."""
API_MAX_RETRIES = 0
"""Default retries of the OpenAI client itself within one request (registry
``max_retries``): none, so that every retry is the job's own, which honours Retry-After
within ``retry_after_max_s`` and logs why."""
SDK_MAX_WAIT_S = 120.0
"""The longest the OpenAI client waits between its own retries (it honours a server's
Retry-After up to two minutes)."""


def worst_case_hang_s(spec: Any) -> float:
    """Seconds an API job can spend on an endpoint that fails every request before it fails:
    every round the full timeout on each of the client's attempts, every wait the longest
    allowed."""
    timeout = float(spec.get("timeout_s", API_TIMEOUT_S))
    sdk = int(spec.get("max_retries", API_MAX_RETRIES))
    policy = TransportPolicy.from_spec(spec)
    per_round = (sdk + 1) * timeout + sdk * SDK_MAX_WAIT_S
    return (policy.retries + 1) * per_round + policy.longest_waits_s()


def api_wait_lines(registry: dict[str, Any], names: Sequence[str]) -> list[str]:
    """One line per API model of ``names``: its worst-case time on a dead endpoint
    (:func:`worst_case_hang_s`) and the registry keys that set it."""
    lines = []
    for name in sorted(set(names)):
        spec = registry.get(name)
        if spec is None or spec.backend != "openai":
            continue
        policy = TransportPolicy.from_spec(spec)
        seconds = worst_case_hang_s(spec)
        lines.append(
            f"API model {name}: a dead endpoint fails a job after at most {seconds:.0f} s "
            f"({seconds / 60:.1f} min: timeout_s {float(spec.get('timeout_s', API_TIMEOUT_S)):g}"
            f", max_retries {int(spec.get('max_retries', API_MAX_RETRIES))}, transport_retries "
            f"{policy.retries}, transport_backoff_s {policy.backoff_s:g}, retry_after_max_s "
            f"{policy.retry_after_max_s:g})"
        )
    return lines
