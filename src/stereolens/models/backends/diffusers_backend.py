"""Text-to-image through Hugging Face diffusers (registry backend ``diffusers``): one pipeline
loaded once, images in batches, one ``torch.Generator`` per image (docs/adding-a-model.md,
"The backends in detail"). Imports torch and diffusers; only the registry's lookup imports it."""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any

import diffusers
import torch

from stereolens.models.backends import resolve_device
from stereolens.models.backends.diffusers_settings import (
    _DTYPE_KWARG,
    _SEMANTIC_COMPATIBLE,
    RESERVED_CALL_ARGS,
    SEMANTIC_CALL_ARGS,
    SEMANTIC_PIPELINE,
    ModelLoadError,
    _check_semantic,
    _checkpoint_class,
    _diffusers_attr,
    _load_hint,
    alias_deprecated_libraries,
    flip_direction,
    known_settings,
    resolve_dtype,
    resolve_scheduler,
)
from stereolens.models.registry import ModelSpec, resolve_model_location
from stereolens.models.variants import apply_prompt_intervention, check_prompt_intervention
from stereolens.validation import ConfigError

log = logging.getLogger(__name__)


class DiffusersGenerator:
    """A loaded diffusers text-to-image pipeline; see docs/adding-a-model.md."""

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

        self.intervention = None
        if spec.get("prompt_intervention") is not None:
            self.intervention = check_prompt_intervention(spec.get("prompt_intervention"), where)
        self.semantic = None
        if spec.get("semantic_guidance") is not None:
            self.semantic = _check_semantic(spec.get("semantic_guidance"), where)
        self.lora = spec.get("lora")
        if self.lora is not None and not (
            isinstance(self.lora, dict) and isinstance(self.lora.get("path"), str)
        ):
            raise ConfigError(f"{where}: lora must be a mapping with a `path` string")

        pipeline_class = spec.get("pipeline_class")
        if self.semantic is not None:
            if pipeline_class not in (None, SEMANTIC_PIPELINE):
                raise ConfigError(
                    f"{where}: semantic_guidance runs on {SEMANTIC_PIPELINE}; remove "
                    f"pipeline_class {pipeline_class!r} (or semantic_guidance)"
                )
            guidance = spec.get("guidance")
            if guidance is not None and float(guidance) <= 1:
                raise ConfigError(
                    f"{where}: semantic_guidance needs classifier-free guidance; "
                    f"guidance is {guidance}, set it above 1"
                )
            found = _checkpoint_class(spec)
            if found is not None and found not in _SEMANTIC_COMPATIBLE:
                raise ConfigError(
                    f"{where}: semantic_guidance needs a Stable Diffusion 1.x/2.x-style "
                    f"checkpoint (StableDiffusionPipeline: one CLIP text encoder and a UNet), "
                    f"but {spec.model!r} is a {found}"
                )
            pipeline_class = SEMANTIC_PIPELINE
        if pipeline_class:
            cls = _diffusers_attr(pipeline_class, "pipeline_class", "pipeline")
        else:
            cls = diffusers.AutoPipelineForText2Image
        # Names are checked before the (slow) load.
        sched_cls, self.scheduler_config = resolve_scheduler(spec.get("scheduler"), where)
        load_kwargs: dict[str, Any] = {
            "revision": spec.revision,
            _DTYPE_KWARG: self.dtype,
            "variant": spec.get("variant"),
            "trust_remote_code": bool(spec.get("trust_remote_code", False)),
        }
        started = time.perf_counter()
        try:
            alias_deprecated_libraries(spec, where)
            pipe = cls.from_pretrained(spec.model, **load_kwargs)
        except Exception as exc:
            semantic = (
                "; semantic_guidance needs a Stable Diffusion 1.x/2.x-style checkpoint"
                if self.semantic is not None
                else ""
            )
            raise ModelLoadError(
                f"{where}: could not load {spec.model!r} (revision {spec.revision!r}) with "
                f"{cls.__name__}.from_pretrained: {type(exc).__name__}: {exc}"
                f"{_load_hint(spec)}{semantic}"
            ) from exc

        if self.lora is not None:
            self._load_lora(pipe)
        if sched_cls is not None:
            pipe.scheduler = sched_cls.from_config(pipe.scheduler.config, **self.scheduler_config)

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
        checker = getattr(pipe, "safety_checker", None)
        self.safety_checker = type(checker).__name__ if checker is not None else None
        """Class of the checkpoint's safety checker when it has one (SD 1.x): it replaces
        images it flags with black ones; generate() logs how many."""
        self._call_kwargs = self._fixed_call_kwargs()
        self.load_seconds = time.perf_counter() - started
        """Seconds spent loading (from_pretrained, scheduler swap, move to device)."""

    def _load_lora(self, pipe) -> None:
        """Load ``lora`` into the pipeline's UNet / text encoder and set its scale."""
        where = f"generator {self.spec.name!r}"
        lora = self.lora
        host = pipe
        if not hasattr(host, "load_lora_weights"):
            if type(pipe).__name__ != SEMANTIC_PIPELINE:
                raise ConfigError(
                    f"{where}: {type(pipe).__name__} cannot load LoRA weights; remove `lora`"
                )
            # The semantic pipeline has no LoRA loader; a StableDiffusionPipeline that
            # shares its modules loads the adapters into them.
            host = diffusers.StableDiffusionPipeline.from_pipe(pipe)
        name = lora.get("adapter_name") or "debias"
        path = resolve_model_location(str(lora["path"]))
        kwargs: dict[str, Any] = {"adapter_name": name}
        if lora.get("weight_name"):
            kwargs["weight_name"] = lora["weight_name"]
        try:
            host.load_lora_weights(path, **kwargs)
        except Exception as exc:
            raise ModelLoadError(
                f"{where}: could not load the LoRA weights {lora['path']!r} with "
                f"load_lora_weights: {type(exc).__name__}: {exc}"
            ) from exc
        host.set_adapters([name], adapter_weights=[float(lora.get("scale", 1.0))])

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
        """Which call argument carries the registry's ``guidance``: ``true_cfg_scale`` where
        ``guidance_scale`` is missing or defaults to None (Qwen-Image), else
        ``guidance_scale`` (FLUX's distilled guidance; its true_cfg_scale: pipeline_kwargs)."""
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
            if self.semantic is not None and key in SEMANTIC_CALL_ARGS:
                raise ConfigError(
                    f"generator {spec.name!r}: pipeline_kwargs.{key} is set by "
                    f"semantic_guidance; set it there"
                )
            if key not in params:
                raise reject(f"pipeline_kwargs.{key}", key)
            kwargs[key] = value
        if self.semantic is not None:
            for key in SEMANTIC_CALL_ARGS:
                if key in self.semantic:
                    if key not in params:
                        raise reject(f"semantic_guidance.{key}", key)
                    kwargs[key] = self.semantic[key]
        self.unused_settings = self._unused_settings(params, kwargs)
        for key, why in self.unused_settings.items():
            log.warning(
                "generator %r: registry setting `%s` has no effect: %s", spec.name, key, why
            )
        return kwargs

    def _unused_settings(
        self, params: dict[str, inspect.Parameter], kwargs: dict[str, Any]
    ) -> dict[str, str]:
        """Registry settings the pipeline receives but, with the entry's other settings,
        does not act on: {setting: why}, recorded in settings() and logged at load:
        ``negative_prompt`` without classifier-free guidance above 1 (or with a UNet that
        embeds the guidance scale), ``guidance`` as the distilled guidance of a transformer
        without guidance embeddings (FLUX.1-schnell)."""
        pipe = self.pipe
        name = type(pipe).__name__
        unused: dict[str, str] = {}

        def value(arg: str) -> Any:
            if arg in kwargs:
                return kwargs[arg]
            default = params[arg].default if arg in params else None
            return None if default is inspect.Parameter.empty else default

        def above_one(v: Any) -> bool:
            return v is not None and float(v) > 1

        transformer = getattr(pipe, "transformer", None)
        guidance_embeds = getattr(getattr(transformer, "config", None), "guidance_embeds", None)
        unet = getattr(pipe, "unet", None)
        embedded_cfg = getattr(getattr(unet, "config", None), "time_cond_proj_dim", None)
        if self.spec.get("negative_prompt") is not None and "negative_prompt" in params:
            why = None
            # the first guidance the pipeline takes; negative_prompt needs one of its
            # arguments above 1, else the message (of the arguments' values) says why
            guided = (
                (("true_cfg_scale",), lambda v: (
                    f"{name} applies negative_prompt only with true classifier-free guidance, "
                    f"true_cfg_scale > 1; true_cfg_scale is {v[0]} "
                    "(set pipeline_kwargs.true_cfg_scale)"
                )),
                (("guidance_scale",), lambda v: (
                    f"{name} uses negative_prompt only in classifier-free guidance, which runs "
                    f"with guidance_scale > 1; guidance is {v[0]}"
                )),
                (("prior_guidance_scale", "decoder_guidance_scale"), lambda v: (
                    f"{name} uses negative_prompt only where prior_guidance_scale or "
                    f"decoder_guidance_scale is above 1; they are {v[0]} and {v[1]}"
                )),
            )  # fmt: skip
            for args, message in guided:
                if not any(arg in params for arg in args):
                    continue
                values = [value(arg) for arg in args]
                if not any(above_one(v) for v in values):
                    why = message(values)
                elif args == ("guidance_scale",) and embedded_cfg is not None:
                    why = (
                        f"the UNet embeds the guidance scale (time_cond_proj_dim "
                        f"{embedded_cfg}) instead of running classifier-free guidance"
                    )
                break
            if why:
                unused["negative_prompt"] = why
        if (
            self.spec.get("guidance") is not None
            and self._guidance_name == "guidance_scale"
            and "true_cfg_scale" in params
            and guidance_embeds is False
        ):
            unused["guidance"] = (
                f"{name} passes guidance_scale to the transformer only when it has guidance "
                "embeddings; this checkpoint's has none (guidance_embeds: false)"
            )
        return unused

    def _semantic_groups(self, seeds: list[int]) -> list[tuple[list[int], dict[str, Any]]]:
        """Positions of a batch split by the extra call arguments they need: one group
        without randomize_direction, up to two (flipped or not) with it."""
        everyone = list(range(len(seeds)))
        if self.semantic is None or not self.semantic.get("randomize_direction"):
            return [(everyone, {})]
        reverse = self.semantic.get("reverse_editing_direction", False)
        n = len(self.semantic["editing_prompt"])
        reverse = list(reverse) if isinstance(reverse, list) else [bool(reverse)] * n
        groups = []
        for flip in (False, True):
            positions = [i for i in everyone if flip_direction(seeds[i]) == flip]
            if positions:
                direction = [(not r) if flip else bool(r) for r in reverse]
                groups.append((positions, {"reverse_editing_direction": direction}))
        return groups

    # -- Generator protocol ---------------------------------------------------

    def _generator_device(self) -> str:
        return str(getattr(self.pipe, "_execution_device", None) or self.device)

    def _full_prompt(self, prompt: str) -> str:
        prefix = self.spec.get("style_prefix")
        prompt = f"{prefix}, {prompt}" if prefix else prompt
        return apply_prompt_intervention(prompt, self.intervention)

    def prompt_truncation(self, prompts: list[str]) -> list[list[dict[str, Any]]]:
        """Per prompt (as sent: style prefix and intervention added), the text encoders that
        cut it and by how much (stereolens.models.backends.prompt_tokens); [] = none."""
        from stereolens.models.backends import prompt_tokens

        if getattr(self, "_token_limits", None) is None:
            self._token_limits = prompt_tokens.token_limits(self.pipe, self._call_kwargs)
        limits = self._token_limits
        return [prompt_tokens.prompt_truncation(limits, self._full_prompt(p)) for p in prompts]

    def generate(self, prompts: list[str], seeds: list[int]) -> list[Any]:
        """One PIL image per (prompt, seed), made ``batch_size`` at a time."""
        prompts, seeds = list(prompts), list(seeds)
        if len(prompts) != len(seeds):
            raise ValueError(f"got {len(prompts)} prompts but {len(seeds)} seeds")
        negative = self.spec.get("negative_prompt")
        gen_device = self._generator_device()
        images: list[Any] = []
        for start in range(0, len(prompts), self.batch_size):
            all_prompts = [self._full_prompt(p) for p in prompts[start : start + self.batch_size]]
            all_seeds = seeds[start : start + self.batch_size]
            batch_out: list[Any] = [None] * len(all_prompts)
            for positions, extra in self._semantic_groups(all_seeds):
                batch_prompts = [all_prompts[i] for i in positions]
                kwargs = dict(self._call_kwargs)
                kwargs.update(extra)
                kwargs["prompt"] = batch_prompts
                if negative is not None:
                    # A list, not a str: some pipelines insist that prompt and
                    # negative_prompt have the same type.
                    kwargs["negative_prompt"] = [negative] * len(batch_prompts)
                kwargs["generator"] = [
                    torch.Generator(gen_device).manual_seed(int(all_seeds[i])) for i in positions
                ]
                with torch.inference_mode():
                    out = self.pipe(**kwargs)
                batch_images = out.images if hasattr(out, "images") else out[0]
                flagged = getattr(out, "nsfw_content_detected", None)
                if flagged and any(flagged):
                    log.warning(
                        "generator %r: the safety checker (%s) replaced %d of %d images "
                        "with black images",
                        self.spec.name,
                        self.safety_checker,
                        sum(bool(f) for f in flagged),
                        len(flagged),
                    )
                if len(batch_images) != len(batch_prompts):
                    raise RuntimeError(
                        f"{type(self.pipe).__name__} returned {len(batch_images)} images for "
                        f"{len(batch_prompts)} prompts"
                    )
                for i, image in zip(positions, batch_images, strict=True):
                    batch_out[i] = image
            images.extend(batch_out)
        return images

    def settings(self) -> dict[str, Any]:
        """The resolved settings that determine the images."""
        spec = self.spec
        out = {
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
            # the overrides only where set, so models without them keep the same settings
            **({"scheduler_config": dict(self.scheduler_config)} if self.scheduler_config else {}),
            "pipeline_class": type(self.pipe).__name__,
            "pipeline_kwargs": dict(spec.get("pipeline_kwargs") or {}),
            "diffusers_version": diffusers.__version__,
            "torch_version": torch.__version__,
        }
        # Debiasing-variant keys only where set, so a base model's settings (and the
        # outputs recorded with them) do not depend on these keys.
        variant = {
            "variant_of": spec.get("variant_of"),
            "prompt_intervention": dict(self.intervention) if self.intervention else None,
            "semantic_guidance": dict(self.semantic) if self.semantic else None,
            "lora": dict(self.lora) if self.lora else None,
        }
        out.update({k: v for k, v in variant.items() if v is not None})
        # Only where there is something to say, so models without them keep the same settings.
        if self.unused_settings:
            out["unused_settings"] = dict(self.unused_settings)
        if self.safety_checker is not None:
            out["safety_checker"] = self.safety_checker
        return out
