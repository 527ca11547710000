"""Vision-language models on the vLLM offline engine, and the pure request builders shared with
the OpenAI-compatible backend; only :func:`to_sampling_params` and :class:`VLLMVLM` import vLLM
(engine settings found by running it: docs/vllm.md)."""

from __future__ import annotations

import base64
import dataclasses
import inspect
import io
import logging
import os
from pathlib import Path
from typing import Any

from stereolens.images import ImageUnreadable, load_image
from stereolens.models.ask import BODY_PREVIEW, BackendFailure, ItemFailure, out_of_memory_errors
from stereolens.models.registry import ModelSpec
from stereolens.models.requests import VLMRequest

logger = logging.getLogger(__name__)

_MIME = {"PNG": "image/png", "JPEG": "image/jpeg"}

STRUCTURED_OUTPUTS_CONFIG = {"backend": "xgrammar", "disable_any_whitespace": True}
"""Engine-wide structured-output settings (registry ``structured_outputs_config``)."""

CPU_KVCACHE_SPACE_GB = 1
"""KV cache of a CPU engine (GiB) where neither the entry nor the environment sets one."""


# -------------------------------------------------------------------- images


def image_data_url(path: str | Path, max_side: int | None = None) -> str:
    """The image as a ``data:`` URL: a PNG or JPEG that needs no downscaling byte for byte,
    anything else as (downscaled) PNG. Decoded in full first, so a truncated file fails its
    own request here rather than the engine's whole batch."""
    from PIL import Image

    path = Path(path)
    try:
        with Image.open(path) as im:
            im.load()
            fmt, size = im.format, im.size
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageUnreadable(f"image {path} cannot be read: {type(exc).__name__}: {exc}") from exc
    if fmt in _MIME and not (max_side and max(size) > max_side):
        data, mime = path.read_bytes(), _MIME[fmt]
    else:
        buf = io.BytesIO()
        load_image(path, max_side).save(buf, format="PNG")
        data, mime = buf.getvalue(), "image/png"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


# -------------------------------------------------------------------- requests
def build_vllm_messages(
    request: VLMRequest, image_max_side: int | None = None
) -> list[dict[str, Any]]:
    """OpenAI-style chat messages for one single-turn request (no history)."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    content: list[dict[str, Any]] = []
    if request.image_path:
        content.append(
            {
                "type": "image_url",
                "image_url": {"url": image_data_url(request.image_path, image_max_side)},
            }
        )
    content.append({"type": "text", "text": request.text})
    messages.append({"role": "user", "content": content})
    return messages


def build_sampling_kwargs(request: VLMRequest) -> dict[str, Any]:
    """Sampling settings for one request, as plain data: temperature, seed, max_tokens, and
    structured_outputs, which is ``{"json": schema}``, ``{"choice": [...]}`` or None (free
    text)."""
    if request.json_schema is not None and request.choices is not None:
        raise ValueError("a request constrains its answer by json_schema or choices, not both")
    constraint: dict[str, Any] | None = None
    if request.json_schema is not None:
        constraint = {"json": request.json_schema}
    elif request.choices is not None:
        constraint = {"choice": list(request.choices)}
    return {
        "temperature": float(request.temperature),
        "seed": request.seed,
        "max_tokens": int(request.max_new_tokens),
        "structured_outputs": constraint,
    }


def _accepts(cls: Any, name: str) -> bool:
    try:
        return name in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def to_sampling_params(kwargs: dict[str, Any]):
    """vllm.SamplingParams from :func:`build_sampling_kwargs` output (imports vLLM); JSON
    compact (``disable_any_whitespace``) where vLLM takes the flag, as in the transformers
    backend."""
    import vllm.sampling_params as sp

    kwargs = dict(kwargs)
    constraint = kwargs.pop("structured_outputs", None)
    if constraint:
        if hasattr(sp, "StructuredOutputsParams"):  # current vLLM (guided_* removed in 0.12)
            cls, field = sp.StructuredOutputsParams, "structured_outputs"
        else:  # older vLLM
            cls, field = sp.GuidedDecodingParams, "guided_decoding"
        constraint = dict(constraint)
        if "json" in constraint and _accepts(cls, "disable_any_whitespace"):
            constraint["disable_any_whitespace"] = True
        kwargs[field] = cls(**constraint)
    return sp.SamplingParams(**kwargs)


# -------------------------------------------------------------------- engine
def engine_kwargs(
    spec: ModelSpec, on_cpu: bool = False, accepted: frozenset[str] | None = None
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for a registry entry. ``on_cpu``: vLLM's CPU
    platform (eager, no chunked prefill by default); ``accepted``: the engine arguments this
    vLLM knows (None = all): chunked prefill and structured outputs only where it has them."""
    kwargs: dict[str, Any] = {
        "model": spec.model,
        "revision": spec.revision,
        "dtype": spec.get("dtype", "auto"),
        "trust_remote_code": bool(spec.get("trust_remote_code", False)),
        "tensor_parallel_size": int(spec.get("tensor_parallel_size", 1)),
        "gpu_memory_utilization": float(spec.get("gpu_memory_utilization", 0.9)),
        "limit_mm_per_prompt": {"image": int(spec.get("limit_mm_per_prompt", 1))},
    }
    if spec.get("max_model_len") is not None:
        kwargs["max_model_len"] = int(spec.get("max_model_len"))
    if spec.get("seed") is not None:
        kwargs["seed"] = int(spec.get("seed"))
    eager = spec.get("enforce_eager")
    if eager is None and on_cpu:
        eager = True
    if eager is not None:
        kwargs["enforce_eager"] = bool(eager)
    chunked = spec.get("enable_chunked_prefill")
    if chunked is None and on_cpu:
        chunked = False
    if chunked is not None and (accepted is None or "enable_chunked_prefill" in accepted):
        kwargs["enable_chunked_prefill"] = bool(chunked)
        if not chunked and kwargs.get("max_model_len"):
            # whole prompts only: a step must hold the longest one
            kwargs["max_num_batched_tokens"] = kwargs["max_model_len"]
    structured = spec.get("structured_outputs_config", STRUCTURED_OUTPUTS_CONFIG)
    if structured and (accepted is None or "structured_outputs_config" in accepted):
        kwargs["structured_outputs_config"] = dict(structured)
    return kwargs


