"""Extraction: the tiny VLM, the transformers / vLLM / OpenAI backends, the retry loop.

Everything runs on the CPU. The VLM is built in code with random weights; vLLM is
replaced by a fake module; the OpenAI-compatible endpoint is a local HTTP server
started by the tests. Nothing is downloaded.
"""
# ruff: noqa: E402  (HF_HUB_OFFLINE must be set before huggingface_hub is imported)

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import base64
import dataclasses
import json
import logging
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import pytest

from stereolens.contextbias.extract import ExtractionPrompt, check_answer, extract_images
from stereolens.contextbias.schema import AttributeSchema
from stereolens.ids import sha256_bytes, sha256_file, stable_id
from stereolens.models.ask import ResponseCache, parse_json_object, request_seed
from stereolens.models.backends.vllm_backend import (
    build_sampling_kwargs,
    build_vllm_messages,
    image_data_url,
    to_sampling_params,
)
from stereolens.models.registry import ModelSpec
from stereolens.models.requests import VLMRequest
from stereolens.validation import ConfigError

SMALL_SCHEMA = {
    "title": "Small",
    "type": "object",
    "properties": {
        "color": {"type": "string", "enum": ["red", "green", "blue", "unknown"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
        "tags": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 6},
            "maxItems": 2,
        },
    },
    "required": ["color", "count", "tags"],
    "additionalProperties": False,
}


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny model's matrices are 32 wide: one thread is fastest, and on a shared
    2-core machine two threads under contention are many times slower."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def schema() -> AttributeSchema:
    return AttributeSchema.load()


@pytest.fixture(scope="session")
def prompt() -> ExtractionPrompt:
    return ExtractionPrompt.load()


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> list[Path]:
    from PIL import Image

    d = tmp_path_factory.mktemp("images")
    paths = []
    for k, (size, color) in enumerate(
        [((40, 32), (200, 30, 30)), ((48, 64), (20, 160, 40)), ((64, 64), (30, 30, 200))]
    ):
        p = d / f"img{k}.png"
        Image.new("RGB", size, color).save(p)
        paths.append(p)
    return paths


def vlm_spec(path: Path, **settings) -> ModelSpec:
    base = {"dtype": "float32", "device": "cpu", "batch_size": 2, "max_new_tokens": 3000}
    return ModelSpec(
        name="tiny-vlm",
        kind="vlm",
        backend="transformers",
        model=str(path),
        settings={**base, **settings},
    )


@pytest.fixture(scope="session")
def tiny_vlm(tiny_vlm_dir):
    pytest.importorskip("xgrammar")
    from stereolens.models.backends.transformers_backend import TransformersVLM

    return TransformersVLM(vlm_spec(tiny_vlm_dir))


def items_for(paths: list[Path]) -> list[dict]:
    return [
        {
            "image_id": f"id{k}",
            "image_path": str(p),
            "role": "nurse",
            "prompt": "a photo of a nurse SECRET-PROMPT",
            "seed": 100 + k,
        }
        for k, p in enumerate(paths)
    ]


