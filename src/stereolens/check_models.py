"""``stereolens check-models``: load every configured model (its architecture twin, or the
model itself where its weights are local) and run one tiny request, so a registry entry whose
settings its class does not accept fails in minutes (docs/twins.md)."""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stereolens.models.registry import ModelSpec, load_registry, resolve_model_location
from stereolens.validation import ConfigError

log = logging.getLogger(__name__)

COLUMNS = ("model", "backend", "pipeline class", "settings accepted", "seconds")
"""The printed table's columns (a contract: docs/twins.md, issue 11)."""

TSV_COLUMNS = (*COLUMNS, "ok", "source", "notes", "build_seconds")

PROMPT = "a photo of a nurse at work"
QUESTION = "Is there a person in the image? Answer yes or no."
CHOICES = ("yes", "no")


@dataclass
class CheckRow:
    """The result of checking one registry entry."""

    model: str
    backend: str
    pipeline_class: str = ""
    accepted: str = ""
    seconds: float = 0.0
    ok: bool = False
    source: str = "twin"
    """``twin``, ``itself`` (a locally built or packaged entry), ``weights`` (the model
    itself, found locally), ``api`` or ``none``."""
    notes: list[str] = field(default_factory=list)
    build_seconds: float = 0.0
    """Seconds spent building the twin (0 when it was cached); not in ``seconds``."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "backend": self.backend,
            "pipeline class": self.pipeline_class,
            "settings accepted": self.accepted,
            "seconds": round(self.seconds, 2),
            "ok": self.ok,
            "source": self.source,
            "notes": "; ".join(self.notes),
            "build_seconds": round(self.build_seconds, 2),
        }


def configured_models(config: dict[str, Any]) -> list[str]:
    """Every registry name a validated run config uses, in config order."""
    from stereolens.benchmark import configured_models as per_benchmark

    names: list[str] = []
    for models in per_benchmark(config).values():
        names += [n for n in models if n not in names]
    return names


def weights_present(spec: ModelSpec) -> bool:
    """Whether the entry's own weights are on this machine: a local folder (or a
    pkg:// package folder), or a hub id in the Hugging Face cache. Never downloads."""
    if spec.backend == "openai":
        return False
    try:
        location = resolve_model_location(spec.model)
    except ConfigError:
        return False
    if Path(location).exists():
        return True
    if spec.get("build") or location.startswith((".", "/", "~")):
        return False
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(location, revision=spec.revision, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (or not a hub id): not present
        return False
    return True


def _probe_image(folder: Path) -> str:
    """A small RGB test image (random pixels, fixed seed)."""
    import numpy as np
    from PIL import Image

    path = folder / "check.png"
    if not path.exists():
        pixels = np.random.default_rng(0).integers(0, 255, (64, 48, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)
    return str(path)


def _scaled_real(spec: ModelSpec, device: str | None) -> tuple[ModelSpec, list[str]]:
    """A real entry with its steps scaled down for one quick image."""
    import dataclasses

    from stereolens.models.twins import MAX_STEPS

    settings = dict(spec.settings)
    notes = []
    if device:
        settings["device"] = device
    if spec.kind == "generator" and int(settings.get("steps") or 0) > MAX_STEPS:
        notes.append(f"steps {settings['steps']} -> {MAX_STEPS}")
        settings["steps"] = MAX_STEPS
    return dataclasses.replace(spec, settings=settings), notes


def _load_vlm(spec: ModelSpec, runner: str):
    if runner == "model":
        from stereolens.models.tiny.twins.model_level import ModelLevelVLM

        return ModelLevelVLM(spec)
    from stereolens.models.registry import load_model

    return load_model(spec)


def _model_class(model: Any) -> str:
    inner = getattr(model, "model", None)
    if inner is not None and not isinstance(inner, str):
        return type(inner).__name__
    llm = getattr(model, "llm", None)  # vLLM: the architecture its config names
    if llm is not None:
        try:
            return ",".join(llm.llm_engine.model_config.architectures)
        except AttributeError:
            return "vLLM engine"
    return type(model).__name__


def check_entry(
    spec: ModelSpec,
    weights: str = "auto",
    device: str | None = None,
    dtype: str | None = None,
    root: str | Path | None = None,
    use_vllm: bool = False,
    workdir: str | Path | None = None,
    batch_check: bool = False,
) -> CheckRow:
    """Check one registry entry (docs/twins.md); a model problem is a row, never raised.
    With ``batch_check`` a generator's notes give the largest pixel difference between two
    images made one at a time and as one batch."""
    from stereolens.models.twins import twin_info, twin_spec

    row = CheckRow(spec.name, spec.backend)
    started = time.perf_counter()
    try:
        info = twin_info(spec)
        row.pipeline_class = info.pipeline_class
        if spec.backend == "openai":
            row.source = "api"
            key = spec.get("api_key_env")
            row.ok = not key or bool(os.environ.get(key))
            row.accepted = (
                "not called (API)" + (f"; ${key} set" if key else "")
                if row.ok
                else f"no: ${key} is not set"
            )
            return row
        runner = "backend"
        present = weights == "auto" and info.status != "itself" and weights_present(spec)
        if present and spec.backend == "vllm" and importlib.util.find_spec("vllm") is None:
            row.notes.append("weights present, but vLLM is not installed here: its twin instead")
            present = False
        if present:
            row.source = "weights"
            run_spec, notes = _scaled_real(spec, device)  # on its own backend
        else:
            if info.status == "none":
                row.source = "none"
                row.accepted = "no twin: " + (info.reason or "not in resources/twins.yaml")
                row.ok = info.reason is not None
                return row
            built = time.perf_counter()
            twin = twin_spec(
                spec, root=root, device=device or "cpu", dtype=dtype, use_vllm=use_vllm
            )
            row.build_seconds = time.perf_counter() - built
            started += row.build_seconds
            row.source = "twin" if info.status == "twin" else "itself"
            run_spec, notes, runner = twin.spec, list(twin.notes), twin.runner
            if runner == "vllm-only":
                row.notes.extend(notes)
                row.ok = True  # like an entry with a reason: said, not hidden
                row.accepted = "not run here: its twin loads only on vLLM (--vllm)"
                return row
        row.notes.extend(notes)
        row.backend = (
            run_spec.backend
            if run_spec.backend == spec.backend
            else (f"{spec.backend} -> {run_spec.backend}")
        )
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            if spec.kind == "generator":
                _check_generator(run_spec, row, batch_check)
            else:
                _check_language(run_spec, row, runner, Path(tmp))
    except Exception as exc:  # noqa: BLE001 - the row reports it
        row.ok = False
        row.accepted = f"no: {type(exc).__name__}: {exc}"
        log.debug("check of %s failed", spec.name, exc_info=True)
    finally:
        row.seconds = time.perf_counter() - started
    return row


def _check_generator(spec: ModelSpec, row: CheckRow, batch_check: bool = False) -> None:
    from stereolens.models.backends.diffusers_backend import DiffusersGenerator

    gen = DiffusersGenerator(spec)
    row.pipeline_class = type(gen.pipe).__name__
    images = gen.generate([PROMPT], [0])
    size = spec.get("resolution")
    if size is not None and tuple(images[0].size) != (int(size), int(size)):
        row.accepted = f"no: image is {images[0].size}, resolution is {size}"
        return
    unused = gen.unused_settings
    row.ok = True
    row.accepted = "yes" + (f"; no effect: {', '.join(unused)}" if unused else "")
    row.notes.extend(f"{k}: {v}" for k, v in unused.items())
    if batch_check:
        import numpy as np

        prompts, seeds = [PROMPT, "a carpenter"], [0, 1]
        gen.batch_size = 1
        single = gen.generate(prompts, seeds)
        gen.batch_size = 2
        batched = gen.generate(prompts, seeds)
        diff = max(
            int(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max())
            for a, b in zip(single, batched, strict=True)
        )
        row.notes.append(f"batch 1 vs 2: max pixel difference {diff}")


def _check_language(spec: ModelSpec, row: CheckRow, runner: str, tmp: Path) -> None:
    from stereolens.models.requests import VLMRequest

    model = _load_vlm(spec, runner)
    row.pipeline_class = _model_class(model)
    image = _probe_image(tmp) if spec.kind == "vlm" else None
    request = VLMRequest(
        text=QUESTION if image else "Answer yes or no: is the sky blue?",
        image_path=image,
        choices=CHOICES,
        max_new_tokens=4,
        temperature=float(spec.get("temperature", 0) or 0),
        seed=0,
    )
    answer = model.answer([request])[0]
    row.ok = answer in CHOICES
    row.accepted = "yes" if row.ok else f"no: answer {answer!r} is not one of {list(CHOICES)}"


def run_checks(
    registry: dict[str, ModelSpec],
    names: list[str] | None = None,
    **kwargs: Any,
) -> list[CheckRow]:
    """Check ``names`` (default: every entry) of ``registry``; one row each, in order."""
    names = list(registry) if names is None else names
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ConfigError(f"not in the registry: {', '.join(unknown)}")
    return [check_entry(registry[n], **kwargs) for n in names]


def format_table(rows: list[CheckRow], width: int = 70) -> str:
    """The rows as an aligned text table (COLUMNS), notes listed below it."""
    cells = []
    for r in rows:
        d = r.as_dict()
        text = str(d["settings accepted"])
        if len(text) > width:
            text = text[: width - 3] + "..."
        cells.append([d["model"], d["backend"], d["pipeline class"], text, f"{d['seconds']:.1f}"])
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(COLUMNS)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    noted = [r for r in rows if r.notes or (not r.ok and len(r.accepted) > width)]
    if noted:
        lines.append("")
        lines.append("notes:")
        for r in noted:
            if not r.ok and len(r.accepted) > width:
                lines.append(f"  {r.model}: {r.accepted}")
            if r.notes:
                lines.append(f"  {r.model}: " + "; ".join(r.notes))
    failed = [r.model for r in rows if not r.ok]
    lines.append("")
    lines.append(
        f"{len(rows) - len(failed)} of {len(rows)} accepted"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return "\n".join(lines)


def tsv(rows: list[CheckRow]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=TSV_COLUMNS, delimiter="\t", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow(r.as_dict())
    return buf.getvalue()


# ------------------------------------------------------------------ command line
def quiet_progress_bars() -> None:
    """No loading bars or library chatter between the table's rows; our own warnings stay."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
        diffusers_logging.set_verbosity_error()
    except ImportError:
        pass
    try:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        transformers_logging.set_verbosity_error()
    except ImportError:
        pass


def _run(args: argparse.Namespace) -> int:
    from stereolens.atomic import write_text

    if args.configfile:
        from stereolens.config import load_config

        config, registry = load_config(args.configfile)
        names = configured_models(config)
    else:
        registry = load_registry(args.registry)
        names = list(registry)
    if args.models:
        names = [n.strip() for n in args.models.split(",") if n.strip()]
    if args.vllm and importlib.util.find_spec("vllm") is None:
        print(
            f"stereolens check-models --vllm: vLLM is not installed in this Python "
            f"({sys.executable}). Build its environment (make vllm-env) and run "
            "`.venv-vllm/bin/python -m stereolens.cli check-models --vllm ...`; without "
            "--vllm the vllm entries' twins run on transformers here.",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    quiet_progress_bars()
    threads = args.threads if args.threads is not None else (1 if args.weights == "twin" else None)
    if threads:
        from stereolens.models.job import limit_threads

        limit_threads(threads)
    rows = run_checks(
        registry,
        names,
        weights=args.weights,
        device=args.device,
        dtype=args.dtype,
        use_vllm=args.vllm,
    )
    print(format_table(rows))
    if args.out:
        write_text(args.out, tsv(rows))
    return 0 if all(r.ok for r in rows) else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-models",
        help="load each configured model's twin (or its weights) and run one tiny request",
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument("--configfile", metavar="PATH", help="a run config: check the models it uses")
    p.add_argument(
        "--registry",
        default="config/models.yaml",
        metavar="PATH",
        help="without --configfile: check every entry of this registry (default %(default)s)",
    )
    p.add_argument("--models", metavar="A,B", help="only these registry names")
    p.add_argument(
        "--weights",
        choices=["auto", "twin"],
        default="auto",
        help="auto: a model's own weights where present locally, else its twin; twin: twins only",
    )
    p.add_argument("--device", default=None, help="cpu, cuda or auto (default: cpu for twins)")
    p.add_argument("--dtype", default=None, help="override every entry's dtype (e.g. float32)")
    p.add_argument("--vllm", action="store_true", help="run vllm entries' twins on vLLM")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 1 with --weights twin, where tiny models run many "
        "times faster on one thread; else torch's default)",
    )
    p.add_argument("--out", metavar="TSV", help="also write the table (with notes) as TSV")
    p.set_defaults(func=_run)


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="stereolens")
    register(parser.add_subparsers(dest="command", required=True))
    a = parser.parse_args()
    sys.exit(a.func(a))
