"""One-shot check of every architecture twin on a GPU (not part of the test suite's
timing; tests/test_twins.py runs it with --device cpu).

Whoever has a GPU for a few minutes runs it at once (under 5 minutes on one GPU):

    python bench/gpu_check.py                  # CUDA
    python bench/gpu_check.py --device cpu     # the same checks on the CPU

It prints one table (model | backend | pipeline class | settings accepted | seconds) and
writes it, with the notes and the environment, to $OUT/gpu_check.json when OUT is set
(or to --out):

* every registry entry through ``stereolens check-models`` on its twin, on the device,
  with the entry's own dtype (bf16/fp16 on CUDA), one request each; generators also
  compare images made one at a time with a batch of two;
* with vLLM installed, every vllm entry's twin again on the vLLM engine (rows
  ``<name> [vllm]``), as long as the time budget allows (``--budget-s``);
* the two earlier CUDA checks: the tiny Stable Diffusion pipeline with dtype auto and
  float32 at batch sizes 1, 3, 6 (rows ``tiny-sd [dtype ...]``), and the tiny VLM's
  xgrammar JSON-schema answers decoded on the device (rows ``tiny-vlm [json, T=...]``).

Exit status 1 when a check failed (API entries without a key do not count).
"""

from __future__ import annotations

import argparse
import importlib.util
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

from stereolens.check_models import (  # noqa: E402
    CheckRow,
    check_entry,
    format_table,
    quiet_progress_bars,
)
from stereolens.models.registry import ModelSpec, load_registry  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def sync(device: str) -> None:
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize()


def tiny_sd_rows(root: Path, device: str) -> list[CheckRow]:
    """The tiny SD pipeline at dtype auto and float32: images across batch sizes 1, 3, 6."""
    from stereolens.models.backends.diffusers_backend import DiffusersGenerator
    from stereolens.models.tiny.diffusion import build_tiny_diffusion

    path = build_tiny_diffusion(root / "tiny-sd")
    prompts = [f"a photo of a nurse {i}" for i in range(6)]
    seeds = [11, 22, 33, 44, 55, 66]
    rows = []
    for dtype in ("auto", "float32"):
        row = CheckRow(f"tiny-sd [dtype {dtype}]", "diffusers", source="itself")
        started = time.perf_counter()
        try:
            images = {}
            for bs in (1, 3, 6):
                spec = ModelSpec(
                    "tiny-sd",
                    "generator",
                    "diffusers",
                    str(path),
                    settings={
                        "resolution": 64,
                        "steps": 4,
                        "guidance": 5.0,
                        "dtype": dtype,
                        "device": device,
                        "batch_size": bs,
                    },
                )
                gen = DiffusersGenerator(spec)
                images[bs] = np.stack(
                    [np.asarray(i, dtype=np.int16) for i in gen.generate(prompts, seeds)]
                )
                sync(device)
            row.pipeline_class = type(gen.pipe).__name__
            d3 = int(np.abs(images[3] - images[1]).max())
            d6 = int(np.abs(images[6] - images[1]).max())
            distinct = bool(np.abs(images[1][0] - images[1][1]).max() > 0)
            row.ok = distinct
            row.accepted = f"yes; dtype {gen.settings()['dtype']}" if distinct else "no"
            row.notes.append(
                f"max pixel difference bs3 vs bs1 {d3}, bs6 vs bs1 {d6}; "
                f"seeds give distinct images: {distinct}"
            )
        except Exception as exc:  # noqa: BLE001 - report every check
            row.accepted = f"no: {type(exc).__name__}: {exc}"
        row.seconds = time.perf_counter() - started
        rows.append(row)
    return rows