# ---------------------------------------------------------------------- tiny VLM
def test_tiny_vlm_loads_through_auto_classes(tiny_vlm_dir, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from stereolens.models.tiny.vlm import build_tiny_vlm

    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir)
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    assert type(processor).__name__ == "LlavaProcessor"
    tok = processor.tokenizer
    # byte-level: any text, JSON with non-ASCII included, round-trips
    text = '{"items": ["café", "日本", "tab\\t", "quote \\" x"], "n": 1}'
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    assert len(tok) < model.get_output_embeddings().weight.shape[0]  # padded lm_head
    assert processor.chat_template and "<|im_start|>" in processor.chat_template
    size = sum(f.stat().st_size for f in tiny_vlm_dir.iterdir())
    assert size < 10 * 1024 * 1024
    # deterministic for a seed, different for another seed
    again = build_tiny_vlm(tmp_path / "again", seed=0)
    other = build_tiny_vlm(tmp_path / "other", seed=1)
    files = sorted(f.name for f in tiny_vlm_dir.iterdir())
    assert files == sorted(f.name for f in again.iterdir())
    for name in files:
        assert (tiny_vlm_dir / name).read_bytes() == (again / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (
        tiny_vlm_dir / "model.safetensors"
    ).read_bytes()
    assert not list(tmp_path.glob(".*"))  # no temporary leftovers


# ---------------------------------------------------------------------- transformers backend
def test_transformers_json_schema_is_enforced(tiny_vlm, images):
    reqs = [
        VLMRequest(
            text="Describe.",
            image_path=str(p),
            system="Be brief.",
            json_schema=SMALL_SCHEMA,
            max_new_tokens=200,
        )
        for p in images
    ]
    answers = tiny_vlm.answer(reqs)
    assert len(answers) == len(images)
    for a in answers:
        jsonschema.validate(json.loads(a, strict=False), SMALL_SCHEMA)
    # batched (batch_size 2) and one-by-one give the same greedy answers
    assert [tiny_vlm.answer([r])[0] for r in reqs] == answers


def test_transformers_sampling_is_seeded_and_constrained(tiny_vlm, images):
    req = VLMRequest(
        text="Describe.",
        image_path=str(images[0]),
        json_schema=SMALL_SCHEMA,
        max_new_tokens=200,
        temperature=1.0,
        seed=7,
    )
    first, second = tiny_vlm.answer([req, req])
    assert first == second
    jsonschema.validate(json.loads(first, strict=False), SMALL_SCHEMA)


def test_transformers_choices_are_enforced(tiny_vlm, images):
    choices = ("yes", "no", 'it "depends"', "peut-être")
    reqs = [
        VLMRequest(
            text="Is there a person?",
            image_path=str(p),
            choices=choices,
            max_new_tokens=20,
            temperature=t,
            seed=s,
        )
        for p in images
        for t, s in ((0.0, 0), (1.5, 1), (1.5, 2))
    ]
    answers = tiny_vlm.answer(reqs)
    assert all(a in choices for a in answers), answers


def test_transformers_free_text_and_bad_image(tiny_vlm, images, tmp_path, caplog):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image")
    reqs = [
        VLMRequest(text="Hello", max_new_tokens=5),  # text only, unconstrained
        VLMRequest(text="Describe.", image_path=str(bad), max_new_tokens=5),
        VLMRequest(text="Describe.", image_path=str(images[0]), choices=("a", "b")),
    ]
    with caplog.at_level(logging.ERROR):
        answers = tiny_vlm.answer(reqs)
    assert isinstance(answers[0], str)
    # the unreadable image costs only its own item: an ItemFailure naming the file
    from stereolens.models.ask import ItemFailure

    assert isinstance(answers[1], ItemFailure) and "broken.png" in answers[1].reason
    assert answers[2] in ("a", "b")
    assert "cannot be read" in caplog.text


def test_full_schema_extraction_with_tiny_vlm(tiny_vlm, tiny_vlm_dir, images, schema, prompt):
    spec = vlm_spec(tiny_vlm_dir)
    started = time.perf_counter()
    records = extract_images(tiny_vlm, items_for(images), schema, prompt, spec, log=lambda m: None)
    seconds = time.perf_counter() - started
    assert [r["status"] for r in records] == ["ok"] * len(images), [r["reason"] for r in records]
    for r in records:
        assert schema.validate(r["attributes"]) == []
        assert r["attempts"] == 1 and r["extractor"] == "tiny-vlm"
        assert r["extractor_model"] == str(tiny_vlm_dir)
    print(f"\nfull-schema constrained answers: {len(images)} images in {seconds:.1f} s")


def test_truncated_answer_is_retried_then_discarded(tiny_vlm, tiny_vlm_dir, images, schema, prompt):
    spec = vlm_spec(tiny_vlm_dir, max_new_tokens=40)
    records = extract_images(
        tiny_vlm, items_for(images[:1]), schema, prompt, spec, max_attempts=2, log=lambda m: None
    )
    (r,) = records
    assert r["status"] == "discarded" and r["attempts"] == 2 and r["attributes"] is None
    assert "truncated" in r["reason"]
    assert [e["attempt"] for e in r["attempt_log"]] == [1, 2]
    assert all("truncated" in e["error"] for e in r["attempt_log"])


# ---------------------------------------------------------------------- retry loop (fake VLM)
VALID = {
    "scene": {
        "mood": "calm",
        "color_temperature": "warm",
        "aesthetic_qualities": ["realistic"],
        "dominant_colors": ["white", "blue"],
        "weather": "unknown",
    },
    "camera": {"depth_of_field": "shallow", "framing": "medium", "perspective": "eye_level"},
    "objects": {"items": ["stethoscope", "clipboard"]},
    "people": [],
}


class ScriptedVLM:
    """Answers from a per-image script (by image file name), one entry per attempt."""

    def __init__(self, scripts: dict[str, list]):
        self.scripts = scripts
        self.calls: list[list[VLMRequest]] = []

    def answer(self, requests):
        self.calls.append(list(requests))
        out = []
        for r in requests:
            script = self.scripts[Path(r.image_path).name]
            step = script[min(r.attempt, len(script)) - 1]
            out.append(step if isinstance(step, str) else json.dumps(step))
        return out


def spec_for_fake(**settings) -> ModelSpec:
    return ModelSpec(
        name="fake",
        kind="vlm",
        backend="transformers",
        model="fake/model",
        revision="abc123",
        settings={"max_new_tokens": 512, "temperature": 0, "seed": 5, **settings},
    )


def test_retry_and_discard_logic(images, schema, prompt, tmp_path):
    missing = tmp_path / "missing.png"
    invalid = {**VALID, "camera": {**VALID["camera"], "framing": "sideways"}}
    vlm = ScriptedVLM(
        {
            "img0.png": [VALID],  # ok at once
            "img1.png": ["", "garbage {not json", "```json\n" + json.dumps(VALID) + "\n```"],
            "img2.png": [invalid, "", "[1, 2]"],  # never valid
        }
    )
    items = items_for(images) + [{"image_id": "gone", "image_path": str(missing), "role": "x"}]
    lines: list[str] = []
    records = extract_images(vlm, items, schema, prompt, spec_for_fake(), log=lines.append)

    assert [r["image_id"] for r in records] == ["id0", "id1", "id2", "gone"]  # none dropped
    assert [r["status"] for r in records] == ["ok", "ok", "discarded", "discarded"]
    assert [r["attempts"] for r in records] == [1, 3, 3, 0]
    # batched per round: all first attempts, then the failures' retries
    assert [[Path(r.image_path).name for r in call] for call in vlm.calls] == [
        ["img0.png", "img1.png", "img2.png"],
        ["img1.png", "img2.png"],
        ["img1.png", "img2.png"],
    ]
    assert [[r.attempt for r in call] for call in vlm.calls] == [[1, 1, 1], [2, 2], [3, 3]]
    # a seed per image and attempt: independent draws, reproducible on rerun
    assert [r.seed for r in vlm.calls[1]] == [
        request_seed(5, "id1", 2),
        request_seed(5, "id2", 2),
    ]
    assert len({r.seed for call in vlm.calls for r in call}) == 7
    assert request_seed(5, "id1", 2) == int(stable_id("vlm-seed", 5, "id1", 2), 16) % 2**31
    for call in vlm.calls:
        for r in call:  # a fresh single-turn request, blind to the generation metadata
            assert r.system == prompt.system and r.json_schema == schema.json_schema
            assert "SECRET-PROMPT" not in r.text and "nurse" not in r.text
            assert "mood: one of calm" in r.text and "{dimensions}" not in r.text

    ok0, ok1, bad, gone = records
    assert ok0["attributes"] == VALID and ok1["attributes"] == VALID
    assert ok0["reason"] is None and ok0["attempt_log"][0]["error"] is None
    assert [e["error"] for e in ok1["attempt_log"]][:2] == [
        "empty response",
        ok1["attempt_log"][1]["error"],
    ]
    assert "truncated or malformed" in ok1["attempt_log"][1]["error"]
    fenced = "```json\n" + json.dumps(VALID) + "\n```"
    assert ok1["response_sha256"] == sha256_bytes(fenced.encode())
    assert "3 attempt(s)" in bad["reason"] and "not an object" in bad["reason"]
    assert "schema: camera/framing" in bad["attempt_log"][0]["error"]
    assert bad["attributes"] is None and bad["response_sha256"] == sha256_bytes(b"[1, 2]")
    assert "image not readable" in gone["reason"] and gone["image_sha256"] is None
    # metadata carried through, provenance added
    assert ok0["role"] == "nurse" and ok0["seed"] == 100 and ok0["prompt_version"] == prompt.version
    assert ok0["schema_version"] == schema.version and ok0["extractor_revision"] == "abc123"
    assert ok0["image_sha256"] == sha256_file(images[0])
    assert ok0["extractor"] == "fake" and ok0["extractor_model"] == "fake/model"
    assert all(isinstance(r["seconds"], float) for r in records)
    assert any("attempt 2/3" in line for line in lines)
    json.dumps(records)  # records are plain JSON


def test_a_backend_that_raises_fails_the_job_instead_of_recording_data(images, schema, prompt):
    # an outage is not a result: an unexpected backend exception fails the job (nothing
    # is returned to be written), it is never stored as an "empty response" discard
    class Exploding:
        calls = 0

        def answer(self, requests):
            Exploding.calls += 1
            raise RuntimeError("GPU on fire")

    with pytest.raises(RuntimeError, match="GPU on fire"):
        extract_images(
            Exploding(), items_for(images[:2]), schema, prompt, spec_for_fake(), log=lambda m: None
        )
    assert Exploding.calls == 1


class Flaky(ScriptedVLM):
    """ScriptedVLM whose first ``fail`` calls give a backend failure for every request
    (ItemFailure for the images named in ``bad``)."""

    def __init__(self, scripts, fail=0, bad=(), retry_in_job=True):
        super().__init__(scripts)
        self.fail, self.bad, self.retry_in_job, self.n = fail, set(bad), retry_in_job, 0

    def answer(self, requests):
        from stereolens.models.ask import BackendFailure, ItemFailure

        self.n += 1
        if self.n <= self.fail:
            self.calls.append(list(requests))
            return [
                BackendFailure("HTTP 503 Service Unavailable", retry_in_job=self.retry_in_job)
            ] * len(requests)
        out = super().answer([r for r in requests if Path(r.image_path).name not in self.bad])
        it = iter(out)
        return [
            ItemFailure("image not readable: cannot identify image file")
            if Path(r.image_path).name in self.bad
            else next(it)
            for r in requests
        ]


def test_transport_failures_are_retried_in_the_job_then_fail_it(images, schema, prompt, tmp_path):
    from stereolens.models.ask import TransportError

    scripts = {"img0.png": [VALID], "img1.png": [VALID]}
    fast = {"transport_retries": 2, "transport_backoff_s": 0.0}
    # two failed rounds, then the backend is back: the records equal an undisturbed run
    flaky = Flaky(scripts, fail=2)
    records = extract_images(
        flaky, items_for(images[:2]), schema, prompt, spec_for_fake(**fast), log=lambda m: None
    )
    clean = extract_images(
        ScriptedVLM(scripts),
        items_for(images[:2]),
        schema,
        prompt,
        spec_for_fake(**fast),
        log=lambda m: None,
    )
    drop = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in records] == [
        {k: v for k, v in r.items() if k not in drop} for r in clean
    ]
    assert [r["status"] for r in records] == ["ok", "ok"] and flaky.n == 3
    # the failures persist: the job fails with a message saying what to do, and nothing
    # that failed is in the response cache
    cache = ResponseCache(tmp_path / "cache")
    down = Flaky(scripts, fail=10)
    with pytest.raises(TransportError, match="failed in the backend after 2 retries"):
        extract_images(
            down,
            items_for(images[:2]),
            schema,
            prompt,
            spec_for_fake(**fast),
            cache=cache,
            log=lambda m: None,
        )
    assert down.n == 3 and not list((tmp_path / "cache").rglob("*.json"))
    # a failure that is not worth retrying in the job (out of memory, bad credentials)
    # fails it at once
    from stereolens.models.ask import BackendFailure

    once = Flaky(scripts, fail=10, retry_in_job=False)
    with pytest.raises(BackendFailure):
        extract_images(
            once, items_for(images[:2]), schema, prompt, spec_for_fake(**fast), log=lambda m: None
        )
    assert once.n == 1


