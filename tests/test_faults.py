"""Fault injection: the workflow survives faults and bad files, and the rerun's tables equal
an uninterrupted run's (timing columns aside). A reduced ContextBias config (one role, one
generator, the tiny VLM extracting, validation/annotation/canonicalisation, BiasIG and the
LVLM audit off) keeps every case to a couple of runs of about a minute.

Cases (tests/README.md has the matrix of what was tried and what happens):
kill -9 of the snakemake process group during generation, extraction and metrics; a full
disk (a small tmpfs over results/, needs root). The API cases are in test_faults_api.py,
damaged files and `stereolens regenerate` in test_faults_files.py (three files, so that
pytest-xdist, which hands out whole files, can spread them over its workers); they share
this file's helpers, and test_faults_files.py the undisturbed run (built once per run).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import built_once, copy_workflow, skip_unless_ci, workflow_env

pytestmark = [pytest.mark.faults, pytest.mark.slow]  # every case runs Snakemake: 50-150 s

BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
STEREOLENS = str(BIN / "stereolens")
KEY = "sk-fault-test-KEY-0123456789"
CONFIG_FILE = ".test/config/faults.yaml"
FAULT_VLM = {
    "backend": "transformers",
    "model": "resources/models/tiny-vlm",
    "build": "tiny-vlm",
    "dtype": "float32",
    "device": "cpu",
    "max_new_tokens": 96,
    "temperature": 0,
    "notes": "the tiny VLM, greedy and short: answers are noise, cached, reproducible",
}
TABLES = (
    "contextbias/images.parquet",
    "contextbias/attributes.parquet",
    "contextbias/metrics/bi.parquet",
    "contextbias/metrics/ccs.parquet",
    "contextbias/metrics/robustness.parquet",
    "contextbias/metrics/bootstrap.parquet",
)
TIMING = {"seconds", "image_path"}


def _env(**extra):
    return workflow_env(STEREOLENS_FAULT_KEY=KEY, **extra)


def _workdir(
    repo_root: Path,
    dest: Path,
    extractor: str = "fault-vlm",
    port: int = 0,
    config_file: str = CONFIG_FILE,
) -> Path:
    """A copy of the workflow with the fault registry (config/faults_models.yaml) and
    ``config_file`` with ``extractor`` as config/<its name>."""
    copy_workflow(dest, repo_root)
    registry = yaml.safe_load((repo_root / "config/models.yaml").read_text())
    registry["vlms"]["fault-vlm"] = FAULT_VLM
    registry["vlms"]["fault-api"] = {
        "backend": "openai",
        "model": "fault-vlm",
        "base_url": f"http://127.0.0.1:{port}/v1",
        "api_key_env": "STEREOLENS_FAULT_KEY",
        "max_new_tokens": 96,
        "temperature": 0,
        "max_retries": 0,
        "max_concurrency": 2,
        "timeout_s": 120,
        "transport_retries": 2,
        "transport_backoff_s": 0.5,
        "notes": "the tiny VLM behind tests/openai_server.py",
    }
    (dest / "config/faults_models.yaml").write_text(yaml.safe_dump(registry, sort_keys=False))
    config = yaml.safe_load((dest / config_file).read_text())
    config["contextbias"]["extractors"] = [extractor]
    (dest / "config" / Path(config_file).name).write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def _snakemake(
    wd: Path, *args: str, timeout: int = 900, config: str = "config/faults.yaml", **popen
) -> subprocess.CompletedProcess:
    # targets and flags first: --configfile takes every word after it
    return subprocess.run(
        [SNAKEMAKE, *args, "--profile", "profiles/local", "--cores", "2"]
        + ["--configfile", config],
        cwd=wd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _ok(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]


def _tables(wd: Path) -> dict[str, pl.DataFrame]:
    out = {}
    for name in TABLES:
        frame = pl.read_parquet(wd / "results" / name)
        frame = frame.drop([c for c in frame.columns if c in TIMING or c.endswith("_seconds")])
        out[name] = frame.sort(frame.columns)
    return out


def _assert_same(a: dict, b: dict) -> None:
    for name in TABLES:
        assert a[name].equals(b[name]), name


def _kill_when(wd: Path, ready, timeout: float = 600) -> subprocess.CompletedProcess:
    """Start the workflow, kill -9 its whole process group once ``ready(wd)``, and return
    what it printed. The run must not have finished by then."""
    proc = subprocess.Popen(
        [SNAKEMAKE, "--profile", "profiles/local", "--cores", "2"]
        + ["--configfile", "config/faults.yaml"],
        cwd=wd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    start = time.monotonic()
    try:
        while not ready(wd):
            if proc.poll() is not None:
                pytest.fail("the run finished before the fault could be injected")
            if time.monotonic() - start > timeout:
                pytest.fail("the fault point was never reached")
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, _ = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def _recover_after_kill(wd: Path) -> None:
    """After kill -9 the next run stops on Snakemake's lock, as docs/troubleshooting.md says;
    unlock, then the same command finishes."""
    locked = _snakemake(wd)
    assert locked.returncode != 0
    text = locked.stdout + locked.stderr
    assert "cannot be locked" in text and "--unlock" in text
    _ok(_snakemake(wd, "--unlock"))
    _ok(_snakemake(wd))


def _seeded(repo_root: Path, dest: Path, tiny_models, **kw) -> Path:
    """A work folder whose tiny checkpoints are the session's (built once: the files the
    workflow's build rule writes; no case is about building them)."""
    wd = _workdir(repo_root, dest, **kw)
    tiny_models.seed_workflow(wd, registry="config/faults_models.yaml")
    return wd


