"""Architecture twins of InternVL3 and InternVL3.5 in the -hf layout (OpenGVLab's
conversions to transformers' native ``InternVLForConditionalGeneration``, which the
registry names): the shared pieces of :mod:`.language` (a 2-layer decoder of the
family, the tokenizer trained here, ``save_pretrained``), InternViT, the image
processor's tiling and InternVLProcessor's settings file. Its processor needs
torchvision (its video processor), so without it these twins run at the model level
(:mod:`.model_level`)."""

from __future__ import annotations

import json
from pathlib import Path

from stereolens.models.tiny.twins import tokenizers as toks
from stereolens.models.tiny.twins.language import _generation_defaults, _save, _seeded, _text

INTERNVL_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}<IMG_CONTEXT>\n"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
"""ChatML with InternVL's image placeholder, which InternVLProcessor expands to
``<img>`` + ``<IMG_CONTEXT>`` x (tokens per tile x tiles) + ``</img>``."""

INTERNVL_IMAGE_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
"""The named tokens of the -hf checkpoints' tokenizers (InternVLProcessor reads them)."""

INTERNVL_IMAGE = 56
INTERNVL_PATCH = 14
INTERNVL_MAX_TILES = 4
INTERNVL_TILE_TOKENS = (INTERNVL_IMAGE // INTERNVL_PATCH) ** 2 // 4
"""Image tokens per tile: the patch grid after the 2x2 pixel shuffle (downsample 0.5)."""


def _build_internvl(out_dir: Path, seed: int, text_family: str) -> None:
    """InternVL3 / InternVL3.5 in the -hf layout: InternViT (CLS token, layer scale),
    2x2 pixel shuffle, MLP projector, and a Qwen2 (InternVL3) or Qwen3 (InternVL3.5)
    decoder; images tiled to the closest aspect ratio plus a thumbnail."""
    import tempfile

    from transformers import (
        GotOcr2ImageProcessorPil,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLVisionConfig,
        Qwen2Config,
        Qwen2Tokenizer,
        Qwen3Config,
    )

    tokenizer = toks.qwen2_tokenizer(extra_special=tuple(INTERNVL_IMAGE_TOKENS.values()))
    with tempfile.TemporaryDirectory() as tmp:  # named tokens are set at load time
        tokenizer.save_pretrained(tmp)
        tokenizer = Qwen2Tokenizer.from_pretrained(tmp, extra_special_tokens=INTERNVL_IMAGE_TOKENS)
    tokenizer.chat_template = INTERNVL_TEMPLATE
    ids = tokenizer.convert_tokens_to_ids
    family = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}[text_family]
    text = _text(family, tokenizer, eos_token_id=ids("<|im_end|>"), rope_theta=1000000.0)
    vision = InternVLVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=1,
        image_size=INTERNVL_IMAGE,
        patch_size=INTERNVL_PATCH,
        attention_bias=True,
        use_qk_norm=False,
        norm_type="layer_norm",
    )
    config = InternVLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=ids("<IMG_CONTEXT>"),
        image_seq_length=INTERNVL_TILE_TOKENS,
        downsample_ratio=0.5,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=False,
    )
    _seeded(seed)
    model = InternVLForConditionalGeneration(config).eval()
    _generation_defaults(model, tokenizer, "<|im_end|>")
    image_processor = GotOcr2ImageProcessorPil(
        size={"height": INTERNVL_IMAGE, "width": INTERNVL_IMAGE},
        crop_to_patches=True,
        min_patches=1,
        max_patches=INTERNVL_MAX_TILES,
    )
    _save(out_dir, model, tokenizer, image_processor)
    # InternVLProcessor's settings as the -hf repositories' processor_config.json holds
    # them (the processor itself needs torchvision for its video processor, see above)
    processor_config = {
        "processor_class": "InternVLProcessor",
        "image_seq_length": INTERNVL_TILE_TOKENS,
    }
    (out_dir / "processor_config.json").write_text(
        json.dumps(processor_config, indent=2) + "\n", encoding="utf-8"
    )


def build_internvl3(out_dir: Path, seed: int = 0) -> None:
    """InternVL3-8B-hf: InternViT-300M, Qwen2.5 decoder."""
    _build_internvl(out_dir, seed, "qwen2")


def build_internvl35(out_dir: Path, seed: int = 0) -> None:
    """InternVL3_5-8B-HF: InternViT-300M, Qwen3 decoder."""
    _build_internvl(out_dir, seed, "qwen3")