def test_an_item_failure_loses_only_its_item(images, schema, prompt):
    vlm = Flaky({"img0.png": [VALID], "img1.png": [VALID]}, bad={"img1.png"})
    records = extract_images(vlm, items_for(images[:2]), schema, prompt, spec_for_fake())
    assert [r["status"] for r in records] == ["ok", "discarded"]
    assert records[1]["reason"].startswith("image not readable")
    assert records[1]["attempts"] == 1  # not asked again


def test_cache_makes_a_rerun_free(images, schema, prompt, tmp_path):
    scripts = {"img0.png": ["oops", VALID], "img1.png": [VALID], "img2.png": [""]}
    cache = ResponseCache(tmp_path / "cache")
    first_vlm = ScriptedVLM(scripts)
    first = extract_images(
        first_vlm,
        items_for(images[:2]),
        schema,
        prompt,
        spec_for_fake(),
        cache=cache,
        log=lambda m: None,
    )
    assert len(first_vlm.calls) == 2
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 3  # 2 first attempts + 1 retry

    again_vlm = ScriptedVLM(scripts)
    again = extract_images(
        again_vlm,
        items_for(images[:2]),
        schema,
        prompt,
        spec_for_fake(),
        cache=cache,
        log=lambda m: None,
    )
    assert again_vlm.calls == []
    strip = [{k: v for k, v in r.items() if k not in ("seconds", "attempt_log")} for r in first]
    assert strip == [
        {k: v for k, v in r.items() if k not in ("seconds", "attempt_log")} for r in again
    ]
    assert all(e["cached"] for r in again for e in r["attempt_log"])

    # a changed model setting is a different key; empty answers are never cached
    other_vlm = ScriptedVLM(scripts)
    extract_images(
        other_vlm,
        items_for(images[2:]),
        schema,
        prompt,
        spec_for_fake(max_new_tokens=100),
        cache=cache,
        max_attempts=1,
        log=lambda m: None,
    )
    assert len(other_vlm.calls) == 1
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 3
    # no cache when sampling
    sampled_vlm = ScriptedVLM(scripts)
    extract_images(
        sampled_vlm,
        items_for(images[:2]),
        schema,
        prompt,
        spec_for_fake(temperature=0.7),
        cache=cache,
        log=lambda m: None,
    )
    assert len(sampled_vlm.calls) == 2
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_parse_json_object():
    obj = {"a": [1, {"b": "c"}]}
    text = json.dumps(obj)
    assert parse_json_object(text) == obj
    assert parse_json_object(f"```json\n{text}\n```") == obj
    assert parse_json_object(f"Here you go:\n```\n{text}\n```\nDone.") == obj
    assert parse_json_object(f"Sure! {text} Hope that helps.") == obj
    assert parse_json_object('{"a": "tab\there"}') == {"a": "tab\there"}
    for bad, msg in [
        ("", "empty"),
        ("   ", "empty"),
        ("no json here", "no JSON object"),
        ("[1, 2]", "not an object"),
        ('{"a": [1, 2', "truncated"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_json_object(bad)


def test_check_answer_and_prompt(schema, prompt):
    assert check_answer(json.dumps(VALID), schema) == (VALID, None)
    answer, error = check_answer(json.dumps({**VALID, "extra": 1}), schema)
    assert answer is None and error.startswith("schema: ")
    assert prompt.version == "contextbias-extraction/1"
    text = prompt.user_text(schema)
    for d in schema.dimensions:
        assert f"- {d.name}:" in text
    assert "p1" in text and "unknown" in text and "[]" in text


def test_extraction_prompt_load_errors(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("version: x\nsystem: s\n")
    with pytest.raises(ValueError, match="user"):
        ExtractionPrompt.load(bad)
    good = tmp_path / "q.yaml"
    good.write_text("version: v9\nsystem: s\nuser: u {dimensions}\n")
    assert ExtractionPrompt.load(good).version == "v9"


# ---------------------------------------------------------------------- vLLM request builders
def test_vllm_messages_and_sampling_kwargs(images, tmp_path):
    req = VLMRequest(
        text="Audit.",
        image_path=str(images[1]),
        system="Sys.",
        json_schema=SMALL_SCHEMA,
        max_new_tokens=77,
        temperature=0.0,
        seed=3,
        attempt=2,
    )
    messages = build_vllm_messages(req)
    assert messages[0] == {"role": "system", "content": "Sys."}
    user = messages[1]
    assert user["role"] == "user"
    image_part, text_part = user["content"]
    assert text_part == {"type": "text", "text": "Audit."}
    url = image_part["image_url"]["url"]
    assert image_part["type"] == "image_url" and url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == images[1].read_bytes()  # sent as generated
    kwargs = build_sampling_kwargs(req)
    assert kwargs == {
        "temperature": 0.0,
        "seed": 3,
        "max_tokens": 77,
        "structured_outputs": {"json": SMALL_SCHEMA},
    }
    choice = VLMRequest(text="Q", choices=("a", "b"))
    assert build_sampling_kwargs(choice)["structured_outputs"] == {"choice": ["a", "b"]}
    assert build_vllm_messages(choice) == [
        {"role": "user", "content": [{"type": "text", "text": "Q"}]}
    ]
    assert build_sampling_kwargs(VLMRequest(text="Q"))["structured_outputs"] is None

    # downscaled (and a JPEG re-encoded) to PNG with the longer side bounded
    from PIL import Image

    jpg = tmp_path / "big.jpg"
    Image.new("RGB", (200, 100), (1, 2, 3)).save(jpg)
    assert image_data_url(jpg).startswith("data:image/jpeg;base64,")
    small = image_data_url(jpg, max_side=50)
    assert small.startswith("data:image/png;base64,")
    from io import BytesIO

    with Image.open(BytesIO(base64.b64decode(small.split(",", 1)[1]))) as im:
        assert im.size == (50, 25)


def fake_vllm(monkeypatch, new_api: bool):
    """Install a stand-in ``vllm`` package that records what it is given."""
    record: dict = {"chat": []}

    class Params:
        def __init__(self, **kw):
            self.kw = kw

    class SamplingParams(Params):
        pass

    sp = types.ModuleType("vllm.sampling_params")
    sp.SamplingParams = SamplingParams
    if new_api:

        class StructuredOutputsParams(Params):
            def __init__(self, json=None, choice=None, disable_any_whitespace=False):
                super().__init__(json=json, choice=choice)
                if disable_any_whitespace:
                    self.kw["disable_any_whitespace"] = True

        sp.StructuredOutputsParams = StructuredOutputsParams
    else:
        sp.GuidedDecodingParams = type("GuidedDecodingParams", (Params,), {})

    class LLM:
        def __init__(self, **kw):
            record["init"] = kw

        def chat(self, conversations, sampling_params=None, use_tqdm=True):
            record["chat"].append((conversations, sampling_params))
            if any("boom" in str(c) for c in conversations) and len(conversations) > 1:
                raise RuntimeError("batch failed")
            outs = []
            for c in conversations:
                text = "" if "boom" in str(c) else '{"color": "red"}'
                outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(text=text)]))
            return outs

    vllm = types.ModuleType("vllm")
    vllm.LLM = LLM
    vllm.SamplingParams = SamplingParams
    vllm.sampling_params = sp
    platforms = types.ModuleType("vllm.platforms")  # a GPU engine
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: False)
    arg_utils = types.ModuleType("vllm.engine.arg_utils")
    fields = {"model": str} | ({"structured_outputs_config": dict} if new_api else {})
    arg_utils.EngineArgs = dataclasses.make_dataclass("EngineArgs", list(fields.items()))
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setitem(sys.modules, "vllm.engine", types.ModuleType("vllm.engine"))
    monkeypatch.setitem(sys.modules, "vllm.engine.arg_utils", arg_utils)
    return record


