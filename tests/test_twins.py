"""Architecture twins of every registry model (issue 11): tiny random-weight models of the
same pipeline or model classes, built from configs, run through each registry entry's
own settings (steps and resolution scaled down), ``stereolens check-models`` and
``bench/gpu_check.py --device cpu``.

The twins are built once per session into the twin cache (``$STEREOLENS_TWINS``, default
``~/.cache/stereolens/twins``; a folder per builder version and library versions, so a
cached twin is never stale). Images of random weights depend on the CPU's kernels: the
tests compare a run with itself under one changed setting (does the setting reach the
pipeline?) and across batch sizes, never with stored pixel values.
"""
# ruff: noqa: E402  (HF_HUB_OFFLINE must be set before huggingface_hub is imported)

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import dataclasses
import hashlib
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from stereolens.models.registry import load_registry
from stereolens.models.tiny.twins import builder
from stereolens.models.twins import load_twins, markdown_table, twin_info, twin_spec, twin_table

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = load_registry(ROOT / "config" / "models.yaml")

GENERATOR_TWINS = [
    n for n, s in REGISTRY.items() if s.kind == "generator" and twin_info(s).status == "twin"
]
LANGUAGE_TWINS = [
    n for n, s in REGISTRY.items() if s.kind != "generator" and twin_info(s).status == "twin"
]
VLLM_ONLY_TWINS = [
    n for n in LANGUAGE_TWINS if builder(twin_info(REGISTRY[n]).builder).runner == "vllm"
]
"""Twins that only vLLM's own implementation loads (tests/test_vllm.py runs them)."""
LANGUAGE_TWINS = [n for n in LANGUAGE_TWINS if n not in VLLM_ONLY_TWINS]
PROMPTS = ["a photo of a doctor", "a nurse at work", "the engineer"]
SEEDS = [11, 12, 13]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run many times faster on one thread than on two (thread start-up and
    spinning cost more than their arithmetic, worse on a busy machine)."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------ data (fast)
def missing_twins(registry) -> list[str]:
    """Entries with neither a twin nor a listed reason."""
    twins = load_twins()
    return [
        n
        for n, s in registry.items()
        if twin_info(s, twins).label == "none" and not twin_info(s, twins).reason
    ]


def test_every_registry_entry_has_a_twin_or_a_reason():
    assert missing_twins(REGISTRY) == []
    kinds = {twin_info(s).status for s in REGISTRY.values()}
    assert kinds == {"twin", "itself", "none"}


def test_a_new_model_without_twin_or_reason_is_caught(tmp_path):
    raw = yaml.safe_load((ROOT / "config" / "models.yaml").read_text())
    raw["generators"]["my-new-model"] = {
        "backend": "diffusers",
        "model": "my-org/a-model-nobody-listed",
    }
    raw["vlms"]["my-new-vlm"] = {"backend": "vllm", "model": "my-org/a-vlm-nobody-listed"}
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert missing_twins(load_registry(path)) == ["my-new-model", "my-new-vlm"]


def test_twins_file_lists_only_known_builders_and_used_models():
    twins = load_twins()
    used = {s.model for s in REGISTRY.values()}
    assert set(twins["models"]) <= used, "resources/twins.yaml lists models no entry uses"
    loras = {s.get("lora", {}).get("path") for s in REGISTRY.values() if s.get("lora")}
    assert set(twins["loras"]) <= loras


def test_docs_twin_table_is_current():
    """docs/twins.md includes docs/examples/twin_table.md; it is the registry's table."""
    path = ROOT / "docs" / "examples" / "twin_table.md"
    table = markdown_table(twin_table(REGISTRY))
    assert path.read_text(encoding="utf-8").strip() == table.strip(), (
        f"{path.relative_to(ROOT)} is out of date; write:\n" + table
    )
    assert '--8<-- "docs/examples/twin_table.md"' in (ROOT / "docs" / "twins.md").read_text()


# ------------------------------------------------------------------ builds
@pytest.fixture(scope="session")
def twin_root():
    """Every twin built (or found in the cache) once per session; build seconds kept."""
    pytest.importorskip("diffusers")
    from stereolens.models.tiny.twins import BUILDERS, cache_root, twin_path

    root = cache_root()
    seconds = {}
    for name, b in BUILDERS.items():
        if b.kind == "lora":
            continue
        started = time.perf_counter()
        twin_path(name, root)
        seconds[name] = time.perf_counter() - started
    twin_root.seconds = seconds
    return root


