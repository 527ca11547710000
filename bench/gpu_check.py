"""One-shot check of the CUDA paths on a GPU machine (not part of the test suite).

Builds the tiny checkpoints, then: the diffusers backend on CUDA with dtype "auto"
(bf16) and float32, one generator per image, images compared across batch sizes; and
the transformers VLM backend on CUDA with an xgrammar JSON-schema constraint (token
bitmask applied to GPU logits), answers validated against the full attribute schema.
Prints a JSON summary and writes it to $OUT/gpu_check.json when OUT is set.

    python bench/gpu_check.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from stereolens.contextbias.extract import ExtractionPrompt, check_answer  # noqa: E402
from stereolens.contextbias.schema import AttributeSchema  # noqa: E402
from stereolens.extract.base import VLMRequest  # noqa: E402
from stereolens.registry import ModelSpec  # noqa: E402
from stereolens.tiny.diffusion import build_tiny_diffusion  # noqa: E402
from stereolens.tiny.vlm import build_tiny_vlm  # noqa: E402


def diffusion_checks(root: Path) -> dict:
    from stereolens.generate.diffusers_backend import DiffusersGenerator

    path = build_tiny_diffusion(root / "tiny-sd")
    prompts = [f"a photo of a nurse {i}" for i in range(6)]
    seeds = [11, 22, 33, 44, 55, 66]
    out = {}
    for dtype in ("auto", "float32"):
        results = {}
        for bs in (1, 3, 6):
            spec = ModelSpec(
                "tiny",
                "generator",
                "diffusers",
                str(path),
                settings={
                    "resolution": 64,
                    "steps": 4,
                    "guidance": 5.0,
                    "dtype": dtype,
                    "device": "auto",
                    "batch_size": bs,
                },
            )
            gen = DiffusersGenerator(spec)
            start = time.perf_counter()
            imgs = gen.generate(prompts, seeds)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            results[bs] = (
                np.stack([np.asarray(i, dtype=np.int16) for i in imgs]),
                time.perf_counter() - start,
                gen.settings(),
            )
        base = results[1][0]
        out[dtype] = {
            "device": str(results[1][2].get("device")),
            "dtype": str(results[1][2].get("dtype")),
            "max_abs_diff_bs3_vs_bs1": int(np.abs(results[3][0] - base).max()),
            "max_abs_diff_bs6_vs_bs1": int(np.abs(results[6][0] - base).max()),
            "share_pixels_differing_bs6": float((results[6][0] != base).mean()),
            "seeds_give_distinct_images": bool(np.abs(base[0] - base[1]).max() > 0),
            "seconds": {bs: round(r[1], 3) for bs, r in results.items()},
        }
    return out


def vlm_checks(root: Path) -> dict:
    from PIL import Image

    from stereolens.extract.transformers_backend import TransformersVLM

    path = build_tiny_vlm(root / "tiny-vlm")
    schema = AttributeSchema.load()
    prompt = ExtractionPrompt.load()
    images = []
    for i in range(4):
        p = root / f"img{i}.png"
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (64, 64, 3), np.uint8)).save(p)
        images.append(str(p))
    spec = ModelSpec(
        "tiny-vlm",
        "vlm",
        "transformers",
        str(path),
        settings={"device": "auto", "dtype": "auto", "batch_size": 4, "max_new_tokens": 1024},
    )
    vlm = TransformersVLM(spec)
    out = {}
    for temp in (0.0, 1.0):
        reqs = [
            VLMRequest(
                text=prompt.user_text(schema),
                image_path=img,
                system=prompt.system,
                json_schema=schema.json_schema,
                max_new_tokens=1024,
                temperature=temp,
                seed=100 + i,
            )
            for i, img in enumerate(images)
        ]
        start = time.perf_counter()
        answers = vlm.answer(reqs)
        secs = time.perf_counter() - start
        checks = [check_answer(a, schema) for a in answers]
        out[f"temperature_{temp}"] = {
            "seconds": round(secs, 2),
            "valid": sum(1 for c in checks if c[0] is not None),
            "n": len(answers),
            "errors": [c[1] for c in checks if c[0] is None][:2],
            "mean_chars": float(np.mean([len(a) for a in answers])),
        }
    out["model_device"] = str(next(vlm.model.parameters()).device)
    return out


def main() -> None:
    summary = {
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, fn in (("diffusers", diffusion_checks), ("transformers_vlm", vlm_checks)):
            try:
                summary[name] = fn(root)
            except Exception as exc:  # report every check, even after one fails
                summary[name] = {"error": f"{type(exc).__name__}: {exc}"}
    text = json.dumps(summary, indent=2, default=str)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(text)


if __name__ == "__main__":
    main()
