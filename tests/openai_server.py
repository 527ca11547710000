"""An OpenAI-compatible chat-completions server on 127.0.0.1 whose answers come from a real
local model (the project's own transformers backend on the tiny VLM), with faults that can
be switched on: refuse every connection (the server is not started), or answer HTTP 500
to the first N requests and then recover. The fault-injection tests point a workflow's
``backend: openai`` extractor at it. Nothing here stands in for the model: every answer
is the model's, decoded under the request's JSON schema or choices.
"""

from __future__ import annotations

import base64
import json
import socket
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from stereolens.models.ask import ItemFailure
from stereolens.models.requests import VLMRequest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request_from_body(body: dict, image_dir: Path) -> VLMRequest:
    """The VLMRequest an OpenAI chat-completions body describes (one user turn)."""
    system, text, image_path = None, "", None
    for message in body["messages"]:
        if message["role"] == "system":
            system = message["content"]
            continue
        content = message["content"]
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for part in parts:
            if part["type"] == "text":
                text = part["text"]
            elif part["type"] == "image_url":
                header, data = part["image_url"]["url"].split(",", 1)
                suffix = ".jpg" if "jpeg" in header else ".png"
                fd, path = tempfile.mkstemp(suffix=suffix, dir=image_dir)
                with open(fd, "wb") as fh:
                    fh.write(base64.b64decode(data))
                image_path = path
    schema = choices = None
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        spec = fmt["json_schema"]
        if spec.get("name") == "choice":
            choices = tuple(spec["schema"]["properties"]["answer"]["enum"])
        else:
            schema = spec["schema"]
    return VLMRequest(
        text=text,
        image_path=image_path,
        system=system,
        json_schema=schema,
        choices=choices,
        max_new_tokens=int(body.get("max_completion_tokens") or body.get("max_tokens") or 64),
        temperature=float(body.get("temperature") or 0.0),
        seed=body.get("seed"),
    )


class ModelServer:
    """Serves ``vlm`` (any object with the VLM ``answer`` protocol) on 127.0.0.1:``port``."""

    def __init__(self, vlm, port: int | None = None, api_key: str | None = None):
        self.vlm = vlm
        self.port = port or free_port()
        self.api_key = api_key
        self.fail_first = 0
        self.requests = 0
        self.failed = 0
        self._lock = threading.Lock()
        self._model_lock = threading.Lock()
        self._images = tempfile.TemporaryDirectory()
        self.server = None
        self.thread = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def respond(self, path: str, headers, body: dict) -> tuple[int, dict]:
        if path.rstrip("/") != "/v1/chat/completions":
            return 404, {"error": {"message": f"no route {path}"}}
        if self.api_key and headers.get("Authorization") != f"Bearer {self.api_key}":
            return 401, {"error": {"message": "invalid API key"}}
        with self._lock:
            self.requests += 1
            if self.fail_first > 0:
                self.fail_first -= 1
                self.failed += 1
                return 500, {"error": {"message": "injected server error"}}
        request = request_from_body(body, Path(self._images.name))
        with self._model_lock:
            answer = self.vlm.answer([request])[0]
        if isinstance(answer, ItemFailure):
            return 400, {"error": {"message": answer.reason}}
        content = json.dumps({"answer": answer}) if request.choices else answer
        return 200, {
            "id": f"chatcmpl-{self.requests}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "local"),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": content},
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    def start(self) -> ModelServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                status, payload = server.respond(self.path, self.headers, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(timeout=10)
            self.server = None
        self._images.cleanup()
