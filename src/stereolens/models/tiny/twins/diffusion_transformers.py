"""Architecture twins of the registry's transformer-based text-to-image models (SD 3.5,
FLUX.1-dev, Qwen-Image, PixArt-Sigma, Stable Cascade), from the components of :mod:`.diffusion`."""

from __future__ import annotations

import json
from pathlib import Path

from stereolens.models.tiny.twins import tokenizers as toks
from stereolens.models.tiny.twins.diffusion import TEXT, _save, _seeded, clip_text, t5_text, vae_kl


def _vae16(seed: int, scaling_factor: float, shift_factor: float):
    """The 16-channel VAE without quant convs of SD 3.5 and FLUX.1, with its latent
    scaling and shift."""
    return vae_kl(
        seed,
        latent_channels=16,
        use_quant_conv=False,
        use_post_quant_conv=False,
        scaling_factor=scaling_factor,
        shift_factor=shift_factor,
    )


def build_sd35(out_dir: Path, seed: int = 0) -> None:
    """stable-diffusion-3.5-large: MMDiT (16 latent channels, patch 2, RMS qk-norm), two
    CLIP encoders with projection and T5, flow matching (shift 3)."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )

    tokenizer = toks.clip_tokenizer()
    tokenizer_2 = toks.clip_tokenizer(pad_token="!")
    tokenizer_3 = toks.t5_tokenizer()
    _seeded(seed)
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=TEXT,  # T5 width; CLIP states are padded to it
        caption_projection_dim=32,
        pooled_projection_dim=2 * TEXT,  # both CLIP pooled outputs
        pos_embed_max_size=16,
        qk_norm="rms_norm",
    ).eval()
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_vae16(seed + 1, scaling_factor=1.5305, shift_factor=0.0609),
        text_encoder=clip_text(tokenizer, seed + 2, projection=True),
        tokenizer=tokenizer,
        text_encoder_2=clip_text(tokenizer_2, seed + 3, projection=True),
        tokenizer_2=tokenizer_2,
        text_encoder_3=t5_text(tokenizer_3, seed + 4),
        tokenizer_3=tokenizer_3,
    )
    _save(pipe, out_dir)


# ----------------------------------------------------------------- FLUX.1
def build_flux_dev(out_dir: Path, seed: int = 0) -> None:
    """FLUX.1-dev: Flux transformer with guidance embeddings (distilled guidance), CLIP +
    T5, 16-channel VAE, flow matching with dynamic shifting."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    tokenizer = toks.clip_tokenizer()
    tokenizer_2 = toks.t5_tokenizer()
    _seeded(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,  # 16 latent channels, packed 2x2
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=TEXT,
        pooled_projection_dim=TEXT,
        guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),
    ).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    pipe = FluxPipeline(
        scheduler=scheduler,
        vae=_vae16(seed + 1, scaling_factor=0.3611, shift_factor=0.1159),
        text_encoder=clip_text(tokenizer, seed + 2),
        tokenizer=tokenizer,
        text_encoder_2=t5_text(tokenizer_2, seed + 3),
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )
    _save(pipe, out_dir)