def _weights_sha(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*.safetensors"))
    }


@pytest.mark.slow
def test_twins_are_small_and_deterministic(twin_root, tmp_path):
    from stereolens.models.tiny.twins import BUILDERS, twin_path

    for name, b in BUILDERS.items():
        if b.kind != "lora":
            folder = twin_path(name, twin_root)
            mb = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6
            assert mb < 3.0, f"twin {name} is {mb:.1f} MB"
    again = twin_path("flux.1-dev", tmp_path)
    assert _weights_sha(again) == _weights_sha(twin_path("flux.1-dev", twin_root))


def test_cache_folder_is_keyed_by_builder_version(monkeypatch, tmp_path):
    pytest.importorskip("diffusers")
    from stereolens.models import tiny

    b = tiny.twins.BUILDERS["qwen3"]
    before = tiny.twins.folder_name("qwen3")
    monkeypatch.setitem(tiny.twins.BUILDERS, "qwen3", dataclasses.replace(b, version=b.version + 1))
    assert tiny.twins.folder_name("qwen3") != before
    monkeypatch.setenv("STEREOLENS_TWINS", str(tmp_path))
    assert tiny.twins.cache_root() == tmp_path


def test_atomic_dir_replaces_keeps_or_leaves_nothing(tmp_path):
    """The folder writer of the twin cache and the tiny checkpoints: a finished folder
    replaces the old one (or, with keep_existing, the old one stays); a failed one leaves
    the old folder as it was and no temporary folder beside it."""
    from stereolens.atomic import atomic_dir

    target = tmp_path / "model"
    for text in ("one", "two"):
        with atomic_dir(target) as tmp:
            assert tmp.parent == tmp_path and not any(tmp.iterdir())
            (tmp / "weights").write_text(text)
    assert (target / "weights").read_text() == "two"
    with atomic_dir(target, keep_existing=True) as tmp:
        (tmp / "weights").write_text("three")
    assert (target / "weights").read_text() == "two"
    with pytest.raises(RuntimeError, match="build failed"):
        with atomic_dir(target) as tmp:
            (tmp / "weights").write_text("half")
            raise RuntimeError("build failed")
    assert (target / "weights").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


# ------------------------------------------------------------------ generators
def _generator(spec):
    """The diffusers backend on ``spec`` (imported here: the data tests need no torch)."""
    from stereolens.models.backends.diffusers_backend import DiffusersGenerator

    return DiffusersGenerator(spec)


def _pixels(images) -> np.ndarray:
    return np.stack([np.asarray(i.convert("RGB"), dtype=np.int16) for i in images])


def _images(spec, prompts=PROMPTS, seeds=SEEDS):
    gen = _generator(spec)
    return gen, _pixels(gen.generate(prompts, seeds))


def _with(spec, **changes):
    """The spec with settings changed (a value None removes the setting)."""
    settings = dict(spec.settings)
    for key, value in changes.items():
        if value is None:
            settings.pop(key, None)
        else:
            settings[key] = value
    return dataclasses.replace(spec, settings=settings)


def _perturbed(value):
    return value + 1 if isinstance(value, int) else (value or 0) + 1.5


