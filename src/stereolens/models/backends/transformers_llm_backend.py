"""Local text-only language models through Hugging Face transformers (CPU or GPU), GGUF files
included, constrained as the VLM backend is (docs/adding-a-model.md, "The backends in detail")."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from stereolens.ids import sha256_file
from stereolens.models.backends import resolve_device
from stereolens.models.backends.transformers_backend import (
    GrammarConstrainedGeneration,
    _resolve_dtype,
)
from stereolens.models.registry import ModelSpec, resolve_model_location
from stereolens.models.requests import VLMRequest
from stereolens.validation import ConfigError

logger = logging.getLogger(__name__)


def gguf_cache_dir(location: str, gguf_file: str, dtype: str) -> Path | None:
    """Where the dequantised copy of a local GGUF checkpoint is kept (it loads in a second,
    the GGUF in tens): ``$STEREOLENS_CACHE`` (default ``~/.cache/stereolens``)/gguf/<sha256
    of the file>-<dtype>; None for hub ids or when STEREOLENS_CACHE is "off"."""
    root = os.environ.get("STEREOLENS_CACHE", str(Path.home() / ".cache" / "stereolens"))
    path = Path(location) / gguf_file
    if root == "off" or not path.is_file():
        return None
    return Path(root) / "gguf" / f"{sha256_file(path)[:24]}-{dtype}"


def save_converted(model, tokenizer, target: Path) -> None:
    """Save a dequantised model and its tokenizer to ``target`` atomically (written to a
    temporary sibling folder, then renamed); a failure only costs the next load's time."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        # GGUF weights are dequantised on load; transformers still marks the model as
        # quantised and refuses to save it. The copy saved here is the plain float model.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)
    except (OSError, ValueError) as exc:
        logger.warning("GGUF conversion cache not written to %s (%s)", target, exc)
        shutil.rmtree(tmp, ignore_errors=True)


class TransformersLLM(GrammarConstrainedGeneration):
    """A local text-only LLM; see docs/adding-a-model.md."""

    backend_label = "transformers-llm"

    def __init__(self, spec: ModelSpec):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.spec = spec
        self.device = resolve_device(spec.get("device", "auto"))
        self.batch_size = int(spec.get("batch_size", 1) or 1)
        trust = bool(spec.get("trust_remote_code", False))
        # where the weights are read from: `model` with pkg:// resolved
        self.location = resolve_model_location(spec.model)
        gguf_file = spec.get("gguf_file")
        if gguf_file and Path(self.location).is_dir():
            if not (Path(self.location) / gguf_file).is_file():
                raise ConfigError(
                    f"model {spec.name!r}: gguf_file {gguf_file!r} is not in {self.location}; "
                    f"files there: {sorted(p.name for p in Path(self.location).glob('*.gguf'))}"
                )
        common: dict[str, Any] = {"revision": spec.revision, "trust_remote_code": trust}
        dtype = _resolve_dtype(spec.get("dtype", "auto"))
        converted = None
        if gguf_file:
            converted = gguf_cache_dir(self.location, gguf_file, spec.get("dtype", "auto"))
            if converted is not None and (converted / "config.json").is_file():
                location = str(converted)  # dequantised once before: load it directly
            else:
                location = self.location
                common["gguf_file"] = gguf_file
        else:
            location = self.location
        self.tokenizer = AutoTokenizer.from_pretrained(location, **common)
        self.model = AutoModelForCausalLM.from_pretrained(
            location,
            dtype=dtype,
            device_map=self.device,  # weights go straight to the device
            **common,
        )
        if converted is not None and "gguf_file" in common:
            save_converted(self.model, self.tokenizer, converted)
        self.model.eval()
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(
                f"model {spec.name!r} ({spec.model}): the tokenizer has no chat template; "
                "use an instruction-tuned (chat) checkpoint"
            )
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._setup_decoding()

    def __repr__(self) -> str:
        return f"TransformersLLM({self.spec.name!r}, model={self.spec.model!r})"

    # ---------------------------------------------------------------- prompts
    @staticmethod
    def messages(request: VLMRequest) -> list[dict[str, str]]:
        """The chat of one request: optional system turn, one user turn (plain strings,
        which every text-only chat template accepts)."""
        messages = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.append({"role": "user", "content": request.text})
        return messages

    def prompt_text(self, request: VLMRequest) -> str:
        """The chat-templated prompt, ending where the assistant's answer starts."""
        return self.tokenizer.apply_chat_template(
            self.messages(request), tokenize=False, add_generation_prompt=True
        )

    def _encode(self, requests: list[VLMRequest]):
        texts = [self.prompt_text(r) for r in requests]
        # The chat template already holds the special tokens (BOS, turn markers).
        inputs = self.tokenizer(texts, padding=True, add_special_tokens=False, return_tensors="pt")
        return inputs.to(self.model.device)

    # ---------------------------------------------------------------- protocol
    def answer(self, requests: list[VLMRequest]) -> list[str]:
        """Raw text per request, in order; ValueError, before generating anything, when a
        request carries an image."""
        with_image = [i for i, r in enumerate(requests) if r.image_path]
        if with_image:
            raise ValueError(
                f"{self.backend_label} backend {self.spec.name!r} is text-only, but "
                f"{len(with_image)} request(s) carry an image (first: index {with_image[0]}, "
                f"{requests[with_image[0]].image_path}); use a registry entry under `vlms:`"
            )
        return super().answer(requests)
