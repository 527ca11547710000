"""Architecture twins of the registry's text-to-image models: the shared components and the
UNet pipelines (SD 1.5, SDXL base / Turbo / Playground v2.5, an SDXL LoRA), built from configs
and saved with ``save_pretrained`` (docs/twins.md, "How the twins are built")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stereolens.models.tiny.twins import tokenizers as toks

TEXT = 32
"""Hidden size of the tiny CLIP and T5 text encoders."""

SD_SCHEDULE = dict(
    beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1
)
"""The noise schedule of Stable Diffusion 1.x and SDXL."""


# ----------------------------------------------------------------- components
def _seeded(seed: int):
    import torch

    torch.manual_seed(seed)


def clip_text(tokenizer, seed: int, projection: bool = False, hidden: int = TEXT, **config: Any):
    """A 2-layer CLIP text encoder (``projection``: with its projection); ``config``
    overrides its config's values."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    settings = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=hidden,
        layer_norm_eps=1e-5,
        hidden_act="gelu",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    _seeded(seed)
    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    return cls(CLIPTextConfig(**{**settings, **config})).eval()


def t5_text(tokenizer, seed: int, d_model: int = TEXT):
    """A T5 v1.1-style encoder (gated GELU), as SD 3.5, FLUX and PixArt use."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    _seeded(seed)
    return T5EncoderModel(config).eval()


def vae_kl(
    seed: int, latent_channels: int = 4, blocks: int = 2, sample_size: int = 32, **config: Any
):
    """AutoencoderKL; ``blocks`` down blocks = a 2**(blocks-1) spatial factor."""
    from diffusers import AutoencoderKL

    channels = (8, 16, 16, 16)[:blocks]
    _seeded(seed)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=channels,
        down_block_types=("DownEncoderBlock2D",) * blocks,
        up_block_types=("UpDecoderBlock2D",) * blocks,
        layers_per_block=1,
        norm_num_groups=4,
        latent_channels=latent_channels,
        sample_size=sample_size,
        **config,
    ).eval()


def unet_sd(seed: int, cross_attention_dim: int, sample_size: int = 16, **config: Any):
    """The two-block UNet of Stable Diffusion 1.x and SDXL (and of
    stereolens.models.tiny.diffusion's pipeline)."""
    from diffusers import UNet2DConditionModel

    _seeded(seed)
    return UNet2DConditionModel(
        sample_size=sample_size,
        in_channels=4,
        out_channels=4,
        block_out_channels=(8, 16),
        layers_per_block=1,
        norm_num_groups=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=cross_attention_dim,
        attention_head_dim=2,
        **config,
    ).eval()


def _save(pipe, out_dir: Path, variant: str | None = None) -> None:
    """save_pretrained; with ``variant`` (fp16), only the variant's weight files, in
    half precision, as the repository's fp16 files are."""
    import torch

    if variant == "fp16":
        pipe.to(torch.float16)
    pipe.save_pretrained(str(out_dir), safe_serialization=True, variant=variant)


# ----------------------------------------------------------------- Stable Diffusion 1.5
def build_sd15(out_dir: Path, seed: int = 0) -> None:
    """stable-diffusion-v1-5: StableDiffusionPipeline with PNDM and the safety checker."""
    from diffusers import PNDMScheduler, StableDiffusionPipeline
    from diffusers.pipelines.stable_diffusion.safety_checker import (
        StableDiffusionSafetyChecker,
    )
    from transformers import CLIPConfig, CLIPImageProcessor

    tokenizer = toks.clip_tokenizer()
    _seeded(seed + 3)
    safety = StableDiffusionSafetyChecker(
        CLIPConfig(
            text_config={"hidden_size": TEXT, "num_hidden_layers": 1, "num_attention_heads": 2},
            vision_config={
                "hidden_size": TEXT,
                "intermediate_size": 37,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "image_size": 32,
                "patch_size": 8,
            },
            projection_dim=TEXT,
        )
    ).eval()
    pipe = StableDiffusionPipeline(
        vae=vae_kl(seed + 1, scaling_factor=0.18215),
        text_encoder=clip_text(tokenizer, seed + 2),
        tokenizer=tokenizer,
        unet=unet_sd(seed, cross_attention_dim=TEXT),
        scheduler=PNDMScheduler(**SD_SCHEDULE, skip_prk_steps=True, set_alpha_to_one=False),
        safety_checker=safety,
        feature_extractor=CLIPImageProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        ),
        image_encoder=None,
        requires_safety_checker=True,
    )
    _save(pipe, out_dir)


