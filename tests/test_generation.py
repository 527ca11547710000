"""Generation: the tiny Stable Diffusion pipeline, the diffusers backend, the shard runner.

Everything runs on the CPU against a random-weight pipeline built in code; nothing
is downloaded.
"""
# ruff: noqa: E402  (HF_HUB_OFFLINE must be set before huggingface_hub is imported)

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
import logging
import signal
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import polars as pl
import pytest

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

import torch
from diffusers import AutoPipelineForText2Image, StableDiffusionPipeline
from PIL import Image

from stereolens.generate.run import generate_shard, partial_dir
from stereolens.ids import sha256_file
from stereolens.models.backends.diffusers_backend import DiffusersGenerator, ModelLoadError
from stereolens.models.registry import ModelSpec
from stereolens.models.requests import GenerationItem
from stereolens.models.tiny.diffusion import build_tiny_diffusion
from stereolens.thumbnails import make_thumbnail, shard_thumbnail
from stereolens.validation import ConfigError

RES = 32
STEPS = 2
PROMPTS = ["a photo of a doctor", "a nurse at work", "the engineer"]
SEEDS = [11, 12, 13]


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
        "thumbs",
        "timing.json",
    ]
    assert sorted(p.name for p in (out / "thumbs").iterdir()) == [
        "img00.jpg",
        "img01.jpg",
        "img02.jpg",
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


def test_a_prompt_the_text_encoder_cuts_is_recorded_and_counted(tiny_gen, tmp_path):
    """CLIP keeps 77 tokens: a longer prompt is recorded in its image's metadata (tokens,
    kept, dropped; quirks) and timing.json, and the report counts such images."""
    tokenizer = tiny_gen.pipe.tokenizer
    assert type(tokenizer).__name__.startswith("CLIPTokenizer") and tokenizer.model_max_length == 77
    long = "a photo of a nurse who " + " ".join(["stands"] * 30)
    n_tokens = len(tokenizer(long, truncation=False)["input_ids"])
    assert n_tokens > 77
    texts = ["a nurse", long, long + " beside a tall window at dawn"]
    items = [
        GenerationItem(image_id=f"img{k}", prompt_id=f"p{k}", text=t, seed=7, extra={})
        for k, t in enumerate(texts)
    ]
    out = tmp_path / "results/contextbias/images/tiny-sd/nurse/CF/0"
    rows = generate_shard(tiny_gen, items, out, model_name="tiny-sd", batch_size=3, log=print)
    assert "prompt_truncation" not in rows[0] and "quirks" not in rows[0]
    assert rows[1]["prompt_truncation"] == [
        {
            "encoder": "tokenizer",
            "tokenizer": type(tokenizer).__name__,
            "limit": 77,
            "tokens": n_tokens,
            "kept": 77,
            "dropped": n_tokens - 77,
        }
    ]
    assert rows[1]["quirks"] == ["prompt_truncated"] == rows[2]["quirks"]
    assert rows[2]["prompt_truncation"][0]["dropped"] > rows[1]["prompt_truncation"][0]["dropped"]
    assert read_rows(out) == rows
    # what was dropped did not reach the model: the two long prompts (one seed) share
    # their first 77 tokens and so their image; the short prompt's differs
    assert rows[1]["image_sha256"] == rows[2]["image_sha256"] != rows[0]["image_sha256"]
    assert json.loads((out / "timing.json").read_text())["prompts_truncated"] == 2
    from stereolens.report.run import truncation_line
    from stereolens.throughput import configured_jobs

    jobs = configured_jobs(tmp_path / "results")
    assert jobs["prompts_truncated"].to_list() == [2]
    line = truncation_line(jobs)
    assert line.startswith(
        "Prompts cut by a text encoder: 2 of 3 generated images (tiny-sd 2 of 3). "
    )
    older = jobs.vstack(jobs.with_columns(pl.lit(None, pl.Int64).alias("prompts_truncated")))
    assert "(1 generation jobs made before stereolens recorded it are not counted)" in (
        truncation_line(older)
    )
    fits = jobs.with_columns(pl.lit(0, pl.Int64).alias("prompts_truncated"))
    assert truncation_line(fits) == "Prompts cut by a text encoder: none of the 3 generated images."
    assert truncation_line(jobs.drop("prompts_truncated")) is None  # an older run: no line
    from stereolens.report import run as RR
    from stereolens.report.cli import report_config
    from stereolens.report.html import render_sections
    from stereolens.report.inputs import Inputs

    config = report_config({})  # `stereolens report --results` of tables naming nothing
    html = render_sections(RR.sections(Inputs.from_frames({"job_timings": jobs}), config))
    assert "Generation quirks" in html and "2 of 3 generated images (tiny-sd 2 of 3)" in html


def test_shard_thumbnails_are_the_reports_and_spare_it_the_png(tiny_gen, tmp_path, monkeypatch):
    """The generation job writes one thumbnail per image at the report's default size and
    quality, from the image in memory with the report's own function: the same JPEG as one
    made from the PNG. The report's gallery copies it and decodes no PNG; at another size
    (or for another image) it makes its own from the PNG, as before."""
    from stereolens.report import thumbs as report_thumbs
    from stereolens.report.galleries import GallerySettings, ImageRef, thumbnails

    out = tmp_path / "shard"
    rows = generate_shard(tiny_gen, make_items(3), out, model_name="tiny-sd", log=lambda m: None)
    for row in rows:
        png = out / row["image_file"]
        found = shard_thumbnail(png, 160, 80, row["image_sha256"])
        assert found is not None and found[0] == out / "thumbs" / f"{row['image_id']}.jpg"
        size = make_thumbnail(png, tmp_path / "from-png.jpg", 160, 80, row["image_sha256"])
        assert size == found[1]
        assert (tmp_path / "from-png.jpg").read_bytes() == found[0].read_bytes()
    defaults = GallerySettings()
    assert (defaults.thumbnail_px, defaults.jpeg_quality) == (160, 80)

    decoded = []
    real = report_thumbs.make_thumbnail
    monkeypatch.setattr(
        report_thumbs, "make_thumbnail", lambda src, *a: decoded.append(src) or real(src, *a)
    )
    refs = [ImageRef(str(out / r["image_file"]), r["image_sha256"]) for r in rows]
    made = thumbnails(refs, tmp_path / "g" / "thumbs", 160, 80, cache_dir=tmp_path / "cache")
    assert decoded == [] and all(made[r] for r in refs)
    for ref, row in zip(refs, rows, strict=True):
        name = made[ref][0]
        shard = out / "thumbs" / f"{row['image_id']}.jpg"
        assert (tmp_path / "g" / "thumbs" / name).read_bytes() == shard.read_bytes()
    # without a recorded hash (the BiasIG gallery) the shard's thumbnail is used too
    assert thumbnails([ImageRef(refs[0].path)], tmp_path / "h", 160, 80)
    assert decoded == []
    # another size, or a hash that is not the thumbnail's image: made from the PNG
    thumbnails(refs[:1], tmp_path / "i", 96, 80)
    thumbnails([ImageRef(refs[1].path, "0" * 64)], tmp_path / "j", 160, 80)
    assert decoded == [refs[0].path, refs[1].path]


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

    # a finished image whose thumbnail is missing (a .partial of an older version) gets one;
    # a thumbnail of no item is removed
    (partial / "thumbs/img00.jpg").unlink()
    (partial / "thumbs/stray.jpg").write_bytes(b"x")
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
    for row in rows:  # every image has its thumbnail, made from this very image
        assert shard_thumbnail(out / row["image_file"], 160, 80, row["image_sha256"])
    assert any("2 of 5 images already finished" in m for m in logged)
    assert sorted(p.name for p in (out / "thumbs").iterdir()) == [f"img0{k}.jpg" for k in range(5)]
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


# -- scheduler settings ---------------------------------------------------------

LIGHTNING_SCHEDULER = {
    "class": "EulerDiscreteScheduler",
    "config": {"timestep_spacing": "trailing"},
}


def test_scheduler_class_and_config_are_applied(tiny_sd):
    plain = DiffusersGenerator(make_spec(tiny_sd))
    euler = DiffusersGenerator(make_spec(tiny_sd, scheduler="EulerDiscreteScheduler"))
    trailing = DiffusersGenerator(make_spec(tiny_sd, scheduler=LIGHTNING_SCHEDULER))
    assert type(plain.pipe.scheduler).__name__ != "EulerDiscreteScheduler"
    assert type(euler.pipe.scheduler).__name__ == "EulerDiscreteScheduler"
    assert type(trailing.pipe.scheduler).__name__ == "EulerDiscreteScheduler"
    assert euler.pipe.scheduler.config.timestep_spacing != "trailing"
    assert trailing.pipe.scheduler.config.timestep_spacing == "trailing"
    # the rest of the checkpoint's scheduler config is kept (from_config of the old config)
    assert trailing.pipe.scheduler.config.beta_end == plain.pipe.scheduler.config.beta_end
    # trailing spacing starts at the last training timestep: other timesteps, other images
    trailing.pipe.scheduler.set_timesteps(STEPS)
    euler.pipe.scheduler.set_timesteps(STEPS)
    assert trailing.pipe.scheduler.timesteps[0] > euler.pipe.scheduler.timesteps[0]
    a = pixels(euler.generate([PROMPTS[0]], [SEEDS[0]])[0])
    b = pixels(trailing.generate([PROMPTS[0]], [SEEDS[0]])[0])
    assert np.abs(a - b).mean() > 1
    # recorded with every image; absent for models without overrides
    s = trailing.settings()
    assert s["scheduler"] == "EulerDiscreteScheduler"
    assert s["scheduler_config"] == {"timestep_spacing": "trailing"}
    assert "scheduler_config" not in euler.settings()


@pytest.mark.parametrize(
    ("scheduler", "message"),
    [
        ("NoSuchScheduler", r"scheduler class 'NoSuchScheduler' is not a scheduler class.*known:"),
        ({"class": "NoSuchScheduler"}, r"'NoSuchScheduler' is not a scheduler class"),
        ({"class": "StableDiffusionPipeline"}, r"'StableDiffusionPipeline' is not a scheduler"),
        (
            {"class": "EulerDiscreteScheduler", "config": {"timestep_spacin": "trailing"}},
            r"scheduler.config has key\(s\) timestep_spacin that EulerDiscreteScheduler does not",
        ),
        ({"klass": "EulerDiscreteScheduler"}, "class name or a mapping"),
    ],
)
def test_bad_scheduler_is_a_clear_error_before_loading(tiny_sd, monkeypatch, scheduler, message):
    def no_load(*args, **kwargs):
        raise AssertionError("the checkpoint must not be loaded")

    monkeypatch.setattr(StableDiffusionPipeline, "from_pretrained", no_load)
    monkeypatch.setattr(AutoPipelineForText2Image, "from_pretrained", no_load)
    with pytest.raises(ConfigError, match=message):
        DiffusersGenerator(make_spec(tiny_sd, scheduler=scheduler))


def test_scheduler_in_registry_schema_and_fingerprint(tmp_path, repo_root):
    from stereolens.models.registry import load_registry

    reg = tmp_path / "models.yaml"
    reg.write_text(
        "generators:\n"
        "  a: {backend: diffusers, model: m, scheduler: EulerDiscreteScheduler}\n"
        "  b:\n    backend: diffusers\n    model: m\n"
        "    scheduler: {class: EulerDiscreteScheduler, config: {timestep_spacing: trailing}}\n"
    )
    specs = load_registry(reg)
    assert specs["b"].fingerprint()["scheduler"] == LIGHTNING_SCHEDULER
    assert specs["a"].fingerprint() != {**specs["b"].fingerprint(), "name": "a"}
    reg.write_text(
        "generators:\n  b:\n    backend: diffusers\n    model: m\n"
        "    scheduler: {name: EulerDiscreteScheduler}\n"
    )
    with pytest.raises(ConfigError, match="scheduler"):
        load_registry(reg)
    shipped = load_registry(repo_root / "config" / "models.yaml")
    assert shipped["sdxl-lightning"].get("scheduler") == LIGHTNING_SCHEDULER


# -- batch size and memory per attempt; out-of-memory retries --------------------


def test_batch_size_and_memory_per_attempt():
    spec = ModelSpec("m", "generator", "diffusers", "x", settings={"batch_size": 16})
    assert [spec.job_batch_size(a) for a in (1, 2, 3, 4, 5, 6)] == [16, 8, 4, 2, 1, 1]
    assert [spec.job_mem_mb(a) for a in (1, 2, 3)] == [32_000, 64_000, 96_000]
    tiny = ModelSpec("t", "generator", "diffusers", "x", settings={"build": "tiny-diffusion"})
    assert tiny.job_mem_mb(2) == 8_000 and tiny.job_batch_size(3) == 1
    api = ModelSpec("g", "vlm", "openai", "gpt", settings={"mem_mb": 1500})
    assert api.job_mem_mb(3) == 4_500 and not api.needs_gpu()
    smaller = spec.with_batch_size(4)
    assert smaller.get("batch_size") == 4 and smaller.fingerprint() == spec.fingerprint()
    assert spec.with_batch_size(None) is spec
    with pytest.raises(ValueError, match="batch_size"):
        spec.with_batch_size(0)


def test_gpus_a_job_asks_for():
    """A vLLM model asks for its tensor_parallel_size (the engine spreads over that many),
    a local torch model for 1 unless pinned to the CPU, an API model for none."""
    vllm = ModelSpec("q", "vlm", "vllm", "x", settings={"tensor_parallel_size": 2})
    assert vllm.job_gpus() == 2
    assert ModelSpec("q", "vlm", "vllm", "x").job_gpus() == 1
    assert ModelSpec("s", "generator", "diffusers", "x").job_gpus() == 1
    cpu = ModelSpec("c", "vlm", "transformers", "x", settings={"device": "cpu"})
    assert cpu.job_gpus() == 0 and not cpu.needs_gpu()
    assert ModelSpec("g", "vlm", "openai", "gpt").job_gpus() == 0


def test_injected_out_of_memory_and_a_smaller_batch(tiny_sd, tmp_path, monkeypatch):
    from stereolens.generate.job import run_generation
    from stereolens.models.job import INJECT_OOM_ENV, ModelJob

    spec = make_spec(tiny_sd, batch_size=8)
    items = [
        {"image_id": f"i{k}", "prompt_id": f"p{k}", "text": PROMPTS[k % 3], "seed": 200 + k}
        for k in range(6)
    ]
    monkeypatch.setenv(INJECT_OOM_ENV, "4")
    logged = []

    class Log:
        def info(self, msg, *args):
            logged.append(msg % args)

        error = info

    out = tmp_path / "shard"
    with pytest.raises(
        torch.OutOfMemoryError, match="injected out-of-memory error at batch size 8"
    ):
        run_generation(
            ModelJob(str(out), log=Log()), spec, items, label="x", load=DiffusersGenerator
        )
    assert any("out of memory at batch size 8" in m for m in logged)
    assert not out.exists()
    # the retry: half the batch size, more memory (as the workflow's resources give it)
    resources = {"mem_mb": 8000, "batch_size": 4}
    rows = run_generation(
        ModelJob(str(out), log=Log(), batch_size=4, resources=resources),
        spec,
        items,
        label="x",
        load=DiffusersGenerator,
    )
    timing = json.loads((out / "timing.json").read_text())
    assert timing["batch_size"] == 4 and timing["job_resources"] == resources
    assert any("images at batch size 4" in m for m in logged)
    # the same images as at batch size 8 (within the CPU kernels' rounding, see above)
    monkeypatch.delenv(INJECT_OOM_ENV)
    b8 = ModelJob(str(tmp_path / "b8"))
    rows8 = run_generation(b8, spec, items, label="x", load=DiffusersGenerator)
    for r4, r8 in zip(rows, rows8, strict=True):
        with (
            Image.open(out / r4["image_file"]) as a,
            Image.open(tmp_path / "b8" / r8["image_file"]) as b,
        ):
            diff = np.abs(pixels(a) - pixels(b))
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01
        assert r4["settings"] == r8["settings"]  # batch size is not a setting of the images


@pytest.mark.slow
def test_workflow_retries_an_out_of_memory_job_with_more_memory_and_a_smaller_batch(
    repo_root, tmp_path, tiny_models
):
    """One generation job of the embedded default through Snakemake with --retries 2 and
    an injected out-of-memory failure at batch sizes above 4 (tiny-sd's registry batch
    size is 8): attempt 1 fails, attempt 2 runs with batch size 4 and twice the memory,
    and its images equal batch-size-8 images. The tiny checkpoint is the session's (the
    files the workflow's build rule writes), so Snakemake builds none."""
    import dataclasses
    import re
    import shutil
    import subprocess
    import sys

    from stereolens.models.job import INJECT_OOM_ENV
    from stereolens.models.registry import load_registry

    for item in ("Snakefile", "workflow", "config", "profiles", "envs"):
        src = repo_root / item
        if src.is_dir():
            shutil.copytree(src, tmp_path / item, symlinks=True)
        else:
            shutil.copy2(src, tmp_path / item)
    tiny_models.seed_workflow(tmp_path, only=("resources/models/tiny-sd",))
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, HF_HUB_OFFLINE="1", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env[INJECT_OOM_ENV] = "4"
    target = "results/contextbias/images/tiny-sd/nurse/CF/0"
    out = subprocess.run(
        [str(bin_dir / "snakemake"), target, "--cores", "1", "--retries", "2"]
        + ["--configfile", "config/demo.yaml", "--show-failed-logs"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    # attempt 1 failed with the out-of-memory error; Snakemake restarted the job
    assert "injected out-of-memory error at batch size 8" in log, log[-6000:]
    assert "OutOfMemoryError" in log
    assert re.search(r"Trying to restart job", log), log[-6000:]
    # Snakemake's resources of the two attempts: the batch halves, the memory doubles
    attempts = [
        dict(kv.split("=", 1) for kv in line.split(", "))
        for line in re.findall(r"^\s+resources: (.*batch_size=.*)$", log, re.M)
    ]
    assert [(a["batch_size"], a["mem_mb"]) for a in attempts] == [("8", "4000"), ("4", "8000")]
    # the successful attempt ran with a smaller batch and more memory
    shard = tmp_path / target
    timing = json.loads((shard / "timing.json").read_text())
    assert timing["batch_size"] == 4
    assert timing["job_resources"]["batch_size"] == 4
    assert timing["job_resources"]["mem_mb"] == 2 * 4000  # tiny models: 4000 MB x attempt 2
    assert timing["images"] == 3  # 3 CF prompts of nurse x 1 seed
    # the same images as at the registry's batch size 8
    rows = read_rows(shard)
    spec = load_registry(tmp_path / "config/models.yaml")["tiny-sd"]
    assert spec.get("batch_size") == 8
    gen = DiffusersGenerator(dataclasses.replace(spec, model=str(tmp_path / spec.model)))
    again = gen.generate([r["prompt"] for r in rows], [r["seed"] for r in rows])
    for row, image in zip(rows, again, strict=True):
        with Image.open(shard / row["image_file"]) as made:
            diff = np.abs(pixels(made) - pixels(image))
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01, row["image_id"]


@pytest.mark.parametrize("job", ["extract", "vqa"])
def test_extraction_and_vqa_jobs_run_at_the_attempts_batch_size(job, tmp_path, monkeypatch):
    """The extraction and VQA jobs load their model with the batch size of the attempt
    (the registry's is replaced) and honour the injected out-of-memory failure."""
    from stereolens.biasig import jobs as biasig_jobs
    from stereolens.contextbias import jobs as contextbias_jobs
    from stereolens.models import job as model_job
    from stereolens.paths import resource

    spec = ModelSpec("vlm", "vlm", "transformers", "x", settings={"batch_size": 8})
    loaded = []

    class NoVLM:
        def answer(self, requests):
            raise AssertionError("no images, no requests")

    monkeypatch.setattr(model_job, "load_registry", lambda path: {"vlm": spec})
    monkeypatch.setattr(model_job, "load_model", lambda s: loaded.append(s) or NoVLM())
    images = tmp_path / "images"
    images.mkdir()
    (images / "metadata.jsonl").write_text("")

    def run(batch_size, out):
        at = model_job.ModelJob(str(out), "models.yaml", batch_size=batch_size)
        if job == "extract":
            return contextbias_jobs.extract_contextbias_shard(
                at,
                "vlm",
                str(images),
                str(resource("contextbias", "attribute_schema.v1.yaml")),
                str(resource("contextbias", "extraction_prompt.v1.yaml")),
                1,
            )
        return biasig_jobs.vqa_biasig_shard(at, "vlm", str(images))

    monkeypatch.setenv(model_job.INJECT_OOM_ENV, "4")
    with pytest.raises(torch.OutOfMemoryError, match="batch size 8"):
        run(None, tmp_path / "a.jsonl")
    assert loaded[-1].get("batch_size") == 8
    assert run(4, tmp_path / "b.jsonl") == []
    assert loaded[-1].get("batch_size") == 4 and loaded[-1].fingerprint() == spec.fingerprint()
    assert (tmp_path / "b.jsonl").exists()
    timing = json.loads((tmp_path / "b.jsonl.timing.json").read_text())
    assert timing["model"] == "vlm" and timing["items"] == 0 and timing["batch_size"] == 4


@pytest.mark.parametrize("job", ["respond", "story", "judge"])
def test_lvlm_jobs_run_at_the_attempts_batch_size(job, tmp_path, monkeypatch):
    """The LVLM model jobs load their model with the batch size of the attempt (the rule's
    batch_size resource replaces the registry's) and honour the injected out-of-memory
    failure, so a retry with a halved batch can pass."""
    import polars as pl

    from stereolens.atomic import write_jsonl
    from stereolens.lvlm import jobs as lvlm_jobs
    from stereolens.models import job as model_job

    spec = ModelSpec("m", "vlm", "transformers", "x", settings={"batch_size": 8})
    loaded = []

    class Loaded(Exception):
        pass

    def load(s):
        loaded.append(s)
        if s.get("batch_size") <= 4:
            raise Loaded  # loaded at the smaller batch: enough for this test
        return object()

    monkeypatch.setattr(model_job, "load_registry", lambda path: {"m": spec})
    monkeypatch.setattr(model_job, "load_model", load)
    sets = tmp_path / "sets.parquet"
    pl.DataFrame(
        {"task": ["story"], "axis": ["gender"], "group": ["female"], "shard": [0],
         "image_id": ["i"], "path": ["x.png"], "gender": ["female"]}
    ).write_parquet(sets)  # fmt: skip
    responses = tmp_path / "responses.jsonl"
    write_jsonl(responses, [{"response": "A story.", "status": "ok", "image_id": "i"}])
    settings = {"seed": 0, "max_attempts": 1, "prompts": None, "mitigation_placement":
                "user_suffix", "terms": None, "max_new_tokens": 8}  # fmt: skip

    def run(batch_size, out):
        at = model_job.ModelJob(
            str(out), "models.yaml", log=logging.getLogger("t"), batch_size=batch_size
        )
        if job == "respond":
            return lvlm_jobs.respond_job(
                at, model="m", setting="image", task="story", axis="gender",
                usergroup="female", shard=0, sets_path=str(sets), settings=settings,
            )  # fmt: skip
        kw = dict(response_paths=[str(responses)], settings=settings)
        if job == "story":
            return lvlm_jobs.extract_story_job(at, assistant="m", **kw)
        return lvlm_jobs.judge_terms_job(at, assistant="m", **kw)

    monkeypatch.setenv(model_job.INJECT_OOM_ENV, "4")
    with pytest.raises(torch.OutOfMemoryError, match="batch size 8"):
        run(None, tmp_path / "a")
    assert loaded[-1].get("batch_size") == 8
    with pytest.raises(Loaded):
        run(4, tmp_path / "b")
    assert loaded[-1].get("batch_size") == 4 and loaded[-1].fingerprint() == spec.fingerprint()
