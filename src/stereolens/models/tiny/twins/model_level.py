"""Running a VLM twin whose processor cannot be built here (Qwen2.5-VL, LLaVA-OneVision,
InternVL in transformers 5.x without torchvision): the real image processor, the chat
template, and the model itself telling how many placeholder tokens each image needs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from stereolens.models.backends import resolve_device
from stereolens.models.backends.transformers_backend import (
    GrammarConstrainedGeneration,
    TransformersVLM,
    _resolve_dtype,
)
from stereolens.models.requests import VLMRequest

logger = logging.getLogger(__name__)


def processor_loads(path: str | Path) -> bool:
    """Whether ``AutoProcessor`` can load the folder here (False for the Qwen2.5-VL and
    LLaVA-OneVision twins without torchvision)."""
    from transformers import AutoProcessor

    try:
        AutoProcessor.from_pretrained(str(path))
    except (TypeError, ValueError, ImportError, OSError) as exc:
        logger.info("AutoProcessor cannot load %s: %s", path, exc)
        return False
    return True


class ModelLevelVLM(GrammarConstrainedGeneration):
    """A VLM twin whose processor class cannot be built here: the transformers backend's
    decoding and settings, but each image placeholder of the chat template is repeated as
    many times as the model's own ``get_image_features`` returns vectors for the image."""

    backend_label = "transformers (model level)"

    def __init__(self, spec):
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

        self.spec = spec
        self.device = resolve_device(spec.get("device", "auto"))
        self.batch_size = int(spec.get("batch_size", 1) or 1)
        self.image_max_side = spec.get("image_max_side")
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model)
        self.tokenizer.padding_side = "left"
        self.image_processor = AutoImageProcessor.from_pretrained(spec.model)
        self.model = AutoModelForImageTextToText.from_pretrained(
            spec.model, dtype=_resolve_dtype(spec.get("dtype", "auto")), device_map=self.device
        ).eval()
        config = self.model.config
        token_id = getattr(config, "image_token_id", None)
        if token_id is None:
            token_id = getattr(config, "image_token_index", None)
        self.image_token = self.tokenizer.convert_ids_to_tokens(int(token_id))
        # InternVL's processor writes an image's tokens between <img> and </img> (its
        # tokenizer names them); the other families' templates hold their markers
        self.image_open = getattr(self.tokenizer, "start_image_token", None) or ""
        self.image_close = getattr(self.tokenizer, "end_image_token", None) or ""
        self._setup_decoding()

    _messages = TransformersVLM._messages

    def _features_per_image(self, pixel_inputs: dict[str, Any], tiles=None) -> list[int]:
        import torch

        with torch.inference_mode():
            out = self.model.get_image_features(**pixel_inputs)
        features = getattr(out, "pooler_output", out)
        if tiles is not None:
            # InternVL: one row of tokens per tile, ``tiles`` tiles per image
            return [int(n) * int(features.shape[1]) for n in tiles]
        if isinstance(features, torch.Tensor):
            # one flat tensor of every image's tokens (Qwen2.5-VL): split by grid size
            grid = pixel_inputs.get("image_grid_thw")
            merge = self.image_processor.merge_size**2
            return [int(g.prod()) // merge for g in grid]
        return [int(f.shape[0]) if f.dim() == 2 else int(f.shape[0] * f.shape[1]) for f in features]

    def _encode(self, requests: list[VLMRequest]):
        from stereolens.images import load_image

        texts = [
            self.tokenizer.apply_chat_template(
                self._messages(r), tokenize=False, add_generation_prompt=True
            )
            for r in requests
        ]
        images = [load_image(r.image_path, self.image_max_side) for r in requests if r.image_path]
        pixel_inputs: dict[str, Any] = {}
        if images:
            processed = dict(self.image_processor(images=images, return_tensors="pt"))
            tiles = processed.pop("num_patches", None)  # InternVL's tiles per image
            pixel_inputs = {
                k: v.to(self.model.device) for k, v in processed.items() if hasattr(v, "to")
            }
            if "pixel_values" in pixel_inputs:
                pixel_inputs["pixel_values"] = pixel_inputs["pixel_values"].to(self.model.dtype)
            counts = iter(self._features_per_image(pixel_inputs, tiles))
            expanded = []
            for text in texts:
                pieces = text.split(self.image_token)
                out = pieces[0]
                for rest in pieces[1:]:
                    tokens = self.image_token * next(counts)
                    out += self.image_open + tokens + self.image_close + rest
                expanded.append(out)
            texts = expanded
        inputs = self.tokenizer(texts, padding=True, add_special_tokens=False, return_tensors="pt")
        inputs = {k: v.to(self.model.device) for k, v in inputs.items()}
        inputs.update(pixel_inputs)
        return inputs
