"""Architecture twins: tiny random-weight models of the registry's classes, built from configs
and cached on disk by :func:`twin_path`; one builder module per architecture family
(docs/twins.md, "How the twins are built")."""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stereolens.atomic import atomic_dir

FORMAT = 1
"""Bumped when the cache layout changes."""


@dataclass(frozen=True)
class TwinBuilder:
    """How to build one twin."""

    name: str
    """Key in resources/twins.yaml (``builder:``)."""
    kind: str
    """generator, lora, vlm or llm."""
    pipeline_class: str
    """Class the folder loads as through the registry backend (the pipeline or model)."""
    target: str
    """``module:function`` that writes the folder: ``fn(out_dir, seed, **extra)``."""
    version: int = 1
    """Bump when the builder's output changes (a new cache folder)."""
    resolution: int | None = None
    """Image side a scaled-down run uses (generators)."""
    base: str | None = None
    """A LoRA's base twin."""
    runner: str = "backend"
    """How the twin is run: ``backend`` (the registry backend itself), ``model``
    (model-level: the processor class cannot be built here, see .language) or ``vllm``
    (only vLLM's own implementation loads it: no transformers class does)."""
    wants_final_dir: bool = False
    """The builder must know the folder's final path (it writes it into a file)."""


_D = "stereolens.models.tiny.twins.diffusion"
_T = "stereolens.models.tiny.twins.diffusion_transformers"
_L = "stereolens.models.tiny.twins.language"
_I = "stereolens.models.tiny.twins.internvl"


def _generator(name: str, pipeline: str, target: str, resolution: int = 32, **more: Any):
    return TwinBuilder(name, "generator", pipeline, target, resolution=resolution, **more)


def _vlm(name: str, model_class: str, target: str, runner: str = "model") -> TwinBuilder:
    return TwinBuilder(name, "vlm", model_class, target, runner=runner)


_SDXL = "StableDiffusionXLPipeline"
_INTERNVL = "InternVLForConditionalGeneration"
BUILDERS: dict[str, TwinBuilder] = {
    b.name: b
    for b in (
        _generator("sd15", "StableDiffusionPipeline", f"{_D}:build_sd15"),
        _generator("sdxl-base", _SDXL, f"{_D}:build_sdxl_base"),
        _generator("sdxl-turbo", _SDXL, f"{_D}:build_sdxl_turbo"),
        _generator("playground-v2.5", _SDXL, f"{_D}:build_playground_v25"),
        TwinBuilder(
            "sdxl-lora", "lora", "LoRA (SDXL UNet)", f"{_D}:build_sdxl_lora", base="sdxl-base"
        ),
        _generator("sd3.5", "StableDiffusion3Pipeline", f"{_T}:build_sd35"),
        _generator("flux.1-dev", "FluxPipeline", f"{_T}:build_flux_dev"),
        _generator("qwen-image", "QwenImagePipeline", f"{_T}:build_qwen_image"),
        _generator("pixart-sigma", "PixArtSigmaPipeline", f"{_T}:build_pixart_sigma", 256),
        _generator(
            "stable-cascade",
            "StableCascadeCombinedPipeline",
            f"{_T}:build_stable_cascade",
            128,
            wants_final_dir=True,
        ),
        _vlm("qwen2.5-vl", "Qwen2_5_VLForConditionalGeneration", f"{_L}:build_qwen25_vl"),
        _vlm(
            "llava-next", "LlavaNextForConditionalGeneration", f"{_L}:build_llava_next", "backend"
        ),
        _vlm(
            "llava-onevision",
            "LlavaOnevisionForConditionalGeneration",
            f"{_L}:build_llava_onevision",
        ),
        _vlm("gemma3", "Gemma3ForConditionalGeneration", f"{_L}:build_gemma3", "backend"),
        _vlm("internvl3", _INTERNVL, f"{_I}:build_internvl3"),
        _vlm("internvl3.5", _INTERNVL, f"{_I}:build_internvl35"),
        _vlm(
            "mini-internvl-v1.5",
            "InternVLChatModel (vLLM)",
            f"{_I}:build_mini_internvl_v15",
            "vllm",
        ),
        TwinBuilder("qwen3", "llm", "Qwen3ForCausalLM", f"{_L}:build_qwen3"),
    )
}


def builder(name: str) -> TwinBuilder:
    try:
        return BUILDERS[name]
    except KeyError:
        raise KeyError(f"no twin builder {name!r}; known: {', '.join(sorted(BUILDERS))}") from None


def cache_root() -> Path:
    """``$STEREOLENS_TWINS`` if set, else ``$STEREOLENS_CACHE`` (default
    ``~/.cache/stereolens``) / twins."""
    if os.environ.get("STEREOLENS_TWINS"):
        return Path(os.environ["STEREOLENS_TWINS"])
    root = os.environ.get("STEREOLENS_CACHE") or str(Path.home() / ".cache" / "stereolens")
    if root == "off":
        root = str(Path(tempfile.gettempdir()) / "stereolens-twins")
    return Path(root) / "twins"


def _libraries_key() -> str:
    import diffusers
    import tokenizers
    import torch
    import transformers

    versions = (FORMAT, diffusers.__version__, transformers.__version__, tokenizers.__version__)
    versions += (torch.__version__.split("+")[0],)
    return hashlib.sha256(repr(versions).encode()).hexdigest()[:10]


def folder_name(name: str, extra: dict[str, Any] | None = None) -> str:
    """Cache folder name of a twin: name, builder version, library key (and, for a twin
    built with options such as a LoRA's weight file name, a hash of them)."""
    b = builder(name)
    label = f"{name}-v{b.version}-{_libraries_key()}"
    if extra:
        label += "-" + hashlib.sha256(repr(sorted(extra.items())).encode()).hexdigest()[:8]
    return label


def twin_path(name: str, root: str | os.PathLike | None = None, **extra: Any) -> Path:
    """The folder of twin ``name``, built first if it is not in the cache (``root``,
    default :func:`cache_root`). ``extra`` goes to the builder (a LoRA's
    ``weight_name``); a LoRA's base twin is built (or found) first."""
    b = builder(name)
    root = Path(root) if root is not None else cache_root()
    target = root / folder_name(name, extra)
    if target.is_dir():
        return target
    kwargs = dict(extra)
    if b.base is not None:
        kwargs["base_dir"] = twin_path(b.base, root)
    if b.wants_final_dir:
        kwargs["final_dir"] = target
    # keep_existing: another process built it meanwhile; keep theirs
    with atomic_dir(target, keep_existing=True) as tmp:
        module, func = b.target.split(":")
        getattr(importlib.import_module(module), func)(tmp, 0, **kwargs)
    return target
