"""Generation: the tiny Stable Diffusion pipeline, the diffusers backend, the shard runner.

Everything runs on the CPU against a random-weight pipeline built in code; nothing
is downloaded.
"""
# ruff: noqa: E402  (HF_HUB_OFFLINE must be set before huggingface_hub is imported)

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
import signal
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

import torch
from diffusers import AutoPipelineForText2Image, StableDiffusionPipeline
from PIL import Image

from stereolens.generate.base import GenerationItem
from stereolens.generate.diffusers_backend import DiffusersGenerator, ModelLoadError
from stereolens.generate.run import generate_shard, partial_dir
from stereolens.ids import sha256_file
from stereolens.registry import ModelSpec
from stereolens.tiny.diffusion import build_tiny_diffusion
from stereolens.validation import ConfigError

RES = 32
STEPS = 2
PROMPTS = ["a photo of a doctor", "a nurse at work", "the engineer"]
SEEDS = [11, 12, 13]


@pytest.fixture(scope="session")
def tiny_sd(tmp_path_factory) -> Path:
    return build_tiny_diffusion(tmp_path_factory.mktemp("models") / "tiny-sd", seed=0)


def make_spec(path: Path, **settings) -> ModelSpec:
    base = {"resolution": RES, "steps": STEPS, "guidance": 5.0, "device": "cpu", "dtype": "float32"}
    return ModelSpec(
        name="tiny-sd",
        kind="generator",
        backend="diffusers",
        model=str(path),
        settings={**base, **settings},
    )


def pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


@contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging) if the block takes longer than ``seconds``."""

    def _expired(signum, frame):
        raise TimeoutError(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# -- the tiny checkpoint ------------------------------------------------------


def test_tiny_build_is_deterministic_and_small(tiny_sd, tmp_path):
    again = build_tiny_diffusion(tmp_path / "again", seed=0)
    other = build_tiny_diffusion(tmp_path / "other", seed=1)
    files = sorted(p.relative_to(tiny_sd) for p in tiny_sd.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    weights = [f for f in files if f.suffix == ".safetensors"]
    assert len(weights) == 3  # unet, vae, text encoder
    for f in files:
        assert (tiny_sd / f).read_bytes() == (again / f).read_bytes(), f
    assert any((tiny_sd / f).read_bytes() != (other / f).read_bytes() for f in weights)
    assert sum((tiny_sd / f).stat().st_size for f in files) < 5 * 2**20
    # built beside the target and moved into place: no temporary folder is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "other"]


def test_tiny_build_replaces_existing_folder(tmp_path):
    target = tmp_path / "sd"
    target.mkdir()
    (target / "stale.txt").write_text("old")
    build_tiny_diffusion(target)
    assert not (target / "stale.txt").exists()
    assert (target / "model_index.json").is_file()


def test_tiny_loads_through_auto_pipeline(tiny_sd):
    pipe = AutoPipelineForText2Image.from_pretrained(str(tiny_sd))
    assert isinstance(pipe, StableDiffusionPipeline)
    assert pipe.safety_checker is None
    ids = pipe.tokenizer("the person").input_ids
    tokens = pipe.tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0] == "<|startoftext|>" and tokens[-1] == "<|endoftext|>"
    assert "the</w>" in tokens  # a merge applied: real BPE, not only single bytes
    assert max(ids) < pipe.text_encoder.config.vocab_size


# -- the diffusers backend ----------------------------------------------------


def test_images_do_not_depend_on_batch_size(tiny_sd):
    one = DiffusersGenerator(make_spec(tiny_sd, batch_size=1))
    three = DiffusersGenerator(make_spec(tiny_sd, batch_size=3))
    a = [pixels(im) for im in one.generate(PROMPTS, SEEDS)]
    b = [pixels(im) for im in three.generate(PROMPTS, SEEDS)]
    assert all(x.shape == (RES, RES, 3) for x in a + b)
    for x, y in zip(a, b, strict=True):
        # Same starting noise (one torch.Generator per image). The arithmetic itself is
        # not batch-invariant on CPU (oneDNN/MKL pick other kernels for other batch
        # shapes; float differences ~1e-6), which can flip a rare value by one level.
        diff = np.abs(x - y)
        assert diff.max() <= 1
        assert (diff > 0).mean() < 0.01  # measured: at most 2 of 3072 values
    # the same (prompt, seed) in the same batch layout is reproduced exactly
    assert all(
        np.array_equal(x, pixels(im))
        for x, im in zip(b, three.generate(PROMPTS, SEEDS), strict=True)
    )
    # another seed gives another image
    c = pixels(one.generate([PROMPTS[0]], [SEEDS[0] + 100])[0])
    assert np.abs(c - a[0]).mean() > 5


def test_shared_generator_would_break_batch_invariance(tiny_sd):
    """Control for the test above: without one generator per image it fails clearly."""
    gen = DiffusersGenerator(make_spec(tiny_sd))
    alone = pixels(gen.generate([PROMPTS[1]], [SEEDS[1]])[0])
    out = gen.pipe(
        prompt=PROMPTS[:2],
        height=RES,
        width=RES,
        num_inference_steps=STEPS,
        guidance_scale=5.0,
        generator=torch.Generator("cpu").manual_seed(SEEDS[1]),
    )
    assert np.abs(pixels(out.images[1]) - alone).mean() > 5


def test_call_arguments_and_settings(tiny_sd):
    gen = DiffusersGenerator(
        make_spec(
            tiny_sd,
            style_prefix="realistic photo",
            negative_prompt="no text",
            scheduler="EulerDiscreteScheduler",
            pipeline_kwargs={"guidance_rescale": 0.0},
            batch_size=2,
        )
    )
    calls = []
    real = gen.pipe

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, **kwargs):
            calls.append(kwargs)
            return real(**kwargs)

    gen.pipe = Spy()
    images = gen.generate(PROMPTS, SEEDS)
    gen.pipe = real
    assert len(images) == 3 and all(isinstance(im, Image.Image) for im in images)
    assert [len(c["prompt"]) for c in calls] == [2, 1]
    first = calls[0]
    assert first["prompt"] == [
        "realistic photo, a photo of a doctor",
        "realistic photo, a nurse at work",
    ]
    assert first["negative_prompt"] == ["no text", "no text"]
    assert isinstance(first["generator"], list) and len(first["generator"]) == 2
    assert first["height"] == first["width"] == RES
    assert first["num_inference_steps"] == STEPS
    assert first["guidance_scale"] == 5.0 and "true_cfg_scale" not in first
    assert first["guidance_rescale"] == 0.0

    assert gen.load_seconds > 0
    s = gen.settings()
    json.dumps(s)
    assert s["scheduler"] == "EulerDiscreteScheduler"
    assert s["pipeline_class"] == "StableDiffusionPipeline"
    assert s["dtype"] == "float32" and s["resolution"] == RES and s["steps"] == STEPS
    assert s["guidance"] == 5.0 and s["guidance_argument"] == "guidance_scale"
    assert s["style_prefix"] == "realistic photo" and s["negative_prompt"] == "no text"
    assert s["pipeline_kwargs"] == {"guidance_rescale": 0.0}
    assert s["diffusers_version"] and s["model"] == str(tiny_sd)
    assert "batch_size" not in s


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"pipeline_kwargs": {"true_cfg_scale": 4.0}}, "pipeline_kwargs.true_cfg_scale"),
        ({"pipeline_kwargs": {"no_such_argument": 1}}, "pipeline_kwargs.no_such_argument"),
        ({"pipeline_kwargs": {"height": 64}}, "pipeline_kwargs.height"),
        ({"scheduler": "NoSuchScheduler"}, "scheduler"),
        ({"pipeline_class": "NoSuchPipeline"}, "pipeline_class"),
        ({"dtype": "float8"}, "dtype"),
        ({"stepz": 3}, "stepz"),
    ],
)
def test_unaccepted_setting_is_a_clear_error(tiny_sd, settings, message):
    with pytest.raises(ConfigError, match=message):
        DiffusersGenerator(make_spec(tiny_sd, **settings))


def test_missing_hub_model_fails_offline(monkeypatch):
    import huggingface_hub.constants

    assert huggingface_hub.constants.HF_HUB_OFFLINE, "tests must run with HF_HUB_OFFLINE=1"
    spec = ModelSpec(
        name="missing",
        kind="generator",
        backend="diffusers",
        model="stereolens-tests/no-such-model",
        settings={"device": "cpu"},
    )
    with deadline(60), pytest.raises(ModelLoadError, match="no-such-model"):
        DiffusersGenerator(spec)


# -- the shard runner ---------------------------------------------------------


def make_items(n: int) -> list[GenerationItem]:
    return [
        GenerationItem(
            image_id=f"img{k:02d}",
            prompt_id=f"p{k % 2}",
            text=PROMPTS[k % len(PROMPTS)],
            seed=100 + k,
            extra={"role": "doctor", "condition": f"c{k % 2}"},
        )
        for k in range(n)
    ]


class Counting:
    """Wraps a generator; counts images made; optionally crashes after ``fail_after``."""

    def __init__(self, inner, fail_after: int | None = None):
        self.inner = inner
        self.fail_after = fail_after
        self.made: list[int] = []

    def settings(self):
        return self.inner.settings()

    def generate(self, prompts, seeds):
        if self.fail_after is not None and len(self.made) + len(seeds) > self.fail_after:
            raise RuntimeError("simulated crash")
        self.made.extend(seeds)
        return self.inner.generate(prompts, seeds)


@pytest.fixture(scope="module")
def tiny_gen(tiny_sd):
    return DiffusersGenerator(make_spec(tiny_sd))


def read_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]


def test_generate_shard_writes_images_and_metadata(tiny_gen, tmp_path):
    items = make_items(3)
    out = tmp_path / "shard"
    logged = []
    rows = generate_shard(
        tiny_gen,
        items,
        out,
        model_name="tiny-sd",
        batch_size=2,
        log=logged.append,
        load_seconds=1.5,
    )
    assert not partial_dir(out).exists()
    assert sorted(p.name for p in out.iterdir()) == [
        "img00.png",
        "img01.png",
        "img02.png",
        "metadata.jsonl",
        "timing.json",
    ]
    assert read_rows(out) == rows
    settings = json.loads(json.dumps(tiny_gen.settings()))
    for item, row in zip(items, rows, strict=True):
        assert row["image_id"] == item.image_id and row["prompt_id"] == item.prompt_id
        assert row["seed"] == item.seed and row["prompt"] == item.text
        assert row["model"] == "tiny-sd" and row["revision"] is None
        assert row["settings"] == settings
        assert row["image_file"] == f"{item.image_id}.png"
        assert row["image_sha256"] == sha256_file(out / row["image_file"])
        assert (row["width"], row["height"]) == (RES, RES)
        assert row["seconds"] > 0
        assert row["role"] == "doctor" and row["condition"] == item.extra["condition"]
        with Image.open(out / row["image_file"]) as im:
            assert im.size == (RES, RES)
    timing = json.loads((out / "timing.json").read_text())
    assert timing["load_seconds"] == 1.5 and timing["images"] == 3
    assert set(timing["seconds_per_image"]) == {it.image_id for it in items}
    assert timing["total_seconds_this_run"] >= timing["generation_seconds_this_run"] > 0
    assert any("wrote 3 images" in m for m in logged)

    # a second run replaces the finished folder wholesale
    rows2 = generate_shard(tiny_gen, items[:2], out, model_name="tiny-sd", log=logged.append)
    assert sorted(p.name for p in out.glob("*.png")) == ["img00.png", "img01.png"]
    assert [r["image_sha256"] for r in rows2] == [r["image_sha256"] for r in rows[:2]]


def test_generate_shard_resumes_after_a_crash(tiny_gen, tmp_path):
    items = make_items(5)
    out = tmp_path / "shard"
    partial = partial_dir(out)

    crashing = Counting(tiny_gen, fail_after=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        generate_shard(crashing, items, out, model_name="tiny-sd", batch_size=1, log=lambda m: None)
    assert not out.exists()
    assert sorted(p.name for p in partial.glob("*.png")) == ["img00.png", "img01.png", "img02.png"]
    assert sorted(p.name for p in partial.glob("*.json")) == [
        "img00.json",
        "img01.json",
        "img02.json",
    ]
    finished = {p.stem: sha256_file(p) for p in partial.glob("*.png")}

    # a damaged image is noticed (sha256 differs from its sidecar) and made again
    (partial / "img01.png").write_bytes(b"not a png")

    again = Counting(tiny_gen)
    logged = []
    rows = generate_shard(again, items, out, model_name="tiny-sd", batch_size=2, log=logged.append)
    assert sorted(again.made) == [101, 103, 104]  # img01 (damaged), img03, img04
    assert not partial.exists()
    assert [r["image_id"] for r in read_rows(out)] == [it.image_id for it in items]
    for row in rows:
        assert row["image_sha256"] == sha256_file(out / row["image_file"])
    assert rows[0]["image_sha256"] == finished["img00"]
    assert rows[2]["image_sha256"] == finished["img02"]
    assert [p.name for p in out.glob("*.json")] == ["timing.json"]  # sidecars are gone
    assert any("2 of 5 images already finished" in m for m in logged)
    timing = json.loads((out / "timing.json").read_text())
    assert timing["generated_this_run"] == 3 and timing["reused_from_partial"] == 2


def test_partial_images_from_other_settings_are_redone(tiny_gen, tmp_path):
    items = make_items(2)
    out = tmp_path / "shard"
    crashing = Counting(tiny_gen, fail_after=1)
    with pytest.raises(RuntimeError):
        generate_shard(crashing, items, out, model_name="tiny-sd", batch_size=1, log=lambda m: None)
    again = Counting(tiny_gen)
    generate_shard(again, items, out, model_name="other-name", batch_size=1, log=lambda m: None)
    assert sorted(again.made) == [100, 101]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([], "no items"),
        (make_items(2) + make_items(1), "duplicate image_id"),
        ([GenerationItem("a/b", "p", "t", 1)], "cannot be a file name"),
        ([GenerationItem("a", "p", "t", 1, extra={"seed": 2})], "clash"),
    ],
)
def test_generate_shard_rejects_bad_items(items, message, tmp_path):
    class Never:
        def settings(self):
            return {}

        def generate(self, prompts, seeds):
            raise AssertionError("must not be called")

    with pytest.raises(ValueError, match=message):
        generate_shard(Never(), items, tmp_path / "out", model_name="m")
    assert not (tmp_path / "out").exists() and not partial_dir(tmp_path / "out").exists()
