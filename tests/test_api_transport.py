"""What an API model's job does when the endpoint misbehaves (issue 24, items 5, 8 and 9),
against scripted OpenAI-compatible HTTP servers on 127.0.0.1 and the real OpenAI client:

* a malformed response (an HTML page under HTTP 200, a body that is not JSON, JSON of
  another shape) is a retried transport failure that names the server and quotes the
  body, and then the same job failure as an outage;
* HTTP 429/503 Retry-After is honoured, capped by ``retry_after_max_s``; the default
  worst case on a dead endpoint is under 5 minutes and ``check-config`` prints it;
* moving a server (``base_url``) changes no fingerprint, and the response cache still hits.

Every server answers within a second or hangs for at most a few; no test here takes long.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from stereolens.models.ask import (
    BackendFailure,
    ResponseCache,
    TransportError,
    TransportPolicy,
    ask_items,
    ask_round,
)
from stereolens.models.registry import RUNTIME_ONLY, ModelSpec, load_registry
from stereolens.models.requests import VLMRequest
from stereolens.paths import resource
from stereolens.workflow_support import model_fingerprint_json

KEY = "sk-transport-test-KEY-42"
HTML = (
    "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head>"
    "<body><h1>Bad Gateway</h1><p>The proxy could not reach the upstream server.</p>"
    + "<!-- padding -->" * 40
    + "</body></html>"
)


def completion(content: str) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class Scripted:
    """An OpenAI-compatible server on 127.0.0.1 that plays ``script`` (one reply per
    request, in order; the last one repeats): a reply is (status, headers, body bytes,
    content type) or the string "hang" (accept and never answer, until the test ends).
    A request's answer otherwise is the text it was asked, as JSON content."""

    def __init__(self, script: list):
        self.script = list(script)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with server.lock:
                    server.requests.append(body)
                    n = len(server.requests)
                    reply = server.script[min(n, len(server.script)) - 1]
                if reply == "hang":
                    server.release.wait(10)
                    return
                if reply == "echo":
                    text = body["messages"][-1]["content"][-1]["text"]
                    reply = (200, {}, json.dumps(completion(text)).encode(), "application/json")
                status, headers, data, ctype = reply
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def serve(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("STEREOLENS_TRANSPORT_KEY", KEY)
    servers: list[Scripted] = []

    def start(script):
        servers.append(Scripted(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def api_spec(base_url: str, **settings) -> ModelSpec:
    base = {
        "base_url": base_url,
        "api_key_env": "STEREOLENS_TRANSPORT_KEY",
        "max_concurrency": 2,
        "timeout_s": 5,
        "transport_retries": 1,
        "transport_backoff_s": 0.05,
        "max_new_tokens": 16,
        "temperature": 0,
    }
    return ModelSpec(
        name="api-vlm",
        kind="vlm",
        backend="openai",
        model="gpt-test",
        settings={**base, **settings},
    )


def vlm(spec: ModelSpec):
    from stereolens.models.backends.openai_backend import OpenAIVLM

    return OpenAIVLM(spec)


def ask(spec: ModelSpec, texts: list[str], cache=None, log=None):
    return ask_items(
        vlm(spec),
        spec,
        lambda i, attempt: VLMRequest(text=texts[i], seed=0, attempt=attempt),
        len(texts),
        validate=lambda i, text: (text, None),
        max_attempts=1,
        cache=cache,
        log=log or (lambda m: None),
    )


# ------------------------------------------------------------------ item 5: malformed
MALFORMED = {
    "html under HTTP 200": (200, {}, HTML.encode(), "text/html"),
    "not JSON": (200, {}, b'{"choices": [oops', "application/json"),
    "JSON of another shape": (200, {}, b'{"result": "fine"}', "application/json"),
    "no choices": (
        200,
        {},
        json.dumps({**completion("x"), "choices": []}).encode(),
        "application/json",
    ),
    "content not a text": (
        200,
        {},
        json.dumps(completion("x")).replace('"content": "x"', '"content": [1, 2]').encode(),
        "application/json",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_response_is_a_retried_failure_naming_server_and_body(serve, case):
    server = serve([MALFORMED[case]])
    answers = vlm(api_spec(server.base_url)).answer([VLMRequest(text="q")])
    failure = answers[0]
    assert isinstance(failure, BackendFailure) and failure.retry_in_job
    message = str(failure)
    assert server.base_url in message and "malformed response" in message
    assert "HTTP 200" in message
    body = MALFORMED[case][2].decode()
    assert repr(body[:40])[1:-1] in message  # the first bytes of the body, quoted
    if case == "html under HTTP 200":
        assert "text/html" in message and f"({len(body)} characters)" in message
        assert len(message) < 600  # a preview, not the whole page


def test_malformed_responses_are_retried_then_fail_the_job_like_an_outage(serve):
    html = MALFORMED["html under HTTP 200"]
    # the proxy's page once, then the server: the job recovers within its retries
    server = serve([html, "echo"])
    asked = ask(api_spec(server.base_url, max_concurrency=1), ["alpha"])
    assert asked[0].accepted and asked[0].response == "alpha" and len(server.requests) == 2
    # the page every time: the job fails with the outage's message, naming the server
    # and quoting the page
    down = serve([html])
    with pytest.raises(TransportError, match="failed in the backend after 1 retries") as err:
        ask(api_spec(down.base_url), ["a", "b", "c"])
    assert down.base_url in str(err.value) and "<!DOCTYPE html>" in str(err.value)
    # an outage says the same, with the server named
    with pytest.raises(TransportError, match="failed in the backend after 1 retries") as err:
        ask(api_spec("http://127.0.0.1:9/v1"), ["a"])
    assert "http://127.0.0.1:9/v1" in str(err.value)


class Returns:
    """A backend whose ``answer`` returns ``value`` for every request (a broken one)."""

    def __init__(self, value):
        self.value, self.calls = value, 0

    def answer(self, requests):
        self.calls += 1
        return [self.value for _ in requests]


@pytest.mark.parametrize("value", [None, {"text": "x"}, b"bytes"])
def test_any_backend_returning_something_else_than_a_text_fails_the_job(value):
    spec = ModelSpec(
        name="broken",
        kind="vlm",
        backend="transformers",
        model="m",
        settings={"transport_retries": 1, "transport_backoff_s": 0},
    )
    backend = Returns(value)
    with pytest.raises(TransportError, match="malformed response") as err:
        ask_items(
            backend,
            spec,
            lambda i, a: VLMRequest(text="q"),
            2,
            validate=lambda i, t: (t, None),
            max_attempts=1,
            log=lambda m: None,
        )
    assert backend.calls == 2 and repr(value)[:10] in str(err.value)


def test_vllm_engine_output_of_the_wrong_shape_is_a_retried_failure():
    from types import SimpleNamespace

    from stereolens.models.backends.vllm_backend import VLLMVLM

    engine = VLLMVLM.__new__(VLLMVLM)  # no engine started: _chat only calls llm.chat
    engine.spec = ModelSpec(name="v", kind="vlm", backend="vllm", model="org/model")
    ok = SimpleNamespace(outputs=[SimpleNamespace(text="fine")])
    engine.llm = SimpleNamespace(chat=lambda conv, **kw: [ok])
    assert engine._chat([1], [None]) == ["fine"]
    for outputs in ([ok, ok], [SimpleNamespace(outputs=[SimpleNamespace(text=None)])]):
        engine.llm = SimpleNamespace(chat=lambda conv, _o=outputs, **kw: _o)
        with pytest.raises(BackendFailure, match="malformed response") as err:
            engine._chat([1], [None])
        assert err.value.retry_in_job and "org/model" in str(err.value)


# ------------------------------------------------------------------ item 8: waiting
def test_retry_after_is_honoured_and_capped(serve):
    cases = [
        ({"Retry-After": "2"}, 429, {}, 2.0),
        ({"Retry-After": "1.5"}, 503, {}, 1.5),
        ({"retry-after-ms": "1250"}, 429, {}, 1.25),
        ({"Retry-After": "3600"}, 429, {"retry_after_max_s": 4}, 4.0),  # capped
        ({}, 429, {}, 0.05),  # no header: the backoff
    ]
    for headers, status, extra, expected in cases:
        body = json.dumps({"error": {"message": "slow down"}}).encode()
        server = serve([(status, headers, body, "application/json"), "echo"])
        spec = api_spec(server.base_url, **extra)
        slept, lines = [], []
        answers = ask_round(
            vlm(spec),
            [VLMRequest(text="x")],
            None,
            None,
            spec.name,
            1,
            log=lines.append,
            policy=TransportPolicy.from_spec(spec),
            sleep=slept.append,
        )
        assert answers[0].text == "x" and len(server.requests) == 2  # the client did not retry
        assert slept == [pytest.approx(expected, abs=0.01)], (headers, status)
        if headers:
            assert "the server asked for" in lines[-1]
    # an HTTP date, 3 s ahead
    from email.utils import formatdate

    from stereolens.models.backends.openai_backend import retry_after_s

    assert retry_after_s({"retry-after": formatdate(time.time() + 3, usegmt=True)}) == (
        pytest.approx(3, abs=1.1)
    )
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({}) is None


def test_default_worst_case_on_a_dead_endpoint_is_under_five_minutes():
    from stereolens.models.api_wait import worst_case_hang_s

    schema = yaml.safe_load(resource("schemas", "models.schema.yaml").read_text())
    for section in ("vlm", "llm"):
        props = schema["$defs"][section]["properties"]
        defaults = {
            k: props[k]["default"]
            for k in (
                "timeout_s",
                "max_retries",
                "transport_retries",
                "transport_backoff_s",
                "transport_max_backoff_s",
                "retry_after_max_s",
            )
        }
        assert "retry_after_max_s" in RUNTIME_ONLY
        bare = ModelSpec(name="x", kind="vlm", backend="openai", model="m")
        documented = ModelSpec(name="x", kind="vlm", backend="openai", model="m", settings=defaults)
        # the code's defaults are the documented ones; 3 rounds x 60 s + 2 waits x 30 s
        assert worst_case_hang_s(bare) == worst_case_hang_s(documented) == 240 < 300
    # 40 minutes with the old defaults (timeout 120, client retries 4, 3 rounds, 5 s)
    old = {"timeout_s": 120, "max_retries": 4, "transport_retries": 3, "transport_backoff_s": 5}
    old_spec = ModelSpec(name="x", kind="vlm", backend="openai", model="m", settings=old)
    assert worst_case_hang_s(old_spec) > 2400
    # every API entry of the shipped registry stays under 5 minutes too
    registry = load_registry("config/models.yaml")
    api = [s for s in registry.values() if s.backend == "openai"]
    assert api and all(worst_case_hang_s(s) < 300 for s in api)


def test_a_hanging_endpoint_fails_the_job_within_the_worst_case(serve):
    from stereolens.models.api_wait import worst_case_hang_s

    server = serve(["hang"])
    spec = api_spec(server.base_url, timeout_s=1, transport_backoff_s=0.2, retry_after_max_s=0)
    bound = worst_case_hang_s(spec)
    assert bound == pytest.approx(2 * 1 + 0.2)
    started = time.monotonic()
    with pytest.raises(TransportError, match="failed in the backend after 1 retries") as err:
        ask(spec, [f"q{k}" for k in range(8)])
    elapsed = time.monotonic() - started
    # one timeout per round, not one per wave of max_concurrency requests (8 / 2 = 4)
    assert elapsed < bound + 1.5, elapsed
    assert len(server.requests) <= 2 * spec.get("max_concurrency")
    assert server.base_url in str(err.value) and "Timeout" in str(err.value)


def test_check_config_prints_the_worst_case_for_the_api_models(capsys, monkeypatch):
    from stereolens.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-used")  # check-config refuses an unset key

    assert main(["check-config", "--configfile", "config/config.yaml"]) == 0
    out = capsys.readouterr().out
    assert "API model gpt-4o-mini: a dead endpoint fails a job after at most 240 s" in out
    assert "API model gpt-5-mini: a dead endpoint fails a job after at most 270 s" in out
    assert "API model sdxl" not in out and "API model qwen2.5-vl-7b:" not in out


# ------------------------------------------------------------------ item 9: where served
def _old_fingerprint(spec: ModelSpec) -> dict:
    """The fingerprint as d475618 computed it (everything but RUNTIME_ONLY)."""
    return {
        "name": spec.name,
        "backend": spec.backend,
        "model": spec.model,
        "revision": spec.revision,
        **{k: v for k, v in sorted(spec.settings.items()) if k not in RUNTIME_ONLY},
    }


def test_base_url_is_not_part_of_the_fingerprint_but_model_and_revision_are():
    a = api_spec("http://127.0.0.1:8000/v1")
    moved = api_spec("http://gpu-node-7:9001/v1")
    assert model_fingerprint_json(a) == model_fingerprint_json(moved)
    renamed = ModelSpec(**{**a.__dict__, "model": "gpt-test-2"})
    revised = ModelSpec(**{**a.__dict__, "revision": "2025-08-07"})
    assert len({model_fingerprint_json(s) for s in (a, renamed, revised)}) == 3
    # every non-API entry of the shipped registry keeps its fingerprint byte for byte
    # (its finished jobs do not rerun on the upgrade); API entries with base_url lose it
    for spec in load_registry("config/models.yaml").values():
        old = json.dumps(_old_fingerprint(spec), sort_keys=True, default=str)
        if "base_url" in spec.settings:
            assert spec.legacy_fingerprint() == _old_fingerprint(spec)
            assert "base_url" not in json.loads(model_fingerprint_json(spec))
        else:
            assert model_fingerprint_json(spec) == old and spec.legacy_fingerprint() is None


def test_moving_the_server_keeps_the_cache(serve, tmp_path):
    cache = ResponseCache(tmp_path / "cache")
    texts = ["one", "two", "three"]
    first = serve(["echo"])
    lines: list[str] = []
    got = ask(api_spec(first.base_url), texts, cache=cache, log=lines.append)
    assert [a.response for a in got] == texts and "(0 cached, 3 asked)" in lines[0]
    moved = serve(["echo"])  # another port
    lines.clear()
    again = ask(api_spec(moved.base_url), texts, cache=cache, log=lines.append)
    assert [a.response for a in again] == texts and all(a.cached for a in again)
    assert "(3 cached, 0 asked)" in lines[0] and moved.requests == []
    # a different model behind the address is asked
    other = ModelSpec(**{**api_spec(moved.base_url).__dict__, "model": "gpt-test-2"})
    ask(other, texts[:1], cache=cache)
    assert len(moved.requests) == 1


def test_answers_cached_before_the_upgrade_are_found(serve, tmp_path):
    """The upgrade changes an API entry's fingerprint (base_url left it) once: its jobs
    rerun, and the answers cached under the old key are found, so the API is asked
    nothing."""
    cache = ResponseCache(tmp_path / "cache")
    server = serve(["echo"])
    spec = api_spec(server.base_url)
    texts = ["one", "two"]
    for text in texts:  # what d475618 wrote: keys under the fingerprint with base_url
        request = VLMRequest(text=text, seed=0, attempt=1)
        cache.put(request.cache_key(_old_fingerprint(spec), None), f"old {text}")
    lines: list[str] = []
    got = ask(spec, texts, cache=cache, log=lines.append)
    assert [a.response for a in got] == ["old one", "old two"] and server.requests == []
    assert "(2 cached, 0 asked)" in lines[0]
    # copied under the new key: found there from now on
    new_keys = [
        VLMRequest(text=t, seed=0, attempt=1).cache_key(spec.fingerprint(), None) for t in texts
    ]
    assert [cache.get(k) for k in new_keys] == ["old one", "old two"]
