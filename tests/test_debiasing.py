"""Debiasing variants: prompt intervention, semantic guidance (Fair Diffusion), LoRA.

Everything runs on the CPU against the tiny random-weight pipeline; nothing is
downloaded.
"""
# ruff: noqa: E402  (HF_HUB_OFFLINE must be set before huggingface_hub is imported)

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

import torch

from stereolens.models.backends.diffusers_backend import DiffusersGenerator, flip_direction
from stereolens.models.registry import ModelSpec, load_registry
from stereolens.models.variants import (
    apply_prompt_intervention,
    check_prompt_intervention,
    check_variants,
)
from stereolens.validation import ConfigError

RES = 32
STEPS = 2
PROMPTS = ["a photo of a doctor", "a nurse at work"]
SEEDS = [11, 12]
FAIR = {
    "editing_prompt": ["male person", "female person"],
    "reverse_editing_direction": [True, False],
    "edit_guidance_scale": [4.0, 4.0],
    "edit_warmup_steps": [0, 0],
    "edit_threshold": [0.9, 0.9],
    "edit_momentum_scale": 0.3,
    "edit_mom_beta": 0.6,
}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_spec(path: Path, name: str = "tiny-sd", **settings) -> ModelSpec:
    base = {"resolution": RES, "steps": STEPS, "guidance": 5.0, "device": "cpu", "dtype": "float32"}
    return ModelSpec(
        name=name,
        kind="generator",
        backend="diffusers",
        model=str(path),
        settings={**base, **settings},
    )


def pixels(images) -> np.ndarray:
    return np.stack([np.asarray(im.convert("RGB"), dtype=np.int16) for im in images])


def max_diff(a, b) -> int:
    return int(np.abs(pixels(a) - pixels(b)).max())


@pytest.fixture(scope="module")
def base_images(tiny_sd):
    return DiffusersGenerator(make_spec(tiny_sd)).generate(PROMPTS, SEEDS)


class Spy:
    """Stands in for a pipeline; records the keyword arguments of every call."""

    def __init__(self, real):
        self.real = real
        self.calls = []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        return self.real(**kwargs)


# -- prompt intervention ------------------------------------------------------


def test_prompt_intervention(tiny_sd, base_images):
    text = "any gender"
    gen = DiffusersGenerator(
        make_spec(
            tiny_sd,
            name="tiny-sd-iv",
            variant_of="tiny-sd",
            style_prefix="realistic photo",
            prompt_intervention={"text": text},
            batch_size=2,
        )
    )
    spy = Spy(gen.pipe)
    gen.pipe = spy
    images = gen.generate(PROMPTS, SEEDS)
    gen.pipe = spy.real
    assert spy.calls[0]["prompt"] == [f"realistic photo, {p} {text}" for p in PROMPTS]
    assert max_diff(images, base_images) > 0
    s = gen.settings()
    json.dumps(s)
    assert s["variant_of"] == "tiny-sd"
    assert s["prompt_intervention"] == {"text": text, "position": "suffix", "separator": " "}
    assert "semantic_guidance" not in s and "lora" not in s


