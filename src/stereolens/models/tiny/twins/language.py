"""Architecture twins of the registry's VLMs and LLMs: tiny random-weight models of the same
transformers classes, with a tokenizer trained here, the family's image processor and chat
template (the classes and their limits: docs/twins.md, "How the twins are built")."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from stereolens.models.tiny.twins import tokenizers as toks
from stereolens.models.tiny.twins.diffusion import _seeded
from stereolens.models.tiny.vlm import (
    HUB_VISION_PREFIX,
    chatml_template,
    hub_layout,
    llava_processor,
)

logger = logging.getLogger(__name__)

HIDDEN = 64
HEADS = 2
HEAD_DIM = 32


def _text(family_config, tokenizer, **extra: Any):
    """A 2-layer decoder config of the family: 64 wide, 2 heads of 32, 1 KV head."""
    ids = dict(
        bos_token_id=tokenizer.bos_token_id
        if tokenizer.bos_token_id is not None
        else tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    base = dict(_decoder(tokenizer), head_dim=HEAD_DIM, max_position_embeddings=32768)
    return family_config(**{**base, **ids, **extra})


def _decoder(tokenizer) -> dict[str, Any]:
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )


def _vision(family_config, image_size: int, patch_size: int, **extra: Any):
    """A 2-layer vision tower config of the family (CLIP, SigLIP): 32 wide, 1 head."""
    return family_config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=1,
        image_size=image_size,
        patch_size=patch_size,
        **extra,
    )


def _model(model_class, config, seed: int, tokenizer, eos: str):
    """``model_class(config)`` with weights drawn from ``seed``, in eval mode, ending a
    generation at ``eos`` and padding with the tokenizer's pad token."""
    _seeded(seed)
    model = model_class(config).eval()
    eos_id = tokenizer.convert_tokens_to_ids(eos)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = eos_id
    return model


def _save(
    out_dir: Path,
    model,
    tokenizer,
    image_processor=None,
    processor=None,
    rename: tuple[str, str] | None = None,
    processor_config: dict | None = None,
) -> None:
    """save_pretrained of the model and its processor (or tokenizer and image processor);
    ``processor_config``: the processor's settings as the hub's processor_config.json holds
    them, where the processor itself cannot be built here to save them."""
    model.save_pretrained(str(out_dir))
    if rename is not None:
        hub_layout(out_dir, model, rename)
    if processor is not None:
        processor.save_pretrained(str(out_dir))
        return
    tokenizer.save_pretrained(str(out_dir))
    if image_processor is not None:
        image_processor.save_pretrained(str(out_dir))
    if processor_config is not None:
        text = json.dumps(processor_config, indent=2) + "\n"
        (out_dir / "processor_config.json").write_text(text, encoding="utf-8")


# ----------------------------------------------------------------- Qwen2.5-VL
QWEN_VL_TEMPLATE = chatml_template(
    "<|vision_start|><|image_pad|><|vision_end|>", system="You are a helpful assistant."
)
"""Qwen-VL's vision markers and its default system turn."""

QWEN_IMAGE_PIXELS = {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}
"""Qwen2-VL image processor bounds: every image becomes 4 to 16 merged tokens."""


def build_qwen25_vl(out_dir: Path, seed: int = 0) -> None:
    """Qwen2.5-VL-7B/32B-Instruct: windowed ViT (patch 14, 2x2 merge), Qwen2 decoder with
    multimodal RoPE (mrope sections in the 7B's proportions)."""
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessorPil,
    )

    tokenizer = toks.qwen2_tokenizer(chat_template=QWEN_VL_TEMPLATE)
    ids = tokenizer.convert_tokens_to_ids
    text = dict(
        _decoder(tokenizer),
        max_position_embeddings=128000,
        rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [4, 6, 6]},
        rope_theta=1000000.0,
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 1,
            "out_hidden_size": HIDDEN,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,
            "fullatt_block_indexes": [1],
        },
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )
    model = _model(Qwen2_5_VLForConditionalGeneration, config, seed, tokenizer, "<|im_end|>")
    image_processor = Qwen2VLImageProcessorPil(size=dict(QWEN_IMAGE_PIXELS))
    _save(out_dir, model, tokenizer, image_processor)


# ----------------------------------------------------------------- LLaVA-NeXT (1.6)
MISTRAL_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{%- set system = message['content'] -%}"
    "{%- elif message['role'] == 'user' -%}[INST] "
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}<image>\n"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%} [/INST]"
    "{%- else -%}{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}{{ part['text'] }}{%- endfor -%}"
    "{%- endif -%}{{ eos_token }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
"""Mistral's [INST] format with LLaVA's <image> placeholder (system text is dropped, as
llava-v1.6-mistral's template does not show it either)."""

LLAVA_IMAGE = 28
LLAVA_PATCH = 14


def build_llava_next(out_dir: Path, seed: int = 0) -> None:
    """llava-v1.6-mistral-7b-hf: CLIP vision tower, any-resolution tiling over grid
    pinpoints, Mistral decoder."""
    from transformers import (
        CLIPVisionConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessorPil,
        LlavaNextProcessor,
        MistralConfig,
    )

    tokenizer = toks.llama_tokenizer(extra_special=("<image>",), chat_template=MISTRAL_TEMPLATE)
    tokenizer.pad_token = tokenizer.unk_token
    pinpoints = [[28, 56], [56, 28], [56, 56]]
    config = LlavaNextConfig(
        vision_config=_vision(CLIPVisionConfig, LLAVA_IMAGE, LLAVA_PATCH, projection_dim=32),
        text_config=_text(MistralConfig, tokenizer, sliding_window=None),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        tie_word_embeddings=False,
    )
    model = _model(LlavaNextForConditionalGeneration, config, seed, tokenizer, tokenizer.eos_token)
    processor = llava_processor(
        LlavaNextProcessor, LlavaNextImageProcessorPil, tokenizer, LLAVA_IMAGE, LLAVA_PATCH,
        MISTRAL_TEMPLATE, image_grid_pinpoints=pinpoints,
    )  # fmt: skip
    _save(out_dir, model, tokenizer, processor=processor, rename=HUB_VISION_PREFIX)