@pytest.mark.slow
@pytest.mark.parametrize("name", GENERATOR_TWINS)
def test_generator_twin_takes_every_registry_setting(name, twin_root):
    """The twin loads as the entry's pipeline class in the entry's dtype, each setting
    the entry has changes the images (except those the backend records as without
    effect), and an image does not depend on the batch it was made in.

    One image in the entry's dtype (float16 and bfloat16 run on the CPU, slowly); the
    comparisons in float32, where a batch changes pixels by a unit of rounding at most."""
    import torch

    spec = REGISTRY[name]
    info = twin_info(spec)
    gen, image = _images(twin_spec(spec, root=twin_root).spec, PROMPTS[:1], SEEDS[:1])
    pipe = gen.pipe
    assert type(pipe).__name__ == info.pipeline_class
    denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
    denoiser = denoiser or pipe.decoder
    assert denoiser.dtype == getattr(torch, spec.get("dtype"))
    assert gen.settings()["dtype"] == spec.get("dtype")
    resolution = gen.spec.get("resolution")
    assert image.shape[1:3] == (resolution, resolution)
    if spec.get("variant"):  # the twin has only the variant's weight files, as requested
        from stereolens.models.backends.diffusers_backend import ModelLoadError

        with pytest.raises(ModelLoadError):
            _generator(_with(gen.spec, variant=None))

    run = twin_spec(spec, root=twin_root, dtype="float32").spec
    gen, base = _images(_with(run, batch_size=1))
    settings = gen.settings()
    assert settings["pipeline_class"] == info.pipeline_class
    assert settings.get("unused_settings", {}) == gen.unused_settings
    assert np.abs(base[0] - base[1]).max() > 0, "two seeds gave the same image"
    batched = _pixels(_generator(_with(run, batch_size=3)).generate(PROMPTS, SEEDS))
    assert int(np.abs(batched - base).max()) <= 1, "images depend on the batch size"

    def differs(**changes) -> bool:
        _, other = _images(_with(run, **changes), PROMPTS[:1], SEEDS[:1])
        return int(np.abs(other - base[:1]).max()) > 1

    # the negative prompt changes the images exactly when the backend does not say it
    # has no effect (FLUX without true_cfg_scale > 1, guidance <= 1)
    if spec.get("negative_prompt"):
        assert differs(negative_prompt=None) == ("negative_prompt" not in gen.unused_settings)
    if spec.get("guidance") is not None and "guidance" not in gen.unused_settings:
        g = float(spec.get("guidance"))
        assert differs(guidance=g + 2.0 if g > 1 else 3.0), "guidance does not reach the pipeline"
    # one step more (one fewer can be degenerate: a single flow-matching step with
    # shift_terminal divides by zero in diffusers 0.42)
    assert differs(steps=int(run.get("steps")) + 1), "steps do not reach the pipeline"
    for key, value in (run.get("pipeline_kwargs") or {}).items():
        changed = {**run.get("pipeline_kwargs"), key: _perturbed(value)}
        assert differs(pipeline_kwargs=changed), f"pipeline_kwargs.{key} does not reach it"
    if spec.get("scheduler") is not None:
        wanted = spec.get("scheduler")
        wanted = wanted if isinstance(wanted, dict) else {"class": wanted}
        assert type(pipe.scheduler).__name__ == wanted["class"]
        for key, value in (wanted.get("config") or {}).items():
            assert pipe.scheduler.config[key] == value
    if spec.get("lora") is not None:
        assert pipe.get_active_adapters() == [run.get("lora").get("adapter_name") or "debias"]
        assert differs(lora={**run.get("lora"), "scale": 0.0}), "the LoRA changes nothing"
    # style_prefix and prompt_intervention are prompt text the backend writes for every
    # pipeline alike (tests/test_generation.py, tests/test_debiasing.py)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "limits"),
    [
        ("sdxl", {"tokenizer": 77, "tokenizer_2": 77}),
        ("sd3.5-large", {"tokenizer": 77, "tokenizer_2": 77, "tokenizer_3": 256}),
        ("flux.1-dev", {"tokenizer": 77, "tokenizer_2": 512}),
        ("pixart-sigma", {"tokenizer": 300}),
    ],
)
def test_twins_say_which_text_encoder_cuts_a_long_prompt(name, limits, twin_root):
    """CLIP encoders keep 77 tokens, T5 encoders the pipeline's max_sequence_length (SD 3
    256, FLUX 512, PixArt-Sigma 300): a prompt longer than that is reported per encoder."""
    gen = _generator(twin_spec(REGISTRY[name], root=twin_root, dtype="float32").spec)
    long = "a photo of a nurse who " + " ".join(["stands"] * 200)
    short, cut = gen.prompt_truncation(["a nurse", long])
    assert short == []
    assert {c["encoder"]: c["limit"] for c in cut} == limits
    for c in cut:
        tok = getattr(gen.pipe, c["encoder"])
        sent = gen._full_prompt(long)  # the entry's style prefix included
        assert c["tokens"] == len(tok(sent, truncation=False)["input_ids"])
        assert (c["kept"], c["dropped"]) == (c["limit"], c["tokens"] - c["limit"])