def test_prompt_intervention_forms():
    iv = check_prompt_intervention(
        {"text": "Fair and diverse.", "position": "prefix", "separator": ". "}, "x"
    )
    assert apply_prompt_intervention("a doctor", iv) == "Fair and diverse.. a doctor"
    assert apply_prompt_intervention("a doctor", None) == "a doctor"
    iv = check_prompt_intervention({"text": " all genders "}, "x")
    assert apply_prompt_intervention("a doctor", iv) == "a doctor all genders"
    for bad, message in [
        ({"text": "a {occupation} of any gender"}, "placeholder"),
        ({"text": "x", "position": "middle"}, "position"),
        ({"text": "  "}, "empty"),
        ({"txt": "x"}, "text"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_prompt_intervention(bad, "x")


# -- semantic guidance (Fair Diffusion) ----------------------------------------


@pytest.fixture(scope="module")
def fair_gen(tiny_sd):
    return DiffusersGenerator(
        make_spec(
            tiny_sd,
            name="tiny-sd-fair",
            variant_of="tiny-sd",
            semantic_guidance=FAIR,
            batch_size=2,
        )
    )


def test_semantic_guidance(fair_gen, base_images):
    assert type(fair_gen.pipe).__name__ == "SemanticStableDiffusionPipeline"
    spy = Spy(fair_gen.pipe)
    fair_gen.pipe = spy
    images = fair_gen.generate(PROMPTS, SEEDS)
    fair_gen.pipe = spy.real
    call = spy.calls[0]
    assert call["editing_prompt"] == FAIR["editing_prompt"]
    assert call["reverse_editing_direction"] == [True, False]
    assert call["edit_mom_beta"] == 0.6 and len(call["generator"]) == 2
    assert max_diff(images, base_images) > 0
    assert max_diff(images, fair_gen.generate(PROMPTS, SEEDS)) == 0
    s = fair_gen.settings()
    json.dumps(s)
    assert s["pipeline_class"] == "SemanticStableDiffusionPipeline"
    assert s["semantic_guidance"]["editing_prompt"] == FAIR["editing_prompt"]


def test_randomized_direction_flips_by_seed(tiny_sd, fair_gen):
    seeds = list(range(6))
    flips = [flip_direction(s) for s in seeds]
    assert any(flips) and not all(flips)
    assert flips == [flip_direction(s) for s in seeds]  # deterministic
    prompts = [PROMPTS[0]] * len(seeds)
    rand = DiffusersGenerator(
        make_spec(
            tiny_sd,
            semantic_guidance={**FAIR, "randomize_direction": True},
            batch_size=len(seeds),
        )
    )
    spy = Spy(rand.pipe)
    rand.pipe = spy
    images = rand.generate(prompts, seeds)
    rand.pipe = spy.real
    assert sorted(c["reverse_editing_direction"] for c in spy.calls) == [
        [False, True],
        [True, False],
    ]
    assert len(images) == len(seeds)
    flipped = DiffusersGenerator(
        make_spec(tiny_sd, semantic_guidance={**FAIR, "reverse_editing_direction": [False, True]})
    )
    kept = fair_gen.generate(prompts, seeds)
    other = flipped.generate(prompts, seeds)
    for k, flip in enumerate(flips):
        want, not_want = (other[k], kept[k]) if flip else (kept[k], other[k])
        assert max_diff([images[k]], [want]) <= 2  # batches of other sizes may round apart
        assert max_diff([images[k]], [not_want]) > 2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"pipeline_class": "StableDiffusionPipeline"}, "pipeline_class"),
        ({"guidance": 1.0}, "above 1"),
        ({"semantic_guidance": {**FAIR, "edit_threshold": [0.9]}}, "edit_threshold has 1 value"),
        ({"semantic_guidance": {"editing_prompt": []}}, "editing_prompt"),
        ({"pipeline_kwargs": {"edit_mom_beta": 0.1}}, "pipeline_kwargs.edit_mom_beta"),
    ],
)
def test_semantic_guidance_errors(tiny_sd, settings, message):
    settings = {"semantic_guidance": FAIR, **settings}
    with pytest.raises(ConfigError, match=message):
        DiffusersGenerator(make_spec(tiny_sd, **settings))


