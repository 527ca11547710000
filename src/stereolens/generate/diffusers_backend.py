"""Text-to-image through Hugging Face diffusers (registry backend ``diffusers``).

One ``DiffusersGenerator`` loads one pipeline once (``from_pretrained`` on a hub id
or a local folder) and then makes images in batches. Every image gets its own
``torch.Generator`` seeded with its own seed, so the starting noise of an image
depends only on its (prompt, seed), never on which other images share its batch.
(The arithmetic is another matter: kernels may round differently for different
batch sizes, so images made with different ``batch_size`` can differ by a unit in
a few pixel values. Keep ``batch_size`` fixed within a study.)

Registry settings used here (see resources/schemas/models.schema.yaml):
dtype, variant, pipeline_class, scheduler, device, enable_cpu_offload,
trust_remote_code, batch_size, resolution, steps, guidance, negative_prompt,
style_prefix, pipeline_kwargs. ``dtype: auto`` means float32 on CPU and, on CUDA,
bfloat16 where the GPU supports it, else float16 (diffusers itself has no "auto":
left unset, its own models load as float32 while transformers text encoders keep
the checkpoint's dtype).

This module imports torch and diffusers; nothing imports it except the registry's
lazy backend lookup.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from typing import Any

import diffusers
import torch
import yaml
from packaging.version import Version

from stereolens.registry import REGISTRY_SCHEMA, ModelSpec
from stereolens.validation import ConfigError

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """from_pretrained failed; the message names the registry entry and the model."""


def known_settings() -> set[str]:
    """Setting keys of a generator registry entry, as the registry schema defines them."""
    schema = yaml.safe_load(REGISTRY_SCHEMA.read_text(encoding="utf-8"))
    keys = set(schema["$defs"]["generator"]["properties"])
    return keys - {"backend", "model", "revision"}


# Call arguments this backend sets itself; pipeline_kwargs may not set them.
RESERVED_CALL_ARGS = {
    "prompt",
    "negative_prompt",
    "height",
    "width",
    "num_inference_steps",
    "guidance_scale",
    "true_cfg_scale",
    "generator",
    "num_images_per_prompt",
    "output_type",
    "return_dict",
}

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# diffusers 0.42 renamed from_pretrained's `torch_dtype` to `dtype` (the old name
# still works there, with a deprecation warning); older releases know only `torch_dtype`.
_DTYPE_KWARG = "dtype" if Version(diffusers.__version__).release >= (0, 42) else "torch_dtype"


def resolve_device(device: str | None) -> str:
    """Device name: "auto" (or unset) = "cuda" when available, else "cpu"."""
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def resolve_dtype(dtype: str | None, device: str) -> torch.dtype:
    """Registry dtype name -> torch dtype; see the module docstring for "auto"."""
    if dtype in (None, "auto"):
        if torch.device(device).type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ConfigError(
            f"generator setting dtype is {dtype!r}; allowed: auto, {', '.join(_DTYPES)}"
        ) from None


def _diffusers_attr(name: str, key: str, what: str):
    obj = getattr(diffusers, name, None)
    if obj is None:
        raise ConfigError(
            f"generator setting {key} is {name!r}, which is not a {what} class in diffusers "
            f"{diffusers.__version__}"
        )
    return obj


def _load_hint(spec: ModelSpec) -> str:
    if os.path.isdir(spec.model):
        return ""
    if os.path.isabs(spec.model) or spec.model.startswith((".", "~")):
        return f" (there is no local folder {spec.model!r})"
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return (
            " (HF_HUB_OFFLINE is set, so only models already in the Hugging Face cache load: "
            "download it beforehand or point `model` at a local folder)"
        )
    return ""


class DiffusersGenerator:
    """A loaded diffusers text-to-image pipeline; see the module docstring."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        where = f"generator {spec.name!r}"
        known = known_settings()
        unknown = sorted(set(spec.settings) - known)
        if unknown:
            raise ConfigError(
                f"{where}: unknown setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        self.device = resolve_device(spec.get("device", "auto"))
        self.dtype = resolve_dtype(spec.get("dtype", "auto"), self.device)
        self.batch_size = int(spec.get("batch_size", 1) or 1)
        if self.batch_size < 1:
            raise ConfigError(f"{where}: batch_size must be at least 1, not {self.batch_size}")

        pipeline_class = spec.get("pipeline_class")
        if pipeline_class:
            cls = _diffusers_attr(pipeline_class, "pipeline_class", "pipeline")
        else:
            cls = diffusers.AutoPipelineForText2Image
        # Names are checked before the (slow) load.
        scheduler = spec.get("scheduler")
        sched_cls = None
        if scheduler:
            sched_cls = _diffusers_attr(scheduler, "scheduler", "scheduler")
            if not (
                isinstance(sched_cls, type) and issubclass(sched_cls, diffusers.SchedulerMixin)
            ):
                raise ConfigError(
                    f"{where}: setting scheduler is {scheduler!r}, which is not a diffusers "
                    "scheduler class"
                )
        load_kwargs: dict[str, Any] = {
            "revision": spec.revision,
            _DTYPE_KWARG: self.dtype,
            "variant": spec.get("variant"),
            "trust_remote_code": bool(spec.get("trust_remote_code", False)),
        }
        started = time.perf_counter()
        try:
            pipe = cls.from_pretrained(spec.model, **load_kwargs)
        except Exception as exc:
            raise ModelLoadError(
                f"{where}: could not load {spec.model!r} (revision {spec.revision!r}) with "
                f"{cls.__name__}.from_pretrained: {type(exc).__name__}: {exc}{_load_hint(spec)}"
            ) from exc

        if sched_cls is not None:
            pipe.scheduler = sched_cls.from_config(pipe.scheduler.config)

        if spec.get("enable_cpu_offload", False):
            dev = torch.device(self.device)
            if dev.type == "cpu":
                log.warning("%s: enable_cpu_offload has no effect on device cpu; ignored", where)
                pipe.to(self.device)
            else:
                pipe.enable_model_cpu_offload(gpu_id=dev.index, device=dev.type)
        else:
            pipe.to(self.device)
        pipe.set_progress_bar_config(disable=True)
        self.pipe = pipe
        self._call_kwargs = self._fixed_call_kwargs()
        self.load_seconds = time.perf_counter() - started
        """Seconds spent loading (from_pretrained, scheduler swap, move to device)."""

    # -- call arguments -------------------------------------------------------

    def _accepted(self) -> dict[str, inspect.Parameter]:
        """Named parameters of the pipeline's __call__ (a **kwargs catch-all does not count:
        diffusers pipelines swallow unknown keywords there and ignore them)."""
        params = inspect.signature(self.pipe.__call__).parameters
        return {
            n: p
            for n, p in params.items()
            if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
        }

    def _guidance_arg(self, params: dict[str, inspect.Parameter]) -> str | None:
        """Which call argument carries the registry's ``guidance``.

        Pipelines with true classifier-free guidance under the name ``true_cfg_scale``
        and either no ``guidance_scale`` or one that defaults to None (Qwen-Image) take
        it as ``true_cfg_scale``. Pipelines that have both with a numeric
        ``guidance_scale`` default (FLUX: guidance_scale is the distilled guidance)
        take it as ``guidance_scale``; set ``true_cfg_scale`` through pipeline_kwargs.
        """
        gs = params.get("guidance_scale")
        if "true_cfg_scale" in params and (gs is None or gs.default is None):
            return "true_cfg_scale"
        if gs is not None:
            return "guidance_scale"
        return "true_cfg_scale" if "true_cfg_scale" in params else None

    def _fixed_call_kwargs(self) -> dict[str, Any]:
        """The call arguments shared by every batch; checks each against __call__."""
        spec = self.spec
        params = self._accepted()
        pipe_name = type(self.pipe).__name__

        def reject(key: str, arg: str) -> ConfigError:
            return ConfigError(
                f"generator {spec.name!r}: registry setting `{key}` is set, but "
                f"{pipe_name}.__call__ has no argument `{arg}`; remove `{key}` from the "
                f"registry entry (accepted arguments: {', '.join(sorted(params))})"
            )

        for arg in ("prompt", "generator"):
            if arg not in params:
                raise ConfigError(
                    f"generator {spec.name!r}: {pipe_name}.__call__ has no `{arg}` argument; "
                    "it is not a text-to-image pipeline this backend can drive"
                )
        kwargs: dict[str, Any] = {}
        resolution = spec.get("resolution")
        if resolution is not None:
            for arg in ("height", "width"):
                if arg not in params:
                    raise reject("resolution", arg)
                kwargs[arg] = int(resolution)
        steps = spec.get("steps")
        if steps is not None:
            if "num_inference_steps" not in params:
                raise reject("steps", "num_inference_steps")
            kwargs["num_inference_steps"] = int(steps)
        guidance = spec.get("guidance")
        self._guidance_name = self._guidance_arg(params)
        if guidance is not None:
            if self._guidance_name is None:
                raise reject("guidance", "guidance_scale")
            kwargs[self._guidance_name] = float(guidance)
        if spec.get("negative_prompt") is not None and "negative_prompt" not in params:
            raise reject("negative_prompt", "negative_prompt")
        extra = spec.get("pipeline_kwargs") or {}
        if not isinstance(extra, dict):
            raise ConfigError(f"generator {spec.name!r}: pipeline_kwargs must be a mapping")
        for key, value in extra.items():
            if key in RESERVED_CALL_ARGS and not (
                key in ("guidance_scale", "true_cfg_scale") and key not in kwargs
            ):
                raise ConfigError(
                    f"generator {spec.name!r}: pipeline_kwargs.{key} is set by the backend "
                    "itself (from resolution/steps/guidance/negative_prompt/seeds); use those "
                    "registry settings instead"
                )
            if key not in params:
                raise reject(f"pipeline_kwargs.{key}", key)
            kwargs[key] = value
        return kwargs

    # -- Generator protocol ---------------------------------------------------

    def _generator_device(self) -> str:
        return str(getattr(self.pipe, "_execution_device", None) or self.device)

    def _full_prompt(self, prompt: str) -> str:
        prefix = self.spec.get("style_prefix")
        return f"{prefix}, {prompt}" if prefix else prompt

    def generate(self, prompts: list[str], seeds: list[int]) -> list[Any]:
        """One PIL image per (prompt, seed), made ``batch_size`` at a time."""
        prompts, seeds = list(prompts), list(seeds)
        if len(prompts) != len(seeds):
            raise ValueError(f"got {len(prompts)} prompts but {len(seeds)} seeds")
        negative = self.spec.get("negative_prompt")
        gen_device = self._generator_device()
        images: list[Any] = []
        for start in range(0, len(prompts), self.batch_size):
            batch_prompts = [self._full_prompt(p) for p in prompts[start : start + self.batch_size]]
            batch_seeds = seeds[start : start + self.batch_size]
            kwargs = dict(self._call_kwargs)
            kwargs["prompt"] = batch_prompts
            if negative is not None:
                # A list, not a str: some pipelines insist that prompt and negative_prompt
                # have the same type.
                kwargs["negative_prompt"] = [negative] * len(batch_prompts)
            kwargs["generator"] = [
                torch.Generator(gen_device).manual_seed(int(s)) for s in batch_seeds
            ]
            with torch.inference_mode():
                out = self.pipe(**kwargs)
            batch_images = out.images if hasattr(out, "images") else out[0]
            if len(batch_images) != len(batch_prompts):
                raise RuntimeError(
                    f"{type(self.pipe).__name__} returned {len(batch_images)} images for "
                    f"{len(batch_prompts)} prompts"
                )
            images.extend(batch_images)
        return images

    def settings(self) -> dict[str, Any]:
        """The resolved settings that determine the images."""
        spec = self.spec
        return {
            "model": spec.model,
            "revision": spec.revision,
            "dtype": str(self.dtype).removeprefix("torch."),
            "variant": spec.get("variant"),
            "device": self.device,
            "generator_device": torch.device(self._generator_device()).type,
            "resolution": spec.get("resolution"),
            "steps": spec.get("steps"),
            "guidance": spec.get("guidance"),
            "guidance_argument": self._guidance_name if spec.get("guidance") is not None else None,
            "negative_prompt": spec.get("negative_prompt"),
            "style_prefix": spec.get("style_prefix"),
            "scheduler": type(self.pipe.scheduler).__name__,
            "pipeline_class": type(self.pipe).__name__,
            "pipeline_kwargs": dict(spec.get("pipeline_kwargs") or {}),
            "diffusers_version": diffusers.__version__,
            "torch_version": torch.__version__,
        }