def test_flux_twin_says_the_negative_prompt_has_no_effect(twin_root, caplog):
    pytest.importorskip("diffusers")
    from stereolens.models.backends.diffusers_backend import DiffusersGenerator

    run = twin_spec(REGISTRY["flux.1-dev"], root=twin_root, dtype="float32")
    with caplog.at_level(logging.WARNING):
        gen = DiffusersGenerator(run.spec)
    assert "negative_prompt" in gen.settings()["unused_settings"]
    assert "true_cfg_scale > 1" in caplog.text
    on = DiffusersGenerator(_with(run.spec, pipeline_kwargs={"true_cfg_scale": 2.0}))
    assert "unused_settings" not in on.settings()


def test_stable_cascade_twin_keeps_the_hub_layout(twin_root):
    """The decoder's model card names the prior, and model_index.json names the VQGAN's
    library `wuerstchen` as the hub repository does (diffusers 0.42 cannot resolve it
    alone: the backend registers the deprecated module under that name)."""
    pytest.importorskip("diffusers")
    from stereolens.models.tiny.twins import twin_path

    folder = twin_path("stable-cascade", twin_root)
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "StableCascadeDecoderPipeline"
    assert index["vqgan"] == ["wuerstchen", "PaellaVQModel"]
    assert str(folder / "prior") in (folder / "README.md").read_text()


def test_sd15_twin_has_the_safety_checker_and_records_it(twin_root):
    pytest.importorskip("diffusers")
    from stereolens.models.backends.diffusers_backend import DiffusersGenerator

    gen = DiffusersGenerator(twin_spec(REGISTRY["sd1.5"], root=twin_root).spec)
    assert gen.settings()["safety_checker"] == "StableDiffusionSafetyChecker"


def test_qwen_image_twin_template_prefix_has_the_dropped_token_count(twin_root):
    pytest.importorskip("diffusers")
    from diffusers import QwenImagePipeline
    from transformers import AutoTokenizer

    from stereolens.models.tiny.twins import twin_path
    from stereolens.models.tiny.twins.tokenizers import qwen_image_template_words

    tok = AutoTokenizer.from_pretrained(
        str(twin_path("qwen-image", twin_root)), subfolder="tokenizer"
    )
    pipe = QwenImagePipeline.from_pretrained(str(twin_path("qwen-image", twin_root)))
    assert len(tok(qwen_image_template_words()).input_ids) == pipe.prompt_template_encode_start_idx