@pytest.mark.parametrize("new_api", [True, False])
def test_vllm_backend_with_fake_engine(monkeypatch, images, new_api):
    from stereolens.models.backends.vllm_backend import VLLMVLM

    record = fake_vllm(monkeypatch, new_api)
    params = to_sampling_params(build_sampling_kwargs(VLMRequest(text="q", choices=("x", "y"))))
    key = "structured_outputs" if new_api else "guided_decoding"
    assert set(params.kw) == {"temperature", "seed", "max_tokens", key}
    assert {k: v for k, v in params.kw[key].kw.items() if v is not None} == {"choice": ["x", "y"]}
    assert (
        "structured_outputs"
        not in to_sampling_params(build_sampling_kwargs(VLMRequest(text="q"))).kw
    )

    spec = ModelSpec(
        name="v",
        kind="vlm",
        backend="vllm",
        model="org/vlm",
        revision="r1",
        settings={
            "dtype": "bfloat16",
            "max_model_len": 8192,
            "seed": 0,
            "tensor_parallel_size": 2,
            "gpu_memory_utilization": 0.8,
        },
    )
    vlm = VLLMVLM(spec)
    assert record["init"] == {
        "model": "org/vlm",
        "revision": "r1",
        "dtype": "bfloat16",
        "trust_remote_code": False,
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.8,
        "limit_mm_per_prompt": {"image": 1},
        "max_model_len": 8192,
        "seed": 0,
        # compact JSON engine-wide where the engine takes it (vLLM >= 0.11)
        **(
            {"structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}}
            if new_api
            else {}
        ),
    }
    reqs = [
        VLMRequest(text="a", image_path=str(images[0]), json_schema=SMALL_SCHEMA),
        VLMRequest(text="boom", image_path=str(images[1]), json_schema=SMALL_SCHEMA),
        VLMRequest(text="c", image_path="/nonexistent.png"),
    ]
    from stereolens.models.ask import ItemFailure

    got = vlm.answer(reqs)
    assert got[:2] == ['{"color": "red"}', ""]  # "boom": the engine's (empty) answer
    assert isinstance(got[2], ItemFailure) and "/nonexistent.png" in got[2].reason
    conversations, sampling = record["chat"][0]
    assert len(conversations) == 2 and len(sampling) == 2  # the unreadable image never got in
    constraint = {k: v for k, v in sampling[0].kw[key].kw.items() if v is not None}
    # compact JSON where vLLM takes the flag (as the transformers backend)
    assert constraint == {
        "json": SMALL_SCHEMA,
        **({"disable_any_whitespace": True} if new_api else {}),
    }
    assert len(record["chat"]) == 3  # the failed batch, then one at a time


# ---------------------------------------------------------------------- OpenAI backend
API_KEY = "sk-test-0123456789abcdefSECRET"


class FakeOpenAI:
    """A local OpenAI-compatible chat-completions endpoint."""

    def __init__(self):
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.fail_first: dict[str, int] = {}  # user text -> failures left (HTTP 500)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10

            def log_message(self, *args):  # keep the test output quiet
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                with fake.lock:
                    fake.in_flight += 1
                    fake.peak = max(fake.peak, fake.in_flight)
                    fake.requests.append(
                        {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                    )
                try:
                    time.sleep(0.05)
                    status, payload = fake.respond(self.path, self.headers, body)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status >= 429:
                    self.send_header("retry-after-ms", "20")
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def respond(self, path, headers, body):
        if path != "/v1/chat/completions":
            return 404, {"error": {"message": "no such route"}}
        if headers.get("Authorization") != f"Bearer {API_KEY}":
            got = headers.get("Authorization", "")
            return 401, {"error": {"message": f"Incorrect API key provided: {got}"}}
        text = body["messages"][-1]["content"][-1]["text"]
        with self.lock:
            left = self.fail_first.get(text, 0)
            if left:
                self.fail_first[text] = left - 1
        if left or text == "always-500":
            return 500, {"error": {"message": "server exploded"}}
        if text == "echo-key":  # an error message that quotes the key
            return 400, {"error": {"message": f"bad request for key {API_KEY}"}}
        fmt = body.get("response_format", {})
        content = json.dumps({"color": "red", "count": 1, "tags": []})
        if fmt.get("json_schema", {}).get("name") == "choice":
            content = json.dumps(
                {"answer": fmt["json_schema"]["schema"]["properties"]["answer"]["enum"][-1]}
            )
        return 200, {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": content},
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def fake_openai(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = FakeOpenAI()
    yield server
    server.close()


def openai_spec(base_url: str, **settings) -> ModelSpec:
    base = {
        "base_url": base_url,
        "api_key_env": "STEREOLENS_TEST_KEY",
        "max_concurrency": 3,
        "timeout_s": 10,
        "max_retries": 2,
        "seed": 0,
    }
    return ModelSpec(
        name="api-vlm",
        kind="vlm",
        backend="openai",
        model="gpt-test",
        settings={**base, **settings},
    )


def test_openai_backend_against_local_server(
    fake_openai, monkeypatch, images, schema, prompt, caplog, capsys
):
    from stereolens.models.backends.openai_backend import OpenAIVLM

    caplog.set_level(logging.DEBUG)  # the key must not show up even in debug logs
    monkeypatch.setenv("STEREOLENS_TEST_KEY", API_KEY)
    vlm = OpenAIVLM(openai_spec(fake_openai.base_url))
    assert API_KEY not in repr(vlm)
    fake_openai.fail_first["retry-me"] = 1
    reqs = [
        VLMRequest(
            text=f"q{k}",
            image_path=str(images[k % 3]),
            system="Sys",
            json_schema=SMALL_SCHEMA,
            max_new_tokens=50,
            seed=4,
        )
        for k in range(5)
    ] + [
        VLMRequest(text="pick", image_path=str(images[0]), choices=("yes", "no")),
        VLMRequest(text="retry-me", json_schema=SMALL_SCHEMA),
        VLMRequest(text="always-500", json_schema=SMALL_SCHEMA),
        VLMRequest(text="echo-key", json_schema=SMALL_SCHEMA),
    ]
    answers = vlm.answer(reqs)
    assert [json.loads(a)["color"] for a in answers[:5]] == ["red"] * 5
    assert answers[5] == "no"  # unwrapped from {"answer": ...}
    assert json.loads(answers[6])["color"] == "red"  # succeeded on the client's retry
    # failures are not answers: a persistent HTTP 500 is a retryable BackendFailure (the
    # job retries it, then fails), a rejected input (HTTP 400) its item's own failure
    from stereolens.models.ask import BackendFailure, ItemFailure

    assert isinstance(answers[7], BackendFailure) and answers[7].retry_in_job
    assert "HTTP 500" in str(answers[7])
    assert isinstance(answers[8], ItemFailure) and "HTTP 400" in answers[8].reason
    assert API_KEY not in answers[8].reason and "***" in answers[8].reason
    assert 1 < fake_openai.peak <= 3  # max_concurrency requests in flight

    by_text = {r["body"]["messages"][-1]["content"][-1]["text"]: r for r in fake_openai.requests}
    first = by_text["q0"]
    assert first["path"] == "/v1/chat/completions"
    assert first["auth"] == f"Bearer {API_KEY}"
    body = first["body"]
    assert body["model"] == "gpt-test" and body["temperature"] == 0.0 and body["seed"] == 4
    assert body["max_completion_tokens"] == 50
    assert body["messages"][0] == {"role": "system", "content": "Sys"}
    image_part = body["messages"][1]["content"][0]
    assert image_part["type"] == "image_url"
    assert image_part["image_url"]["url"].startswith("data:image/png;base64,")
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["name"] == "Small"
    sent = fmt["json_schema"]["schema"]
    assert sent["additionalProperties"] is False and sent["required"] == ["color", "count", "tags"]
    assert "maxLength" not in json.dumps(sent) and sent["properties"]["tags"]["maxItems"] == 2
    choice_fmt = by_text["pick"]["body"]["response_format"]["json_schema"]
    assert choice_fmt["schema"]["properties"]["answer"]["enum"] == ["yes", "no"]
    assert (
        sum(
            r["body"]["messages"][-1]["content"][-1]["text"] == "always-500"
            for r in fake_openai.requests
        )
        == 3
    )  # 1 + max_retries

    # the full extraction path on top: the answer does not fit the attribute schema
    records = extract_images(
        vlm,
        items_for(images[:1]),
        schema,
        prompt,
        openai_spec(fake_openai.base_url),
        max_attempts=1,
        log=print,
    )
    assert records[0]["status"] == "discarded" and "schema" in records[0]["reason"]
    assert "***" in caplog.text  # the echoed key was masked
    for text in (caplog.text, json.dumps(records), *capsys.readouterr()):
        assert API_KEY not in text


def test_openai_missing_key_is_a_clear_error(monkeypatch):
    from stereolens.models.backends.openai_backend import OpenAIVLM

    monkeypatch.delenv("STEREOLENS_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="STEREOLENS_TEST_KEY"):
        OpenAIVLM(openai_spec("http://127.0.0.1:9/v1"))
    with pytest.raises(ConfigError, match="api_key_env"):
        OpenAIVLM(openai_spec(None, api_key_env=None))


def test_strict_schema_for_the_attribute_schema(schema):
    from stereolens.models.backends.openai_backend import strict_json_schema

    strict = strict_json_schema(schema.json_schema)
    assert "minLength" not in json.dumps(strict) and "maxLength" not in json.dumps(strict)

    def objects(node):
        if isinstance(node, dict):
            if node.get("type") == "object":
                yield node
            for v in node.values():
                yield from objects(v)
        elif isinstance(node, list):
            for v in node:
                yield from objects(v)

    found = list(objects(strict))
    assert len(found) == 5  # root, scene, camera, objects, person
    for obj in found:
        assert obj["additionalProperties"] is False
        assert obj["required"] == list(obj["properties"])
    assert schema.json_schema["properties"]["objects"]["properties"]["items"]["items"][
        "maxLength"
    ]  # the original is untouched
    # anything valid under the original is valid under the strict copy
    jsonschema.validate(VALID, strict)


def test_rate_limiter_spaces_request_starts():
    from stereolens.models.backends.openai_backend import RateLimiter

    now = [100.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    limiter = RateLimiter(120, clock=lambda: now[0], sleep=sleep)  # one start per 0.5 s
    for _ in range(4):
        limiter.wait()
    assert slept == pytest.approx([0.5, 0.5, 0.5])
    free = RateLimiter(None, clock=lambda: now[0], sleep=sleep)
    free.wait()
    assert len(slept) == 3