# ----------------------------------------------------------------- Qwen-Image
def build_qwen_image(out_dir: Path, seed: int = 0) -> None:
    """Qwen-Image: QwenImage MMDiT, a Qwen2.5-VL text encoder with a Qwen2 tokenizer, the
    causal 3D VAE (16 latent channels), flow matching with dynamic shifting."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = toks.qwen2_tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": TEXT,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128000,
            "rope_scaling": {"mrope_section": [2, 2, 4], "rope_type": "default", "type": "default"},
            "rope_theta": 1000000.0,
            "bos_token_id": ids("<|endoftext|>"),
            "eos_token_id": ids("<|im_end|>"),
            "pad_token_id": ids("<|endoftext|>"),
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_heads": 2,
            "out_hidden_size": TEXT,
        },
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    _seeded(seed + 2)
    text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    _seeded(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,  # 16 latent channels, packed 2x2
        out_channels=16,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=TEXT,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    ).eval()
    _seeded(seed + 1)
    vae = AutoencoderKLQwenImage(
        base_dim=8,
        z_dim=16,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
    ).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256,
        base_shift=0.5,
        max_image_seq_len=8192,
        max_shift=0.9,
        shift=1.0,
        shift_terminal=0.02,
        time_shift_type="exponential",
        use_dynamic_shifting=True,
    )
    pipe = QwenImagePipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )
    _save(pipe, out_dir)


# ----------------------------------------------------------------- PixArt-Sigma
def build_pixart_sigma(out_dir: Path, seed: int = 0) -> None:
    """PixArt-Sigma-XL-2-1024-MS: PixArt transformer (learned sigma: 8 output channels),
    T5 encoder, an SDXL-style VAE (factor 8), DPM-Solver. The transformer's sample size
    is 32 latents, which PixArtSigmaPipeline's resolution binning maps to its 256-pixel
    aspect-ratio bins (the real one: 128 latents, 1024 pixels)."""
    from diffusers import (
        DPMSolverMultistepScheduler,
        PixArtSigmaPipeline,
        PixArtTransformer2DModel,
    )

    tokenizer = toks.t5_tokenizer()
    _seeded(seed)
    transformer = PixArtTransformer2DModel(
        sample_size=32,
        num_layers=2,
        patch_size=2,
        attention_head_dim=8,
        num_attention_heads=3,
        caption_channels=TEXT,
        in_channels=4,
        cross_attention_dim=24,
        out_channels=8,
        attention_bias=True,
        activation_fn="gelu-approximate",
        num_embeds_ada_norm=1000,
        norm_type="ada_norm_single",
        norm_elementwise_affine=False,
        norm_eps=1e-6,
        interpolation_scale=2,
        use_additional_conditions=False,
    ).eval()
    scheduler = DPMSolverMultistepScheduler(
        beta_start=0.0001,
        beta_end=0.02,
        beta_schedule="linear",
        num_train_timesteps=1000,
        prediction_type="epsilon",
        solver_order=2,
        algorithm_type="dpmsolver++",
        lower_order_final=True,
    )
    pipe = PixArtSigmaPipeline(
        tokenizer=tokenizer,
        text_encoder=t5_text(tokenizer, seed + 2),
        vae=vae_kl(seed + 1, blocks=4, scaling_factor=0.13025),
        transformer=transformer,
        scheduler=scheduler,
    )
    _save(pipe, out_dir)


# ----------------------------------------------------------------- Stable Cascade
PRIOR_FOLDER = "prior"
"""The prior repository's twin, inside the decoder's folder."""


def build_stable_cascade(out_dir: Path, seed: int = 0, final_dir: Path | None = None) -> None:
    """stable-cascade (decoder) + stable-cascade-prior, the prior's folder inside the
    decoder's and named in its model card by the absolute ``final_dir`` path, so that
    AutoPipelineForText2Image loads a StableCascadeCombinedPipeline as from the hub."""
    from diffusers import (
        DDPMWuerstchenScheduler,
        StableCascadeDecoderPipeline,
        StableCascadePriorPipeline,
        StableCascadeUNet,
    )
    from diffusers.pipelines.deprecated.wuerstchen import PaellaVQModel
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        CLIPVisionModelWithProjection,
    )

    effnet = 16  # channels of the prior's output (image embeddings), as the real prior's
    tokenizer = toks.clip_tokenizer()
    prior_text = clip_text(tokenizer, seed + 2, projection=True)
    _seeded(seed)
    prior = StableCascadeUNet(
        in_channels=effnet,
        out_channels=effnet,
        conditioning_dim=32,
        block_out_channels=(32, 32),
        num_attention_heads=(2, 2),
        down_num_layers_per_block=(1, 1),
        up_num_layers_per_block=(1, 1),
        down_blocks_repeat_mappers=(1, 1),
        up_blocks_repeat_mappers=(1, 1),
        clip_text_in_channels=TEXT,
        clip_text_pooled_in_channels=TEXT,
        clip_image_in_channels=TEXT,
        switch_level=(False,),
        dropout=(0.0, 0.0),
    ).eval()
    _seeded(seed + 4)
    image_encoder = CLIPVisionModelWithProjection(
        CLIPVisionConfig(
            hidden_size=TEXT,
            intermediate_size=37,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
            projection_dim=TEXT,
        )
    ).eval()
    prior_pipe = StableCascadePriorPipeline(
        tokenizer=tokenizer,
        text_encoder=prior_text,
        prior=prior,
        scheduler=DDPMWuerstchenScheduler(),
        feature_extractor=CLIPImageProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        ),
        image_encoder=image_encoder,
    )
    _seeded(seed + 5)
    decoder = StableCascadeUNet(
        in_channels=4,
        out_channels=4,
        conditioning_dim=32,
        block_out_channels=(16, 32),
        num_attention_heads=(-1, 2),
        down_num_layers_per_block=(1, 1),
        up_num_layers_per_block=(1, 1),
        down_blocks_repeat_mappers=(1, 1),
        up_blocks_repeat_mappers=(2, 2),
        block_types_per_layer=(
            ("SDCascadeResBlock", "SDCascadeTimestepBlock"),
            ("SDCascadeResBlock", "SDCascadeTimestepBlock", "SDCascadeAttnBlock"),
        ),
        clip_text_pooled_in_channels=TEXT,
        effnet_in_channels=effnet,  # the prior's output conditions the decoder
        pixel_mapper_in_channels=3,  # 8x8 RGB pixels (zeros for text-to-image)
        timestep_conditioning_type=("sca",),
        switch_level=None,
        dropout=(0.0, 0.0),
    ).eval()
    _seeded(seed + 6)
    vqgan = PaellaVQModel(
        bottleneck_blocks=1, embed_dim=16, num_vq_embeddings=16, levels=2, latent_channels=4
    ).eval()
    decoder_pipe = StableCascadeDecoderPipeline(
        decoder=decoder,
        tokenizer=tokenizer,
        text_encoder=clip_text(tokenizer, seed + 3, projection=True),
        scheduler=DDPMWuerstchenScheduler(),
        vqgan=vqgan,
    )
    prior_pipe.save_pretrained(str(out_dir / PRIOR_FOLDER), safe_serialization=True)
    decoder_pipe.save_pretrained(str(out_dir), safe_serialization=True)
    # The hub repository (saved by diffusers 0.27) names the VQGAN's library by the
    # pipeline module it lived in then, `wuerstchen`; diffusers 0.42 moved that module
    # to pipelines/deprecated/ and writes ["diffusers", ...], which it cannot load
    # either. The twin keeps the hub's entry, so it loads (or fails) as the hub one does.
    index_path = out_dir / "model_index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    index["vqgan"] = ["wuerstchen", "PaellaVQModel"]
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    prior_path = (Path(final_dir) if final_dir else out_dir).resolve() / PRIOR_FOLDER
    card = f"---\nprior:\n- {json.dumps(str(prior_path))}\n---\nStable Cascade twin.\n"
    (out_dir / "README.md").write_text(card, encoding="utf-8")