# ------------------------------------------------------------------ VLMs and LLMs
@pytest.mark.slow
@pytest.mark.parametrize("name", LANGUAGE_TWINS)
def test_language_twin_answers_constrained_requests(name, twin_root, tmp_path):
    import jsonschema
    import torch
    from PIL import Image

    from stereolens.check_models import _load_vlm
    from stereolens.models.requests import VLMRequest

    spec = REGISTRY[name]
    info = twin_info(spec)
    run = twin_spec(spec, root=twin_root)
    model = _load_vlm(run.spec, run.runner)
    assert type(model.model).__name__ == info.pipeline_class
    assert model.model.dtype == getattr(torch, spec.get("dtype"))
    image = None
    if spec.kind == "vlm":
        image = tmp_path / "photo.png"
        pixels = np.random.default_rng(0).integers(0, 255, (900, 1200, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(image)  # larger than image_max_side: downscaled
        assert model.image_max_side == spec.get("image_max_side")
        image = str(image)
    schema = {  # closed labels only: a random model writes digits until it runs out
        "type": "object",
        "properties": {
            "gender": {"enum": ["man", "woman", "unknown"]},
            "age": {"enum": ["young", "old", "unknown"]},
        },
        "required": ["gender", "age"],
        "additionalProperties": False,
    }
    requests = [
        VLMRequest(
            text="Is this a person?", image_path=image, choices=("yes", "no"), max_new_tokens=4
        ),
        VLMRequest(
            text="Describe.",
            image_path=image,
            system="Answer in JSON.",
            json_schema=schema,
            max_new_tokens=64,
        ),
        VLMRequest(
            text="Tell a story.", image_path=image, max_new_tokens=5, temperature=1.0, seed=7
        ),
        VLMRequest(
            text="Tell a story.", image_path=image, max_new_tokens=5, temperature=1.0, seed=7
        ),
        VLMRequest(text="Tell a story.", image_path=image, max_new_tokens=1),
        VLMRequest(text="Tell a story.", image_path=image, max_new_tokens=12),
    ]
    choice, answer, story, again, short, long = model.answer(requests)
    assert choice in ("yes", "no")
    jsonschema.validate(json.loads(answer), schema)
    assert story == again, "a seeded sampled answer is not reproducible"
    assert len(short) < len(long), "max_new_tokens does not reach generation"


# ------------------------------------------------------------------ check-models
@pytest.mark.slow
def test_check_models_cli_prints_the_table(twin_root, tmp_path, capsys, monkeypatch):
    from stereolens.check_models import COLUMNS
    from stereolens.cli import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "checks.tsv"
    names = "flux.1-dev,stable-cascade,qwen2.5-vl-7b,qwen3-32b,molmo-7b-d,gpt-5"
    argv = ["check-models", "--models", names, "--weights", "twin", "--out", str(out)]
    assert main(argv) == 1  # gpt-5: no API key
    text = capsys.readouterr().out
    assert text.splitlines()[0].split(" | ")[0].strip() == "model"
    assert [c.strip() for c in text.splitlines()[0].split("|")] == list(COLUMNS)
    rows = {r["model"]: r for r in _tsv(out)}
    assert set(rows) == set(names.split(","))
    assert (
        rows["flux.1-dev"]["ok"] == "True"
        and "negative_prompt" in rows["flux.1-dev"]["settings accepted"]
    )
    assert rows["stable-cascade"]["pipeline class"] == "StableCascadeCombinedPipeline"
    assert (
        rows["molmo-7b-d"]["source"] == "none"
        and "remote code" in rows["molmo-7b-d"]["settings accepted"]
    )
    assert rows["gpt-5"]["ok"] == "False" and "OPENAI_API_KEY" in rows["gpt-5"]["settings accepted"]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    argv[2] = "gpt-5,molmo-7b-d"
    assert main(argv) == 0
    assert "sk-test-not-a-key" not in capsys.readouterr().out + out.read_text()


def _tsv(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def test_check_models_names_a_setting_the_pipeline_does_not_take(twin_root, tmp_path):
    pytest.importorskip("diffusers")
    from stereolens.check_models import check_entry

    spec = REGISTRY["sd3.5-large"]
    bad = _with(spec, pipeline_kwargs={"prior_num_inference_steps": 2})
    row = check_entry(bad, weights="twin", root=twin_root)
    assert not row.ok
    assert (
        "prior_num_inference_steps" in row.accepted and "StableDiffusion3Pipeline" in row.accepted
    )


def test_check_models_uses_weights_present_locally(twin_root):
    pytest.importorskip("diffusers")
    from stereolens.check_models import check_entry, weights_present
    from stereolens.models.tiny.twins import twin_path

    local = dataclasses.replace(REGISTRY["sd3.5-large"], model=str(twin_path("sd3.5", twin_root)))
    local = _with(local, resolution=32)
    assert weights_present(local) and not weights_present(REGISTRY["sd3.5-large"])
    row = check_entry(local, weights="auto")
    assert row.ok and row.source == "weights", row.accepted


# ------------------------------------------------------------------ bench/gpu_check.py
@pytest.mark.slow
def test_gpu_check_runs_on_the_cpu(twin_root, tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "STEREOLENS_TWINS": str(twin_root)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"  # see one_thread
    env.pop("OPENAI_API_KEY", None)
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_check.py"),
            "--device",
            "cpu",
            "--models",  # one of each kind of row; every twin runs in the tests above
            "sdxl-lightning,stable-cascade,qwen2.5-vl-7b,gemma3-12b,qwen3-32b,molmo-7b-d,gpt-5",
            "--no-tiny",  # the tiny-sd / tiny-vlm rows: test_generation, test_extraction
            "--dtype",  # the entries' own dtypes: test_generator_twin_takes_every_...
            "float32",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    rows = {r["model"]: r for r in summary["rows"]}
    assert set(rows) == {"sdxl-lightning", "stable-cascade", "qwen2.5-vl-7b", "gemma3-12b"} | {
        "qwen3-32b",
        "molmo-7b-d",
        "gpt-5",
    }
    for name in set(rows) - {"gpt-5"}:
        assert rows[name]["ok"], rows[name]
    lines = [" ".join(line.split()) for line in proc.stdout.splitlines()]
    assert "model | backend | pipeline class | settings accepted | seconds" in lines
    for name in ("sdxl-lightning", "stable-cascade"):  # float32: a unit of rounding at most
        found = re.search(r"batch 1 vs 2: max pixel difference (\d+)", rows[name]["notes"])
        assert found and int(found.group(1)) <= 1, rows[name]["notes"]


# ------------------------------------------------------------------ the workflow rule
def _workflow_copy(dest: Path) -> Path:
    import shutil

    for item in ("Snakefile", "workflow", "config", "profiles", "envs"):
        src = ROOT / item
        if src.is_dir():
            shutil.copytree(src, dest / item, symlinks=True)
        else:
            shutil.copy2(src, dest / item)
    return dest


def _snakemake(wd: Path, *args: str) -> subprocess.CompletedProcess:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["HF_HUB_OFFLINE"] = "1"
    # this checkout's package, also where the environment's editable install is another's
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return subprocess.run(
        [str(bin_dir / "snakemake"), "--cores", "2", *args],
        cwd=wd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_workflow_checks_each_model_first_and_stops_on_a_rejected_setting(tmp_path):
    """check_models is each model's first job: with a registry entry its pipeline rejects,
    the run fails there and none of that model's jobs starts; with a good registry each
    model's table is written."""
    wd = _workflow_copy(tmp_path)
    config = yaml.safe_load((ROOT / "config" / "demo.yaml").read_text())
    config["check_models"] = {"enabled": True}
    registry = yaml.safe_load((ROOT / "config" / "models.yaml").read_text())
    registry["generators"]["tiny-sd-b"]["pipeline_kwargs"] = {"no_such_argument": 1}
    (wd / "config" / "bad-models.yaml").write_text(yaml.safe_dump(registry))
    (wd / "bad.yaml").write_text(yaml.safe_dump({**config, "registry": "config/bad-models.yaml"}))
    (wd / "good.yaml").write_text(yaml.safe_dump(config))

    shard = "results/contextbias/images/tiny-sd-b/nurse/CF/0"  # one of the model's jobs
    bad = _snakemake(wd, shard, "--configfile", "bad.yaml")
    assert bad.returncode != 0
    log = (wd / "logs" / "checks" / "tiny-sd-b.log").read_text()
    assert "no_such_argument" in log and "StableDiffusionPipeline" in log
    assert not (wd / "results" / "checks" / "tiny-sd-b.tsv").exists()
    assert not (wd / "results" / "contextbias" / "images" / "tiny-sd-b").exists()

    names = ["tiny-sd-b", "tiny-vlm"]  # a generator and a VLM (the rest: the same code)
    tables = [f"results/checks/{n}.tsv" for n in names]
    good = _snakemake(wd, *tables, "--configfile", "good.yaml")
    assert good.returncode == 0, good.stderr[-3000:]
    for name, table in zip(names, tables, strict=True):
        (row,) = _tsv(wd / table)
        assert row["model"] == name and row["ok"] == "True", row
        assert row["source"] in ("itself", "twin")
    # off (the default): the table says so, and nothing is loaded
    off = _snakemake(wd, "results/checks/smollm2-135m.tsv", "--configfile", "config/demo.yaml")
    assert off.returncode == 0, off.stderr[-3000:]
    (row,) = _tsv(wd / "results" / "checks" / "smollm2-135m.tsv")
    assert row["source"] == "off" and row["settings accepted"].startswith("not checked")


def test_configured_models_are_every_model_a_run_uses():
    from stereolens.check_models import configured_models
    from stereolens.config import load_config

    config, registry = load_config(ROOT / "config" / "config.yaml")
    names = configured_models(config)
    assert len(names) == len(set(names)) and set(names) <= set(registry)
    wanted = set(config["contextbias"]["generators"]) | set(config["contextbias"]["extractors"])
    wanted |= set(config["biasig"]["generators"]) | {config["biasig"]["vqa"]}
    wanted |= set(config["lvlm"]["models"]) | {config["lvlm"]["assistant"]}
    assert wanted <= set(names)
    demo, _ = load_config(ROOT / "config" / "demo.yaml")
    assert configured_models(demo) == [
        "tiny-sd-b",
        "tiny-vlm",
        "smollm2-135m",
        "tiny-sd",
        "tiny-sd-intervention",
    ]


def test_twin_spec_scales_and_says_what_it_changed(twin_root):
    pytest.importorskip("transformers")
    cascade = twin_spec(REGISTRY["stable-cascade"], root=twin_root)
    assert cascade.spec.get("steps") == 2
    assert cascade.spec.get("pipeline_kwargs") == {"prior_num_inference_steps": 2}
    assert cascade.spec.get("dtype") == "bfloat16" and cascade.spec.get("negative_prompt")
    assert "pipeline_kwargs.prior_num_inference_steps 4 -> 2" in cascade.notes
    lightning = twin_spec(REGISTRY["sdxl-lightning"], root=twin_root)
    lora = lightning.spec.get("lora")
    assert Path(lora["path"], lora["weight_name"]).is_file()  # the registry's file name
    assert lightning.spec.get("scheduler") == REGISTRY["sdxl-lightning"].get("scheduler")
    # vLLM entries: on transformers here, or on vLLM with the engine settings a twin needs
    qwen = twin_spec(REGISTRY["qwen3-32b"], root=twin_root)
    assert (
        qwen.spec.backend == "transformers-llm" and "tensor_parallel_size" not in qwen.spec.settings
    )
    assert "tensor_parallel_size not exercised (vLLM engine only)" in qwen.notes
    on_vllm = twin_spec(REGISTRY["qwen3-32b"], root=twin_root, use_vllm=True)
    assert on_vllm.spec.backend == "vllm"
    assert on_vllm.spec.get("tensor_parallel_size") == 1
    assert on_vllm.spec.get("max_model_len") == REGISTRY["qwen3-32b"].get("max_model_len")
    with pytest.raises(Exception, match="no architecture twin"):
        twin_spec(REGISTRY["molmo-7b-d"], root=twin_root)


def test_vlm_twins_keep_the_hub_files_layout(twin_root):
    """What the hub checkpoints have and other loaders (vLLM) read: the vision tower under
    vision_tower.vision_model., LLaVA-OneVision's processor_config.json, Gemma's runs of
    line breaks as tokens."""
    pytest.importorskip("transformers")
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    from stereolens.models.tiny.twins import twin_path

    for name in ("llava-next", "llava-onevision", "gemma3"):
        folder = twin_path(name, twin_root)
        keys = safe_open(str(folder / "model.safetensors"), "pt").keys()
        vision = [k for k in keys if k.startswith("vision_tower.")]
        assert vision and all(k.startswith("vision_tower.vision_model.") for k in vision)
    folder = twin_path("llava-onevision", twin_root)
    processor = json.loads((folder / "processor_config.json").read_text())
    vision = AutoConfig.from_pretrained(str(folder)).vision_config
    assert processor["num_image_tokens"] == (vision.image_size // vision.patch_size) ** 2
    vocab = AutoTokenizer.from_pretrained(str(twin_path("gemma3", twin_root))).get_vocab()
    assert all("\n" * n in vocab for n in range(1, 5))


def test_internvl_entries_name_the_native_checkpoints_and_their_twins_tile_like_it(
    twin_root, tmp_path
):
    """InternVL3 and InternVL3.5 (#24 item 11): the registry names OpenGVLab's -hf
    conversions (transformers' native InternVLForConditionalGeneration, no remote code),
    and their twins run; an image becomes InternVLProcessor's
    ``<img>`` + ``<IMG_CONTEXT>`` x (tokens per tile x tiles) + ``</img>``, the tile count
    from the image processor and the tokens per tile from the model's own features."""
    pytest.importorskip("transformers")
    from PIL import Image

    from stereolens.check_models import _load_vlm
    from stereolens.models.requests import VLMRequest

    image = tmp_path / "wide.png"
    pixels = np.random.default_rng(1).integers(0, 255, (300, 900, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(image)
    for name, hub, decoder in (
        ("internvl3-8b", "OpenGVLab/InternVL3-8B-hf", "qwen2"),
        ("internvl3.5-8b", "OpenGVLab/InternVL3_5-8B-HF", "qwen3"),
    ):
        spec = REGISTRY[name]
        assert spec.model == hub and not spec.get("trust_remote_code")
        assert "-hf checkpoint" in spec.get("notes").lower()
        info = twin_info(spec)
        assert (info.status, info.pipeline_class) == ("twin", "InternVLForConditionalGeneration")
        run = twin_spec(spec, root=twin_root)
        model = _load_vlm(run.spec, run.runner)
        assert type(model.model).__name__ == info.pipeline_class
        assert model.model.config.text_config.model_type == decoder
        folder = Path(run.spec.model)
        per_tile = json.loads((folder / "processor_config.json").read_text())["image_seq_length"]
        tok = model.tokenizer
        request = VLMRequest(text="Who?", image_path=str(image), choices=("yes", "no"))
        ids = model._encode([request])["input_ids"][0].tolist()
        tiles = model.image_processor(images=[Image.open(image).convert("RGB")])["num_patches"]
        assert tiles[0] > 1  # a wide image: several tiles plus the thumbnail
        context = tok.convert_tokens_to_ids("<IMG_CONTEXT>")
        start = ids.index(tok.convert_tokens_to_ids("<img>"))
        end = ids.index(tok.convert_tokens_to_ids("</img>"))
        assert ids[start + 1 : end] == [context] * (per_tile * tiles[0])
        assert ids.count(context) == per_tile * tiles[0]
        assert model.answer([request])[0] in ("yes", "no")


def test_internvl_4b_bench_twin_is_the_remote_code_layout_for_vllm(twin_root):
    """BiasIG's VQA model (#24 item 11): a fine-tuned Mini-InternVL-Chat-4B-V1.5, which no
    transformers class loads (InternVL 1.5's v1 pixel shuffle). Its twin is the
    remote-code checkpoint layout that vLLM's own InternVLChatModel reads: configuration
    classes written here (trust_remote_code for them only), InternViT with fused qkv,
    ``mlp1``, a Phi-3 decoder. Without vLLM, check-models says it did not run it;
    tests/test_vllm.py runs it on the engine."""
    pytest.importorskip("transformers")
    from safetensors import safe_open
    from transformers import AutoConfig

    from stereolens.check_models import check_entry

    spec = REGISTRY["internvl-4b-bench"]
    assert spec.model == "BIGBench/InternVL-4B-bench" and spec.get("trust_remote_code")
    assert VLLM_ONLY_TWINS == ["internvl-4b-bench"]
    info = twin_info(spec)
    assert (info.status, info.builder) == ("twin", "mini-internvl-v1.5")
    on_vllm = twin_spec(spec, root=twin_root, use_vllm=True)
    assert on_vllm.spec.backend == "vllm" and on_vllm.spec.get("trust_remote_code") is True
    folder = Path(on_vllm.spec.model)
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=True)
    assert type(config).__name__ == "InternVLChatConfig"
    assert config.architectures == ["InternVLChatModel"] and config.ps_version == "v1"
    assert config.llm_config.model_type == "phi3" and config.template == "phi3-chat"
    keys = set(safe_open(str(folder / "model.safetensors"), "pt").keys())
    assert "vision_model.encoder.layers.0.attn.qkv.weight" in keys
    assert {"mlp1.0.weight", "mlp1.1.weight", "mlp1.3.weight"} <= keys
    assert "language_model.model.layers.0.self_attn.qkv_proj.weight" in keys
    assert {k.split(".")[0] for k in keys} == {"vision_model", "mlp1", "language_model"}
    here = twin_spec(spec, root=twin_root)
    assert here.runner == "vllm-only" and here.spec.backend == "vllm"
    row = check_entry(spec, weights="twin", root=twin_root)
    assert row.ok and row.source == "twin" and "only on vLLM" in row.accepted