# ----------------------------------------------------------------- LLaVA-OneVision
CHATML_IMAGE_TEMPLATE = chatml_template("<image>\n")
"""LLaVA's <image> placeholder (llava-onevision-qwen2's format)."""


def build_llava_onevision(out_dir: Path, seed: int = 0) -> None:
    """llava-onevision-qwen2-7b-ov-hf: SigLIP vision tower, anyres_max_9 tiling, Qwen2
    decoder."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessorPil,
        Qwen2Config,
        SiglipVisionConfig,
    )

    tokenizer = toks.qwen2_tokenizer(
        chat_template=CHATML_IMAGE_TEMPLATE, extra_special=("<image>", "<video>")
    )
    pinpoints = [[28, 28], [28, 56], [56, 28], [56, 56]]
    config = LlavaOnevisionConfig(
        vision_config=_vision(SiglipVisionConfig, LLAVA_IMAGE, LLAVA_PATCH),
        text_config=_text(
            Qwen2Config, tokenizer, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>")
        ),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<video>"),
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9",
        tie_word_embeddings=False,
    )
    model = _model(LlavaOnevisionForConditionalGeneration, config, seed, tokenizer, "<|im_end|>")
    image_processor = LlavaOnevisionImageProcessorPil(
        size={"height": LLAVA_IMAGE, "width": LLAVA_IMAGE}, image_grid_pinpoints=pinpoints
    )
    # where torchvision is installed AutoProcessor assembles the processor from these files
    processor_config = {
        "processor_class": "LlavaOnevisionProcessor",
        "image_token": "<image>",
        "video_token": "<video>",
        "num_image_tokens": (LLAVA_IMAGE // LLAVA_PATCH) ** 2,
        "vision_feature_select_strategy": "full",
        "vision_aspect_ratio": "anyres_max_9",
    }
    _save(
        out_dir,
        model,
        tokenizer,
        image_processor,
        rename=HUB_VISION_PREFIX,
        processor_config=processor_config,
    )


# ----------------------------------------------------------------- Gemma 3
GEMMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- if message['content'] is string -%}{%- set ns.system = message['content'] + '\n\n' -%}"
    "{%- else -%}{%- set ns.system = message['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- else -%}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else 'user' }}\n"
    "{%- if message['role'] == 'user' -%}{{ ns.system }}{%- set ns.system = '' -%}{%- endif -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}<start_of_image>"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}<end_of_turn>\n"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<start_of_turn>model\n{%- endif -%}"
)
"""Gemma's turns (system text folded into the first user turn, as Gemma 3's is), the
image as <start_of_image>, which Gemma3Processor expands."""

GEMMA_IMAGE = 32
GEMMA_PATCH = 8
GEMMA_IMAGE_TOKENS = 4


def build_gemma3(out_dir: Path, seed: int = 0) -> None:
    """gemma-3-12b-it: SigLIP vision tower, average-pooled to a fixed number of soft
    tokens per image, Gemma 3 decoder (sliding-window and global layers)."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    special = {
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
    }
    tokenizer = toks.gemma_tokenizer(named_special=special, chat_template=GEMMA_TEMPLATE)
    ids = tokenizer.convert_tokens_to_ids
    text = _text(
        Gemma3TextConfig,
        tokenizer,
        sliding_window=512,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=HEAD_DIM,
        eos_token_id=[ids("<eos>"), ids("<end_of_turn>")],
        max_position_embeddings=131072,
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=_vision(SiglipVisionConfig, GEMMA_IMAGE, GEMMA_PATCH, vision_use_head=False),
        mm_tokens_per_image=GEMMA_IMAGE_TOKENS,
        boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"),
        tie_word_embeddings=True,
    )
    _seeded(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = [ids("<eos>"), ids("<end_of_turn>")]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": GEMMA_IMAGE, "width": GEMMA_IMAGE}),
        tokenizer=tokenizer,
        chat_template=GEMMA_TEMPLATE,
        image_seq_length=GEMMA_IMAGE_TOKENS,
    )
    _save(out_dir, model, tokenizer, processor=processor, rename=HUB_VISION_PREFIX)


# ----------------------------------------------------------------- Qwen3
QWEN3_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "<think>\n\n</think>\n\n{%- endif -%}"
    "{%- endif -%}"
)
"""Qwen3's ChatML with its thinking switch (``enable_thinking=False`` writes the empty
think block; by default the model may think first)."""


def build_qwen3(out_dir: Path, seed: int = 0) -> None:
    """Qwen3-32B: Qwen3 decoder (q/k RMS norm), a Qwen2 tokenizer, ChatML with <think>."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = toks.qwen2_tokenizer(
        chat_template=QWEN3_TEMPLATE, extra_special=("<think>", "</think>")
    )
    config = _text(
        Qwen3Config,
        tokenizer,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        max_position_embeddings=40960,
        rope_theta=1000000.0,
    )
    model = _model(Qwen3ForCausalLM, config, seed, tokenizer, "<|im_end|>")
    _save(out_dir, model, tokenizer)


# ----------------------------------------------------------------- model-level runner
