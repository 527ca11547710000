"""Architecture twins of the InternVL models: InternVL3 / 3.5 in the native -hf layout, and
Mini-InternVL-Chat-4B-V1.5 in the remote-code layout for vLLM (docs/twins.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from stereolens.models.tiny.twins import tokenizers as toks
from stereolens.models.tiny.twins.language import (
    HEAD_DIM,
    HIDDEN,
    _model,
    _save,
    _seeded,
    _text,
    _vision,
)
from stereolens.models.tiny.vlm import chatml_template

INTERNVL_TEMPLATE = chatml_template("<IMG_CONTEXT>\n")
"""InternVL's image placeholder, which InternVLProcessor expands to
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
    vision = _vision(
        InternVLVisionConfig,
        INTERNVL_IMAGE,
        INTERNVL_PATCH,
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
    model = _model(InternVLForConditionalGeneration, config, seed, tokenizer, "<|im_end|>")
    image_processor = GotOcr2ImageProcessorPil(
        size={"height": INTERNVL_IMAGE, "width": INTERNVL_IMAGE},
        crop_to_patches=True,
        min_patches=1,
        max_patches=INTERNVL_MAX_TILES,
    )
    # InternVLProcessor's settings (the processor itself needs torchvision for its video
    # processor, see above)
    settings = {"processor_class": "InternVLProcessor", "image_seq_length": INTERNVL_TILE_TOKENS}
    _save(out_dir, model, tokenizer, image_processor, processor_config=settings)


def build_internvl3(out_dir: Path, seed: int = 0) -> None:
    """InternVL3-8B-hf: InternViT-300M, Qwen2.5 decoder."""
    _build_internvl(out_dir, seed, "qwen2")


def build_internvl35(out_dir: Path, seed: int = 0) -> None:
    """InternVL3_5-8B-HF: InternViT-300M, Qwen3 decoder."""
    _build_internvl(out_dir, seed, "qwen3")


# ----------------------------------------------------------------- Mini-InternVL 1.5
CONFIG_SOURCE = Path(__file__).with_name("internvl_chat_config.py")
"""The configuration classes an ``internvl_chat`` twin folder holds as
``configuration_internvl_chat.py`` (its ``auto_map``): the one piece of InternVL's remote
code vLLM runs; model and processor are vLLM's own."""

PHI3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""Phi-3's turns (string content: vLLM writes the image as ``<image>`` into the text, and
its InternVL processor expands it)."""

PHI3_SPECIAL = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
INTERNVL_CHAT_SPECIAL = ("<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>")
INTERNVL_CHAT_SPECIAL += ("</ref>", "<box>", "</box>")
"""Phi-3's chat tokens and the tokens InternVL adds to its tokenizer."""


def build_mini_internvl_v15(out_dir: Path, seed: int = 0) -> None:
    """Mini-InternVL-Chat-4B-V1.5 (and InternVL-4B-bench) in the remote-code layout:
    InternViT-300M (CLS token, layer scale, fused qkv), v1 pixel shuffle, the ``mlp1``
    projector, a Phi-3-mini-128k decoder (longrope); only vLLM's InternVLChatModel loads it."""
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, Phi3Config, Phi3ForCausalLM

    tokenizer = toks.llama_tokenizer(
        extra_special=(*PHI3_SPECIAL, *INTERNVL_CHAT_SPECIAL), chat_template=PHI3_TEMPLATE
    )
    tokenizer.pad_token = tokenizer.unk_token
    ids = tokenizer.convert_tokens_to_ids
    half = HEAD_DIM // 2
    text = _text(
        Phi3Config,
        tokenizer,
        eos_token_id=ids("<|end|>"),
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_scaling={
            "type": "longrope",
            "long_factor": [1.5] * half,
            "short_factor": [1.0] * half,
        },
        sliding_window=None,
    )
    text.architectures = ["Phi3ForCausalLM"]
    _seeded(seed)
    language = Phi3ForCausalLM(text).eval()
    tensors = {f"language_model.{k}": v for k, v in language.state_dict().items()}
    width, inner, layers = 32, 64, 2
    grid = (INTERNVL_IMAGE // INTERNVL_PATCH) ** 2
    g = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    v = "vision_model."
    tensors[v + "embeddings.class_embedding"] = normal(1, 1, width)
    tensors[v + "embeddings.patch_embedding.weight"] = normal(
        width, 3, INTERNVL_PATCH, INTERNVL_PATCH
    )
    tensors[v + "embeddings.patch_embedding.bias"] = torch.zeros(width)
    tensors[v + "embeddings.position_embedding"] = normal(1, grid + 1, width)
    for i in range(layers):
        p = f"{v}encoder.layers.{i}."
        shapes = {
            "attn.qkv": (3 * width, width),
            "attn.proj": (width, width),
            "mlp.fc1": (inner, width),
            "mlp.fc2": (width, inner),
        }
        for name, shape in shapes.items():
            tensors[p + name + ".weight"] = normal(*shape)
            tensors[p + name + ".bias"] = torch.zeros(shape[0])
        for norm in ("norm1", "norm2"):
            tensors[p + norm + ".weight"] = torch.ones(width)
            tensors[p + norm + ".bias"] = torch.zeros(width)
        tensors[p + "ls1"] = torch.full((width,), 0.1)
        tensors[p + "ls2"] = torch.full((width,), 0.1)
    shuffled = width * 4  # the 2x2 pixel shuffle
    tensors["mlp1.0.weight"], tensors["mlp1.0.bias"] = torch.ones(shuffled), torch.zeros(shuffled)
    tensors["mlp1.1.weight"], tensors["mlp1.1.bias"] = normal(HIDDEN, shuffled), torch.zeros(HIDDEN)
    tensors["mlp1.3.weight"], tensors["mlp1.3.bias"] = normal(HIDDEN, HIDDEN), torch.zeros(HIDDEN)
    tensors = {k: t.contiguous() for k, t in tensors.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    llm = text.to_dict()
    config = {
        "architectures": ["InternVLChatModel"],
        "model_type": "internvl_chat",
        "auto_map": {
            "AutoConfig": "configuration_internvl_chat.InternVLChatConfig",
        },
        "vision_config": {
            "architectures": ["InternVisionModel"],
            "model_type": "intern_vit_6b",
            "num_channels": 3,
            "patch_size": INTERNVL_PATCH,
            "image_size": INTERNVL_IMAGE,
            "qkv_bias": True,
            "hidden_size": width,
            "num_attention_heads": 1,
            "intermediate_size": inner,
            "qk_normalization": False,
            "num_hidden_layers": layers,
            "hidden_act": "gelu",
            "norm_type": "layer_norm",
            "layer_norm_eps": 1e-6,
            "initializer_factor": 0.1,
        },
        "llm_config": llm,
        "select_layer": -1,
        "force_image_size": INTERNVL_IMAGE,
        "downsample_ratio": 0.5,
        "template": "phi3-chat",
        "dynamic_image_size": True,
        "use_thumbnail": True,
        "ps_version": "v1",
        "min_dynamic_patch": 1,
        "max_dynamic_patch": INTERNVL_MAX_TILES,
        "torch_dtype": "bfloat16",
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(CONFIG_SOURCE, out_dir / "configuration_internvl_chat.py")
    GenerationConfig(
        eos_token_id=ids("<|end|>"), pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
