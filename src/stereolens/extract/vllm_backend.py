"""Vision-language models on the vLLM offline engine (GPU), and the request
builders shared with the OpenAI-compatible HTTP backend.

The request side is pure and testable without vLLM:

* :func:`build_vllm_messages` turns a :class:`VLMRequest` into OpenAI-style chat
  messages, the image as a base64 ``data:`` URL in an ``image_url`` part (the
  format both ``LLM.chat`` and any OpenAI-compatible server accept);
* :func:`build_sampling_kwargs` turns it into sampling settings plus a plain
  description of the structured-output constraint (``{"json": schema}`` or
  ``{"choice": [...]}``).

Only :func:`to_sampling_params` and :class:`VLLMVLM` import vLLM, lazily. vLLM
0.12 removed ``GuidedDecodingParams``/``guided_decoding=`` in favour of
``StructuredOutputsParams``/``structured_outputs=``; both are supported by
feature detection.
"""

from __future__ import annotations

import base64
import inspect
import io
import logging
from pathlib import Path
from typing import Any

from stereolens.extract.base import VLMRequest
from stereolens.images import ImageUnreadable, load_image
from stereolens.models.ask import BackendFailure, ItemFailure, out_of_memory_errors
from stereolens.registry import ModelSpec

logger = logging.getLogger(__name__)

_MIME = {"PNG": "image/png", "JPEG": "image/jpeg"}


# -------------------------------------------------------------------- images


def image_data_url(path: str | Path, max_side: int | None = None) -> str:
    """The image as a ``data:`` URL.

    A PNG or JPEG that needs no downscaling is sent byte for byte (exactly what
    was generated); anything else is converted (and downscaled) to PNG.
    """
    from PIL import Image

    path = Path(path)
    try:
        with Image.open(path) as im:
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


def build_sampling_kwargs(request: VLMRequest, spec: ModelSpec | None = None) -> dict[str, Any]:
    """Sampling settings for one request, as plain data.

    Keys: temperature, seed, max_tokens, and structured_outputs, which is
    ``{"json": schema}``, ``{"choice": [...]}`` or None (free text). The request
    carries everything that changes the answer; ``spec`` is accepted for
    backend-wide settings and currently changes nothing.
    """
    del spec
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
    """vllm.SamplingParams from :func:`build_sampling_kwargs` output (imports vLLM).

    JSON is requested compact (``disable_any_whitespace``) where vLLM takes the
    flag, as the transformers backend does: free whitespace lets a model pad
    an answer until it is truncated.
    """
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


# -------------------------------------------------------------------- backend
class VLLMVLM:
    """A VLM on the vLLM offline engine; one ``LLM.chat`` call per ``answer``."""

    def __init__(self, spec: ModelSpec):
        from vllm import LLM

        self.spec = spec
        self.image_max_side = spec.get("image_max_side")
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
        self.llm = LLM(**kwargs)

    def _prepare(self, request: VLMRequest):
        return (
            build_vllm_messages(request, self.image_max_side),
            to_sampling_params(build_sampling_kwargs(request, self.spec)),
        )

    def _chat(self, conversations: list, params: list) -> list[str]:
        outputs = self.llm.chat(conversations, sampling_params=params, use_tqdm=False)
        return [o.outputs[0].text if o.outputs else "" for o in outputs]

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
            except oom:
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
