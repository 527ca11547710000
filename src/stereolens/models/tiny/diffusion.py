"""A tiny random-weight Stable Diffusion 1.x pipeline built in code (no downloads), with a CLIP
BPE tokenizer written here, so the real ``from_pretrained`` path runs on a CPU in seconds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# Geometry. An image of R pixels gives latents of R/2 (two VAE blocks); the UNet
# halves those once more (two UNet blocks), and Stable Diffusion pipelines want R
# divisible by 8, so the smallest resolution is 8 and 32 is a comfortable one.
TINY_RESOLUTION = 32
TEXT_HIDDEN = 32
MAX_TOKENS = 77

BOS = "<|startoftext|>"
EOS = "<|endoftext|>"

# A few merges so the tokenizer really is BPE (every word still tokenizes without
# them, character by character). Each merge "a b" adds the token "ab".
_MERGES = [
    ("t", "h"),
    ("th", "e</w>"),
    ("a", "n"),
    ("an", "d</w>"),
    ("p", "e"),
    ("pe", "r"),
    ("o", "n</w>"),
    ("i", "n"),
    ("in", "g</w>"),
    ("i", "s</w>"),
]


def _byte_chars() -> list[str]:
    """The characters byte-level BPE (CLIP's, GPT-2's, ``tokenizers``' ByteLevel) uses for
    the 256 byte values: printable Latin-1 bytes themselves, the others chr(256 + k)."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    kept = set(keep)
    chars: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in kept:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tiny_vocab() -> tuple[dict[str, int], list[str]]:
    """The tokenizer's vocabulary (token -> id) and merges ("left right" lines)."""
    chars = _byte_chars()
    tokens = chars + [c + "</w>" for c in chars] + [a + b for a, b in _MERGES] + [BOS, EOS]
    vocab: dict[str, int] = {}
    for tok in tokens:
        if tok in vocab:
            raise AssertionError(f"duplicate token {tok!r} in the tiny vocabulary")
        vocab[tok] = len(vocab)
    return vocab, [f"{a} {b}" for a, b in _MERGES]


def _build_tokenizer(src: Path):
    from transformers import CLIPTokenizer

    vocab, merges = tiny_vocab()
    src.mkdir(parents=True)
    (src / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (src / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return CLIPTokenizer.from_pretrained(
        str(src),
        model_max_length=MAX_TOKENS,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=EOS,
    )


def _finish_tokenizer_folder(src: Path, dst: Path) -> None:
    """Keep vocab.json/merges.txt beside transformers 5's tokenizer.json (so transformers 4
    loads the folder too) and drop the keys from_pretrained leaks into tokenizer_config.json."""
    for name in ("vocab.json", "merges.txt"):
        if not (dst / name).exists():
            shutil.copyfile(src / name, dst / name)
    shutil.rmtree(src)
    cfg_path = dst / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only", "name_or_path"):
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_tiny_diffusion(out_dir: str | Path, seed: int = 0) -> Path:
    """Build the tiny pipeline into ``out_dir`` (replacing it, atomically) and return it;
    same ``seed``, same weights."""
    import torch
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    from stereolens.atomic import atomic_dir
    from stereolens.models.tiny.twins.diffusion import SD_SCHEDULE, clip_text, unet_sd, vae_kl

    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        tokenizer = _build_tokenizer(tmp / "_tokenizer_src")

        # Each component is initialised from its own fixed seed, inside fork_rng so
        # the caller's global torch RNG is left as it was.
        with torch.random.fork_rng(devices=[]):
            unet = unet_sd(seed, TEXT_HIDDEN, sample_size=TINY_RESOLUTION // 2)
            vae = vae_kl(seed + 1, sample_size=TINY_RESOLUTION)
            # CLIPTextConfig's defaults for the activation and (unused) projection width
            text_encoder = clip_text(
                tokenizer, seed + 2, hidden=TEXT_HIDDEN, hidden_act="quick_gelu", projection_dim=512
            )
        scheduler = DDIMScheduler(**SD_SCHEDULE, clip_sample=False, set_alpha_to_one=False)
        pipe = StableDiffusionPipeline(
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            unet=unet,
            scheduler=scheduler,
            safety_checker=None,
            feature_extractor=None,
            image_encoder=None,
            requires_safety_checker=False,
        )
        pipe.save_pretrained(str(tmp), safe_serialization=True)
        _finish_tokenizer_folder(tmp / "_tokenizer_src", tmp / "tokenizer")
    return out_dir