# ----------------------------------------------------------------- SDXL family
def _sdxl(out_dir: Path, seed: int, scheduler, vae_config: dict | None = None) -> None:
    from diffusers import StableDiffusionXLPipeline

    tokenizer = toks.clip_tokenizer()
    tokenizer_2 = toks.clip_tokenizer(pad_token="!")
    text_encoder = clip_text(tokenizer, seed + 2)
    text_encoder_2 = clip_text(tokenizer_2, seed + 3, projection=True)
    unet = unet_sd(
        seed,
        cross_attention_dim=2 * TEXT,  # both encoders' hidden states, concatenated
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + TEXT,  # 6 size ids + pooled text
        transformer_layers_per_block=(1, 2),
        use_linear_projection=True,
    )
    pipe = StableDiffusionXLPipeline(
        vae=vae_kl(seed + 1, force_upcast=True, **(vae_config or {"scaling_factor": 0.13025})),
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=scheduler,
        force_zeros_for_empty_prompt=True,
    )
    _save(pipe, out_dir, variant="fp16")


_SDXL_SCHEDULE = dict(SD_SCHEDULE, num_train_timesteps=1000, prediction_type="epsilon")


def build_sdxl_base(out_dir: Path, seed: int = 0) -> None:
    """stable-diffusion-xl-base-1.0: two CLIP encoders, Euler (leading spacing), fp16 files."""
    from diffusers import EulerDiscreteScheduler

    scheduler = EulerDiscreteScheduler(
        **_SDXL_SCHEDULE,
        interpolation_type="linear",
        timestep_spacing="leading",
        use_karras_sigmas=False,
    )
    _sdxl(out_dir, seed, scheduler)


def build_sdxl_turbo(out_dir: Path, seed: int = 0) -> None:
    """sdxl-turbo: the SDXL architecture with ancestral Euler (trailing spacing)."""
    from diffusers import EulerAncestralDiscreteScheduler

    scheduler = EulerAncestralDiscreteScheduler(**_SDXL_SCHEDULE, timestep_spacing="trailing")
    _sdxl(out_dir, seed + 10, scheduler)


def build_playground_v25(out_dir: Path, seed: int = 0) -> None:
    """playground-v2.5-1024px-aesthetic: SDXL architecture, EDM DPM-Solver, a VAE with
    latent mean/std (EDM latents)."""
    from diffusers import EDMDPMSolverMultistepScheduler

    scheduler = EDMDPMSolverMultistepScheduler(
        sigma_min=0.002,
        sigma_max=80.0,
        sigma_data=0.5,
        num_train_timesteps=1000,
        prediction_type="epsilon",
        rho=7.0,
        solver_order=2,
        algorithm_type="dpmsolver++",
        solver_type="midpoint",
        lower_order_final=True,
        euler_at_final=False,
        final_sigmas_type="zero",
    )
    vae = {
        "scaling_factor": 0.5,
        "latents_mean": [-1.6574, 1.886, -1.383, 2.5155],
        "latents_std": [8.4927, 5.9022, 6.5498, 5.2299],
    }
    _sdxl(out_dir, seed + 20, scheduler, vae)


def build_sdxl_lora(
    out_dir: Path, seed: int = 0, base_dir: Path | None = None, weight_name: str | None = None
) -> None:
    """A LoRA for the SDXL base twin's UNet attention (rank 2, random weights), saved
    with ``save_lora_weights`` under ``weight_name`` (diffusers' default when None)."""
    import torch
    from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    if base_dir is None:
        raise ValueError("build_sdxl_lora needs base_dir, the SDXL twin it adapts")
    unet = UNet2DConditionModel.from_pretrained(str(base_dir), subfolder="unet", variant="fp16")
    unet.add_adapter(
        LoraConfig(r=2, lora_alpha=2, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in unet.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(unet))
    kwargs = {"weight_name": weight_name} if weight_name else {}
    StableDiffusionXLPipeline.save_lora_weights(
        str(out_dir), unet_lora_layers=layers, safe_serialization=True, **kwargs
    )


# ----------------------------------------------------------------- SD 3.5