def cpu_kvcache_space_gb(spec: ModelSpec, environ: dict[str, str] | None = None) -> float:
    """KV-cache size (GiB) of a CPU engine: the entry's ``cpu_kvcache_space_gb``, else the
    environment's ``VLLM_CPU_KVCACHE_SPACE``, else CPU_KVCACHE_SPACE_GB."""
    environ = os.environ if environ is None else environ
    value = spec.get("cpu_kvcache_space_gb")
    if value is None:
        value = environ.get("VLLM_CPU_KVCACHE_SPACE") or CPU_KVCACHE_SPACE_GB
    return float(value)


def set_cpu_kvcache_space(spec: ModelSpec) -> None:
    """Set ``VLLM_CPU_KVCACHE_SPACE`` for the engine this process is about to start
    (vLLM reads it in the engine's own process, which inherits the environment)."""
    gb = cpu_kvcache_space_gb(spec)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(gb)) if gb == int(gb) else str(gb)


def _cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _engine_arg_names() -> frozenset[str] | None:
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return None
    return frozenset(f.name for f in dataclasses.fields(EngineArgs))


# -------------------------------------------------------------------- backend
class VLLMVLM:
    """A VLM on the vLLM offline engine; one ``LLM.chat`` call per ``answer``."""

    def __init__(self, spec: ModelSpec):
        from vllm import LLM

        self.spec = spec
        self.image_max_side = spec.get("image_max_side")
        on_cpu = _cpu_platform()
        if on_cpu:
            set_cpu_kvcache_space(spec)
        self.engine_kwargs = engine_kwargs(spec, on_cpu=on_cpu, accepted=_engine_arg_names())
        logger.info("vllm backend %s: engine %s", spec.name, self.engine_kwargs)
        self.llm = LLM(**self.engine_kwargs)

    def _prepare(self, request: VLMRequest):
        return (
            build_vllm_messages(request, self.image_max_side),
            to_sampling_params(build_sampling_kwargs(request)),
        )

    def _chat(self, conversations: list, params: list) -> list[str]:
        """The engine's texts; a malformed output (another count, an output that is not
        a text) is a retried BackendFailure naming the engine and quoting the output."""
        outputs = list(self.llm.chat(conversations, sampling_params=params, use_tqdm=False))
        where = f"vllm backend {self.spec.name} ({self.spec.model})"
        if len(outputs) != len(conversations):
            raise BackendFailure(
                f"{where}: malformed response: {len(outputs)} outputs for "
                f"{len(conversations)} requests: {repr(outputs)[:BODY_PREVIEW]}",
                retry_in_job=True,
            )
        texts = []
        for o in outputs:
            choices = getattr(o, "outputs", None)
            text = getattr(choices[0], "text", None) if choices else ""
            if not isinstance(text, str):
                raise BackendFailure(
                    f"{where}: malformed response: an output without a text: "
                    f"{repr(o)[:BODY_PREVIEW]}",
                    retry_in_job=True,
                )
            texts.append(text)
        return texts

    def answer(self, requests: list[VLMRequest]) -> list[str | ItemFailure]:
        """One raw text per request. An image that cannot be read, or a request the
        engine rejects (ValueError: e.g. a prompt longer than max_model_len), loses only
        its own item (ItemFailure); a batch that fails is asked again one request at a
        time; any other engine error fails the job (BackendFailure, never an answer)."""
        out: list[str | ItemFailure] = [""] * len(requests)
        ready: list[int] = []
        conversations, params = [], []
        for i, request in enumerate(requests):
            try:
                messages, sampling = self._prepare(request)
            except ImageUnreadable as exc:  # an unreadable image loses only its own item
                logger.error("vllm backend %s: request %d: %s", self.spec.name, i, exc)
                out[i] = ItemFailure(str(exc))
                continue
            ready.append(i)
            conversations.append(messages)
            params.append(sampling)
        if not ready:
            return out
        oom = out_of_memory_errors()
        try:
            for i, text in zip(ready, self._chat(conversations, params), strict=True):
                out[i] = text
            return out
        except oom:
            raise
        except Exception as exc:
            logger.warning(
                "vllm backend %s: batch of %d failed (%s: %s); one at a time",
                self.spec.name,
                len(ready),
                type(exc).__name__,
                exc,
            )
        for k, i in enumerate(ready):
            try:
                out[i] = self._chat([conversations[k]], [params[k]])[0]
            except (*oom, BackendFailure):
                raise
            except ValueError as exc:
                logger.error("vllm backend %s: request %d rejected: %s", self.spec.name, i, exc)
                out[i] = ItemFailure(f"rejected by vLLM: {exc}")
            except Exception as exc:
                raise BackendFailure(
                    f"vllm backend {self.spec.name}: {type(exc).__name__}: {exc}",
                    retry_in_job=False,
                ) from exc
        return out