def tiny_vlm_rows(root: Path, device: str) -> list[CheckRow]:
    """The tiny VLM under an xgrammar JSON-schema constraint (bitmask on the device's
    logits), greedy and sampled: answers validated against the full attribute schema."""
    from PIL import Image

    from stereolens.contextbias.extract import ExtractionPrompt, check_answer
    from stereolens.contextbias.schema import AttributeSchema
    from stereolens.models.backends.transformers_backend import TransformersVLM
    from stereolens.models.requests import VLMRequest
    from stereolens.models.tiny.vlm import build_tiny_vlm

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
        settings={"device": device, "dtype": "auto", "batch_size": 4, "max_new_tokens": 1024},
    )
    vlm = TransformersVLM(spec)
    rows = []
    for temp in (0.0, 1.0):
        row = CheckRow(f"tiny-vlm [json, T={temp:g}]", "transformers", source="itself")
        row.pipeline_class = type(vlm.model).__name__
        started = time.perf_counter()
        try:
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
            answers = vlm.answer(reqs)
            valid = sum(1 for a in answers if check_answer(a, schema)[0] is not None)
            # greedy answers must all be valid; sampled ones may run out of tokens first
            # (the extraction loop retries those), but one must be valid
            row.ok = valid == len(answers) if temp == 0 else valid > 0
            row.accepted = f"{'yes' if row.ok else 'no'}: {valid} of {len(answers)} valid"
            row.notes.append(
                f"model on {next(vlm.model.parameters()).device}; mean answer "
                f"{np.mean([len(a) for a in answers]):.0f} chars"
            )
        except Exception as exc:  # noqa: BLE001
            row.accepted = f"no: {type(exc).__name__}: {exc}"
        row.seconds = time.perf_counter() - started
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cpu or auto")
    parser.add_argument("--registry", default=str(ROOT / "config" / "models.yaml"))
    parser.add_argument(
        "--dtype",
        help="every twin in this dtype (default: each entry's own; fp16 is slow on a CPU)",
    )
    parser.add_argument("--models", help="only these registry names (comma-separated)")
    parser.add_argument(
        "--budget-s", type=float, default=270.0, help="stop starting vLLM engines after this"
    )
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM rows")
    parser.add_argument("--no-tiny", action="store_true", help="skip the tiny-sd / tiny-vlm rows")
    parser.add_argument("--out", help="JSON output (default $OUT/gpu_check.json when OUT is set)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads on --device cpu")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    quiet_progress_bars()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available here; run with --device cpu", file=sys.stderr)
        return 2
    if torch.device(device).type == "cpu":
        torch.set_num_threads(args.threads)  # tiny models: one thread is many times faster
    registry = load_registry(args.registry)
    names = [n.strip() for n in args.models.split(",")] if args.models else list(registry)
    summary = {
        "torch": torch.__version__,
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "vllm": None,
    }
    rows: list[CheckRow] = []
    for name in names:
        rows.append(
            check_entry(
                registry[name], weights="twin", device=device, dtype=args.dtype, batch_check=True
            )
        )
        print(f"{name}: {rows[-1].accepted} ({rows[-1].seconds:.1f} s)", file=sys.stderr)

    have_vllm = importlib.util.find_spec("vllm") is not None
    if have_vllm and not args.no_vllm:
        import vllm

        summary["vllm"] = vllm.__version__
        for name in names:
            spec = registry[name]
            if spec.backend != "vllm":
                continue
            if time.perf_counter() - started > args.budget_s:
                rows.append(CheckRow(f"{name} [vllm]", "vllm", accepted="skipped: time budget"))
                continue
            row = check_entry(spec, weights="twin", device=device, use_vllm=True)
            row.model = f"{name} [vllm]"
            rows.append(row)
            print(f"{row.model}: {row.accepted} ({row.seconds:.1f} s)", file=sys.stderr)

    if not args.no_tiny:
        with tempfile.TemporaryDirectory() as tmp:
            rows += tiny_sd_rows(Path(tmp), device)
            rows += tiny_vlm_rows(Path(tmp), device)

    summary["seconds"] = round(time.perf_counter() - started, 1)
    print(format_table(rows))
    print(f"total {summary['seconds']} s on {device}")
    summary["rows"] = [r.as_dict() for r in rows]
    out = args.out or (
        os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT") else None
    )
    if out:
        Path(out).write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    failed = [
        r for r in rows if not r.ok and r.source != "api" and not r.accepted.startswith("skipped")
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
