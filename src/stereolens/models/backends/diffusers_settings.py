"""What a registry entry's settings mean for a diffusers pipeline: known settings, device and
dtype, scheduler, semantic-guidance arguments and deprecated component libraries.
Imports torch and diffusers; only the diffusers backend imports it."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import types
from typing import Any

import diffusers
import torch
from packaging.version import Version

from stereolens.models.registry import REGISTRY_SCHEMA, ModelSpec
from stereolens.validation import ConfigError, parse_yaml

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """from_pretrained failed; the message names the registry entry and the model."""


def known_settings() -> set[str]:
    """Setting keys of a generator registry entry, as the registry schema defines them."""
    schema = parse_yaml(REGISTRY_SCHEMA.read_text(encoding="utf-8"))
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

SEMANTIC_PIPELINE = "SemanticStableDiffusionPipeline"

# semantic_guidance keys that are call arguments of SemanticStableDiffusionPipeline.
SEMANTIC_CALL_ARGS = (
    "editing_prompt",
    "reverse_editing_direction",
    "edit_guidance_scale",
    "edit_warmup_steps",
    "edit_cooldown_steps",
    "edit_threshold",
    "edit_momentum_scale",
    "edit_mom_beta",
    "edit_weights",
)
# Of those, the ones that may be one value per editing prompt.
_PER_CONCEPT = (
    "reverse_editing_direction",
    "edit_guidance_scale",
    "edit_warmup_steps",
    "edit_cooldown_steps",
    "edit_threshold",
    "edit_weights",
)
# Checkpoints (model_index.json _class_name) the semantic pipeline can load.
_SEMANTIC_COMPATIBLE = {"StableDiffusionPipeline", SEMANTIC_PIPELINE}

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# diffusers 0.42 renamed from_pretrained's `torch_dtype` to `dtype` (the old name
# still works there, with a deprecation warning); older releases know only `torch_dtype`.
_DTYPE_KWARG = "dtype" if Version(diffusers.__version__).release >= (0, 42) else "torch_dtype"


def resolve_dtype(dtype: str | None, device: str) -> torch.dtype:
    """Registry dtype name -> torch dtype; "auto": docs/adding-a-model.md."""
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


def resolve_scheduler(value: Any, where: str) -> tuple[type | None, dict[str, Any]]:
    """The registry's ``scheduler`` setting as (diffusers scheduler class, config
    overrides); (None, {}) when unset. A class name is the short form of
    ``{class: <name>}``. Raises ConfigError for an unknown class or a config key that is
    not an argument of the class."""
    if value is None:
        return None, {}
    if isinstance(value, str):
        value = {"class": value}
    if not isinstance(value, dict) or not isinstance(value.get("class"), str):
        raise ConfigError(
            f"{where}: setting scheduler must be a class name or a mapping "
            "{class: <name>, config: {...}}, not " + repr(value)
        )
    unknown = sorted(set(value) - {"class", "config"})
    if unknown:
        raise ConfigError(f"{where}: setting scheduler has unknown key(s) {', '.join(unknown)}")
    name = value["class"]
    cls = getattr(diffusers, name, None)
    if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
        known = sorted(
            n
            for n in dir(diffusers)
            if n.endswith("Scheduler") and not n.startswith("_") and n != "SchedulerMixin"
        )
        raise ConfigError(
            f"{where}: setting scheduler class {name!r} is not a scheduler class in diffusers "
            f"{diffusers.__version__}; known: {', '.join(known)}"
        )
    config = value.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: setting scheduler.config must be a mapping")
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        accepted = sorted(n for n in params if n != "self")
        bad = sorted(set(config) - set(accepted))
        if bad:
            raise ConfigError(
                f"{where}: setting scheduler.config has key(s) {', '.join(bad)} that "
                f"{name} does not take; accepted: {', '.join(accepted)}"
            )
    return cls, dict(config)


def flip_direction(seed: int) -> bool:
    """randomize_direction: whether the image with this seed gets its editing directions
    flipped. A fair coin drawn from a hash of the seed (not from torch's generator, which
    makes the image's noise)."""
    digest = hashlib.sha256(f"stereolens-fair-guidance:{int(seed)}".encode()).digest()
    return bool(digest[0] & 1)


def _check_semantic(value: Any, where: str) -> dict[str, Any]:
    """The semantic_guidance setting, checked (the schema checks types; this the lengths)."""
    if not isinstance(value, dict) or not value.get("editing_prompt"):
        raise ConfigError(f"{where}: semantic_guidance needs a non-empty editing_prompt list")
    unknown = sorted(set(value) - set(SEMANTIC_CALL_ARGS) - {"randomize_direction"})
    if unknown:
        raise ConfigError(f"{where}: semantic_guidance has unknown key(s) {', '.join(unknown)}")
    concepts = value["editing_prompt"]
    if isinstance(concepts, str):
        concepts = [concepts]
    out = dict(value)
    out["editing_prompt"] = list(concepts)
    for key in _PER_CONCEPT:
        v = out.get(key)
        if isinstance(v, list) and len(v) != len(concepts):
            raise ConfigError(
                f"{where}: semantic_guidance.{key} has {len(v)} values for "
                f"{len(concepts)} editing prompts"
            )
    return out


def _model_index(spec: ModelSpec) -> dict[str, Any]:
    """The checkpoint's model_index.json (local or cached), {} where it cannot be read."""
    try:
        return diffusers.DiffusionPipeline.load_config(spec.model, revision=spec.revision)
    except Exception:  # noqa: BLE001 - from_pretrained will report the real problem
        return {}


def _checkpoint_class(spec: ModelSpec) -> str | None:
    """model_index.json's _class_name of the checkpoint, or None."""
    return _model_index(spec).get("_class_name")


def alias_deprecated_libraries(spec: ModelSpec, where: str) -> dict[str, str]:
    """Make the checkpoint's ``model_index.json`` libraries that diffusers has moved to
    ``pipelines/deprecated/`` loadable again (Stable Cascade's VQGAN ``["wuerstchen",
    "PaellaVQModel"]`` since diffusers 0.42): a module with the class and diffusers' base
    classes is registered in ``sys.modules`` under the old name, where diffusers looks it up
    (never replacing a module already imported under it). Returns {library name: the module
    its classes now come from}."""
    aliased: dict[str, str] = {}
    for name, value in _model_index(spec).items():
        if name.startswith("_") or not (isinstance(value, list) and len(value) == 2):
            continue
        library, class_name = value
        if not (
            isinstance(library, str) and library.isidentifier() and isinstance(class_name, str)
        ):
            continue
        if library in ("diffusers", "transformers") or hasattr(diffusers.pipelines, library):
            continue
        module_name = f"diffusers.pipelines.deprecated.{library}"
        try:
            found = importlib.util.find_spec(module_name) is not None
        except (ImportError, ValueError):
            found = False
        cls = getattr(importlib.import_module(module_name), class_name, None) if found else None
        if cls is None:
            continue
        alias = sys.modules.get(library)
        if alias is None:
            alias = types.ModuleType(library, f"stereolens: {module_name} under its old name")
            alias.__stereolens_alias__ = module_name
            for base in ("ModelMixin", "SchedulerMixin", "ConfigMixin", "DiffusionPipeline"):
                setattr(alias, base, getattr(diffusers, base))
            sys.modules[library] = alias
        if getattr(alias, "__stereolens_alias__", None) != module_name:
            continue  # a real module of that name: diffusers uses it as it is
        setattr(alias, class_name, cls)
        aliased[library] = module_name
        log.info("%s: model_index.json library %r resolved as %s", where, library, module_name)
    return aliased


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