def undisturbed_run(repo_root: Path, tmp_path_factory, tiny_models) -> tuple[Path, dict]:
    """The undisturbed run, once per pytest run (conftest.built_once: test_faults.py,
    test_faults_files.py and test_faults_api.py, on whichever xdist workers, share it) and
    its tables. Its folder is shared: a case works on a copy
    (shutil.copytree) or in a folder of its own."""

    def run(dest: Path) -> None:
        _ok(_snakemake(_seeded(repo_root, dest, tiny_models)))

    wd = built_once(tmp_path_factory, "faults-baseline", run)
    return wd, _tables(wd)


@pytest.fixture(scope="module")
def baseline(repo_root, tmp_path_factory, tiny_models):
    return undisturbed_run(repo_root, tmp_path_factory, tiny_models)


# what a run from nothing has made under results/contextbias/ when extraction starts
MADE_BEFORE_EXTRACTION = {"images", "prompts.parquet"}
RULE = {"extraction": "extract_contextbias_attributes", "metrics": "compute_contextbias_metrics"}


def _at_stage(baseline_wd: Path, dest: Path, stage: str) -> Path:
    """A copy of the finished undisturbed run as a run from nothing is when it gets to
    ``stage``: the outputs of that stage and of everything after it removed (with their
    logs; before extraction also the VLM's answer cache, so the model answers again).
    Snakemake then plans that stage and what follows and nothing before it (checked)."""
    shutil.copytree(baseline_wd, dest, symlinks=True)
    tables = dest / "results/contextbias"
    if stage == "metrics":
        shutil.rmtree(tables / "metrics")
        (dest / "logs/contextbias/compute_metrics.log").unlink()
    else:
        for path in tables.iterdir():
            if path.name not in MADE_BEFORE_EXTRACTION:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        shutil.rmtree(dest / "results/cache/vlm")
        for path in (dest / "logs/contextbias").iterdir():
            if path.name not in ("generate", "write_prompts.log"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    plan = _snakemake(dest, "-n", "--quiet", "rules")
    _ok(plan)
    assert RULE[stage] in plan.stdout and "generate_images" not in plan.stdout, plan.stdout
    return dest


@pytest.mark.parametrize(
    ("stage", "ready"),
    [
        ("generation", lambda wd: any((wd / "results/contextbias/images").rglob("*.partial"))),
        (
            "extraction",
            lambda wd: (
                any((wd / "logs/contextbias/extract").rglob("*.log"))
                if (wd / "logs/contextbias/extract").exists()
                else False
            ),
        ),
        ("metrics", lambda wd: (wd / "logs/contextbias/compute_metrics.log").exists()),
    ],
)
def test_kill_9_then_rerun(repo_root, tmp_path, tiny_models, baseline, stage, ready):
    """kill -9 during a stage. Generation: a run from nothing; extraction and metrics: a
    run from the point a run from nothing has reached when the stage starts (_at_stage),
    so that the stage before it is not run again for each case."""
    if stage == "generation":
        wd = _seeded(repo_root, tmp_path / stage, tiny_models)
    else:
        wd = _at_stage(baseline[0], tmp_path / stage, stage)
    killed = _kill_when(wd, ready)
    assert killed.returncode == -signal.SIGKILL
    _recover_after_kill(wd)
    _assert_same(_tables(wd), baseline[1])


def test_full_disk_then_rerun(repo_root, tmp_path, tiny_models, baseline):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        skip_unless_ci("a full-disk test mounts a tmpfs: it needs root (CI runs as root)")
    wd = _seeded(repo_root, tmp_path / "disk", tiny_models)
    results = wd / "results"
    results.mkdir()
    size_kb = max(
        64,
        sum(f.stat().st_size for f in (baseline[0] / "results").rglob("*") if f.is_file())
        // 1024
        // 3,
    )
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(results)], check=True
    )
    try:
        full = _snakemake(wd)
        assert full.returncode != 0
        assert "No space left on device" in full.stdout + full.stderr + "".join(
            p.read_text(errors="replace") for p in (wd / "logs").rglob("*.log")
        )
        # space is freed (the tmpfs grows); the same command finishes
        subprocess.run(["mount", "-o", "remount,size=256m", str(results)], check=True)
        _ok(_snakemake(wd))
        _assert_same(_tables(wd), baseline[1])
    finally:
        subprocess.run(["umount", "-l", str(results)], check=False)
