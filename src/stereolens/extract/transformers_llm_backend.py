"""Local text-only language models through Hugging Face transformers (CPU or GPU).

Any checkpoint that loads with ``AutoTokenizer`` and ``AutoModelForCausalLM`` and has a
chat template works, including GGUF files: with the registry key ``gguf_file`` the
weights are read (and dequantised) by transformers' own GGUF loader, so a quantised
llama.cpp checkpoint runs here without llama.cpp. ``model`` may be ``pkg://<package>``,
the folder of an installed Python package that ships the weights (see
:func:`stereolens.registry.resolve_model_location`).

Requests follow the VLM protocol (:class:`stereolens.extract.base.VLMRequest`) without
images: a request with ``image_path`` is a programming error and raises ValueError before
anything is generated. JSON schemas and choices are enforced with xgrammar exactly as in
:mod:`stereolens.extract.transformers_backend` (the same class does the decoding): greedy
requests are batched ``batch_size`` at a time with left padding, sampled requests run one
at a time under their own seed.

Registry settings used: gguf_file, dtype, trust_remote_code, device, batch_size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stereolens.extract.base import VLMRequest
from stereolens.extract.transformers_backend import (
    GrammarConstrainedGeneration,
    _resolve_device,
    _resolve_dtype,
)
from stereolens.registry import ModelSpec, resolve_model_location
from stereolens.validation import ConfigError


class TransformersLLM(GrammarConstrainedGeneration):
    """A local text-only LLM; see the module docstring."""

    backend_label = "transformers-llm"

    def __init__(self, spec: ModelSpec):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.spec = spec
        self.device = _resolve_device(spec.get("device", "auto"))
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
        if gguf_file:
            common["gguf_file"] = gguf_file
        self.tokenizer = AutoTokenizer.from_pretrained(self.location, **common)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.location,
            dtype=_resolve_dtype(spec.get("dtype", "auto")),
            device_map=self.device,  # weights go straight to the device
            **common,
        )
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
        """Raw text per request, in order ("" for a request that failed to generate).

        Raises ValueError, before generating anything, when a request carries an image.
        """
        with_image = [i for i, r in enumerate(requests) if r.image_path]
        if with_image:
            raise ValueError(
                f"{self.backend_label} backend {self.spec.name!r} is text-only, but "
                f"{len(with_image)} request(s) carry an image (first: index {with_image[0]}, "
                f"{requests[with_image[0]].image_path}); use a registry entry under `vlms:`"
            )
        return super().answer(requests)
