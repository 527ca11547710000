"""A tiny random-weight LLaVA vision-language model built in code for offline tests, in a
transformers shape and a vLLM-CPU shape (why LLaVA and what differs: docs/twins.md,
"How the twins are built")."""

from __future__ import annotations

import os
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>")
"""pad/bos, turn start, turn end (= eos), image placeholder."""

TOKENIZER_VOCAB = 480
"""Tokenizer vocabulary (256 bytes + special tokens + merges)."""

MODEL_VOCAB = 512
"""lm_head rows; larger than the tokenizer on purpose."""

IMAGE_SIZE = 30
PATCH_SIZE = 6
"""(30 / 6)^2 = 25 image tokens per image."""

TINY_DIMS = {
    "vision_hidden": 32,
    "vision_heads": 4,
    "text_hidden": 32,
    "text_heads": 4,
    "text_kv_heads": 2,
}
"""Widths of :func:`build_tiny_vlm` (heads of 8)."""

VLLM_DIMS = {
    "vision_hidden": 64,
    "vision_heads": 2,
    "text_hidden": 64,
    "text_heads": 2,
    "text_kv_heads": 1,
}
"""Widths of :func:`build_tiny_vllm_vlm`: heads of 32, the narrowest vLLM's CPU attention
runs (and grouped-query attention, as in most current VLMs)."""


def chatml_template(image: str, system: str = "") -> str:
    """ChatML, with an ``{"type": "image"}`` part rendered as ``image``; ``system``: the
    default system turn, written where the first message is not a system turn."""
    default = (
        "{%- if loop.first and message['role'] != 'system' -%}"
        "<|im_start|>system\n" + system + "<|im_end|>\n"
        "{%- endif -%}"
    )
    return (
        "{%- for message in messages -%}"
        + (default if system else "")
        + "<|im_start|>{{ message['role'] }}\n"
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'image' -%}"
        + image
        + "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}<|im_end|>\n"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
    )


CHAT_TEMPLATE = chatml_template("<image>")


def schema_corpus(key: str) -> list[str]:
    """Lines of the stored tokenizer corpus (resources/models/tokenizer_corpus.v1.json: the
    attribute schema as JSON text, kept as data so that model code imports no benchmark)."""
    import json

    from stereolens.paths import resource

    return list(json.loads(resource("models", "tokenizer_corpus.v1.json").read_text())[key])


def _corpus() -> list[str]:
    """Fixed training text: JSON punctuation, the attribute schema and its labels."""
    lines = schema_corpus("tiny_vlm")
    lines += [
        '{"person_id": "p1"}, {"person_id": "p2"}, []',
        "Describe the image. Answer with one JSON object that follows the schema.",
        "a person standing in a room wearing a white coat and holding a tool",
        "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    ]
    return lines * 3


def _build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=8192,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )


def _build_processor(tokenizer):
    from transformers import LlavaProcessor

    try:
        from transformers import CLIPImageProcessorPil as ImageProcessor
    except ImportError:  # transformers 4.x: the slow processor is PIL-based
        from transformers import CLIPImageProcessor as ImageProcessor

    return llava_processor(
        LlavaProcessor, ImageProcessor, tokenizer, IMAGE_SIZE, PATCH_SIZE, CHAT_TEMPLATE
    )


def llava_processor(
    processor_class, image_processor_class, tokenizer, image_size: int, patch_size: int,
    chat_template: str, **image_extra,
):  # fmt: skip
    """A LLaVA-family processor (``processor_class``) of square ``image_size`` images, the
    vision tower's CLS token dropped ("default" feature selection), ``<image>`` its image
    token; ``image_extra``: more of the image processor's settings."""
    image_processor = image_processor_class(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        **image_extra,
    )
    return processor_class(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        chat_template=chat_template,
        image_token="<image>",
        num_additional_image_tokens=1,  # CLIP's CLS token, dropped by "default"
    )


def _build_model(tokenizer, seed: int, dims: dict[str, int] = TINY_DIMS):
    import torch
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    pad, eos = ids["<|endoftext|>"], ids["<|im_end|>"]
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=dims["vision_hidden"],
            intermediate_size=2 * dims["vision_hidden"],
            num_hidden_layers=2,
            num_attention_heads=dims["vision_heads"],
            image_size=IMAGE_SIZE,
            patch_size=PATCH_SIZE,
            projection_dim=dims["vision_hidden"],
        ),
        text_config=LlamaConfig(
            vocab_size=MODEL_VOCAB,
            hidden_size=dims["text_hidden"],
            intermediate_size=2 * dims["text_hidden"],
            num_hidden_layers=2,
            num_attention_heads=dims["text_heads"],
            num_key_value_heads=dims["text_kv_heads"],
            max_position_embeddings=8192,
            bos_token_id=pad,
            eos_token_id=eos,
            pad_token_id=pad,
        ),
        image_token_id=ids["<image>"],
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        projector_hidden_act="gelu",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    model.generation_config.bos_token_id = pad
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    return model.eval()


HUB_VISION_PREFIX = ("vision_tower.", "vision_tower.vision_model.")
"""The hub checkpoints of LLaVA, LLaVA-NeXT, LLaVA-OneVision and Gemma 3 (saved by
transformers 4.x) hold the vision tower's weights under ``vision_tower.vision_model.``;
transformers 5.x saves them as ``vision_tower.`` and reads either; vLLM's LLaVA loader
knows only the hub's."""


def hub_layout(out_dir: Path, model, rename: tuple[str, str]) -> None:
    """Rewrite the saved weights with the hub's key prefix (``rename`` = (old, new)), then
    check that transformers reads the file back to the same tensors (else a weight would
    be silently re-initialised)."""
    import torch
    from safetensors.torch import load_file, save_file

    old, new = rename
    path = out_dir / "model.safetensors"
    tensors = load_file(str(path))
    renamed = {
        (new + k[len(old) :] if k.startswith(old) and not k.startswith(new) else k): v
        for k, v in tensors.items()
    }
    save_file(renamed, str(path), metadata={"format": "pt"})
    again = type(model).from_pretrained(str(out_dir)).state_dict()
    for key, value in model.state_dict().items():
        if not torch.equal(again[key], value):
            raise AssertionError(f"{out_dir}: {key} does not read back after the key rename")


def build_tiny_vlm(
    out_dir: str | os.PathLike, seed: int = 0, *, vllm_compatible: bool = False
) -> Path:
    """Build the tiny VLM into ``out_dir`` (replacing it, atomically) and return the path;
    byte-identical for a seed and library versions. ``vllm_compatible``: the shape vLLM's
    CPU engine runs (docs/twins.md)."""
    from stereolens.atomic import atomic_dir

    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        tokenizer = _build_tokenizer()
        processor = _build_processor(tokenizer)
        model = _build_model(tokenizer, seed, VLLM_DIMS if vllm_compatible else TINY_DIMS)
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        if vllm_compatible:
            hub_layout(tmp, model, HUB_VISION_PREFIX)
    return out_dir


def build_tiny_vllm_vlm(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """The tiny VLM in the shape vLLM's CPU engine runs (builder ``tiny-vlm-vllm``)."""
    return build_tiny_vlm(out_dir, seed, vllm_compatible=True)