def test_semantic_guidance_refuses_other_checkpoints(tmp_path):
    fake = tmp_path / "sdxl"
    fake.mkdir()
    (fake / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLPipeline"}))
    with pytest.raises(ConfigError, match="Stable Diffusion 1.x/2.x-style.*StableDiffusionXL"):
        DiffusersGenerator(make_spec(fake, semantic_guidance=FAIR))


# -- LoRA --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_lora(tiny_sd, tmp_path_factory) -> Path:
    """A rank-2 LoRA on the tiny UNet's attention projections, random weights."""
    pytest.importorskip("peft")
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    unet = UNet2DConditionModel.from_pretrained(str(tiny_sd), subfolder="unet")
    unet.add_adapter(
        LoraConfig(r=2, lora_alpha=2, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in unet.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(unet))
    out = tmp_path_factory.mktemp("lora")
    StableDiffusionPipeline.save_lora_weights(
        str(out), unet_lora_layers=layers, safe_serialization=True
    )
    return out


def test_lora_changes_the_output_and_scale_zero_does_not(tiny_sd, tiny_lora, base_images):
    lora = {"path": str(tiny_lora), "scale": 1.0}
    gen = DiffusersGenerator(make_spec(tiny_sd, name="tiny-sd-lora", lora=lora))
    assert max_diff(gen.generate(PROMPTS, SEEDS), base_images) > 2
    assert gen.settings()["lora"] == lora
    off = DiffusersGenerator(make_spec(tiny_sd, lora={**lora, "scale": 0.0}))
    assert max_diff(off.generate(PROMPTS, SEEDS), base_images) <= 1


def test_lora_with_semantic_guidance(tiny_sd, tiny_lora, fair_gen):
    lora = {
        "path": str(tiny_lora),
        "weight_name": "pytorch_lora_weights.safetensors",
        "adapter_name": "fair",
    }
    gen = DiffusersGenerator(make_spec(tiny_sd, semantic_guidance=FAIR, lora=lora))
    assert type(gen.pipe).__name__ == "SemanticStableDiffusionPipeline"
    assert max_diff(gen.generate(PROMPTS, SEEDS), fair_gen.generate(PROMPTS, SEEDS)) > 2


def test_missing_lora_is_a_load_error(tiny_sd, tmp_path):
    from stereolens.models.backends.diffusers_backend import ModelLoadError

    with pytest.raises(ModelLoadError, match="LoRA weights"):
        DiffusersGenerator(make_spec(tiny_sd, lora={"path": str(tmp_path / "none")}))


# -- registry: fingerprints, check_variants, schema --------------------------------


def test_variant_fingerprint_differs_from_base(tiny_sd):
    base = make_spec(tiny_sd)
    for extra in (
        {"prompt_intervention": {"text": "of any gender"}},
        {"semantic_guidance": FAIR},
        {"lora": {"path": "some/lora", "scale": 0.8}},
    ):
        variant = make_spec(tiny_sd, name="tiny-sd", variant_of="tiny-sd", **extra)
        fp = variant.fingerprint()
        assert fp != base.fingerprint()
        assert fp["variant_of"] == "tiny-sd" and next(iter(extra)) in fp


def spec(name, kind="generator", **settings):
    return ModelSpec(name=name, kind=kind, backend="diffusers", model="m", settings=settings)


def test_check_variants():
    specs = {
        "base": spec("base"),
        "iv": spec("iv", variant_of="base"),
        "other": spec("other"),
        "fair": spec("fair", variant_of="base"),
        "vlm": spec("vlm", kind="vlm"),
    }
    check_variants(specs)
    for bad, message in [
        ({"x": spec("x", variant_of="nope")}, "x.variant_of is 'nope', which is not in"),
        ({"x": spec("x", variant_of="x")}, "names the entry itself"),
        ({"x": spec("x", variant_of="iv")}, "itself a variant of 'base'"),
        ({"x": spec("x", variant_of="vlm")}, "is a vlm"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_variants({**specs, **bad})


def test_registry_schema_accepts_variant_keys(tmp_path, repo_root):
    reg = tmp_path / "models.yaml"
    reg.write_text(
        "generators:\n"
        "  base: {backend: diffusers, model: a/b}\n"
        "  v:\n"
        "    backend: diffusers\n"
        "    model: a/b\n"
        "    variant_of: base\n"
        "    prompt_intervention: {text: of any gender, position: prefix}\n"
        "    semantic_guidance: {editing_prompt: [male person], randomize_direction: true}\n"
        "    lora: {path: c/d, scale: 0.5}\n"
    )
    specs = load_registry(reg)
    check_variants(specs)
    assert specs["v"].get("lora") == {"path": "c/d", "scale": 0.5}
    reg.write_text(
        "generators:\n  v:\n    backend: diffusers\n    model: a/b\n"
        "    prompt_intervention: {text: x, position: middle}\n"
    )
    with pytest.raises(ConfigError, match="position"):
        load_registry(reg)
    shipped = load_registry(repo_root / "config" / "models.yaml")
    check_variants(shipped)
    assert any(spec.get("variant_of") for spec in shipped.values())
