"""Fault injection: the workflow survives faults and bad files, and the rerun's tables equal
an uninterrupted run's (timing columns aside). A reduced ContextBias config (one role, one
generator, the tiny VLM extracting, validation/annotation/canonicalisation, BiasIG and the
LVLM audit off) keeps every case to a couple of runs of about a minute.

Cases (tests/README.md has the matrix of what was tried and what happens):
kill -9 of the snakemake process group during generation, extraction and metrics; a full
disk (a small tmpfs over results/, needs root); an API that refuses connections; an API
that answers HTTP 500 and then recovers; an API server moved to another port; a corrupt
image in a finished shard; a truncated JSON line in a finished extraction file;
`stereolens regenerate` of a model.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import copy_workflow, skip_unless_ci, workflow_env
from openai_server import ModelServer, free_port

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


def _workdir(repo_root: Path, dest: Path, extractor: str = "fault-vlm", port: int = 0) -> Path:
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
    config = yaml.safe_load((dest / CONFIG_FILE).read_text())
    config["contextbias"]["extractors"] = [extractor]
    (dest / "config/faults.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def _snakemake(wd: Path, *args: str, timeout: int = 900, **popen) -> subprocess.CompletedProcess:
    # targets and flags first: --configfile takes every word after it
    return subprocess.run(
        [SNAKEMAKE, *args, "--profile", "profiles/local", "--cores", "2"]
        + ["--configfile", "config/faults.yaml"],
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


@pytest.fixture(scope="module")
def baseline(repo_root, tmp_path_factory, tiny_models):
    """The undisturbed run, on the session's tiny checkpoints (the files the workflow's
    build rule writes; no case is about building them)."""
    wd = _workdir(repo_root, tmp_path_factory.mktemp("baseline"))
    tiny_models.seed_workflow(wd, registry="config/faults_models.yaml")
    _ok(_snakemake(wd))
    return wd, _tables(wd)


def _seeded(repo_root: Path, dest: Path, baseline_wd: Path, **kw) -> Path:
    """A work folder whose tiny checkpoints are the baseline's (built once)."""
    wd = _workdir(repo_root, dest, **kw)
    shutil.copytree(baseline_wd / "resources", wd / "resources")
    return wd


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
def test_kill_9_then_rerun(repo_root, tmp_path, baseline, stage, ready):
    wd = _seeded(repo_root, tmp_path / stage, baseline[0])
    killed = _kill_when(wd, ready)
    assert killed.returncode == -signal.SIGKILL
    _recover_after_kill(wd)
    _assert_same(_tables(wd), baseline[1])


def test_full_disk_then_rerun(repo_root, tmp_path, baseline):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        skip_unless_ci("a full-disk test mounts a tmpfs: it needs root (CI runs as root)")
    wd = _seeded(repo_root, tmp_path / "disk", baseline[0])
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


@pytest.fixture(scope="module")
def local_model(tiny_vlm_dir):
    """The tiny VLM the workflow builds, loaded in this process for the test server."""
    from stereolens.models.backends.transformers_backend import TransformersVLM
    from stereolens.models.registry import ModelSpec

    settings = {
        k: v for k, v in FAULT_VLM.items() if k not in ("backend", "model", "build", "notes")
    }
    return TransformersVLM(
        ModelSpec(
            name="fault-vlm",
            kind="vlm",
            backend="transformers",
            model=str(tiny_vlm_dir),
            settings=settings,
        )
    )


@pytest.fixture(scope="module")
def api_baseline(repo_root, tmp_path_factory, local_model, baseline):
    port = free_port()
    server = ModelServer(local_model, port=port, api_key=KEY).start()
    try:
        wd = _seeded(
            repo_root,
            tmp_path_factory.mktemp("api-baseline"),
            baseline[0],
            extractor="fault-api",
            port=port,
        )
        _ok(_snakemake(wd))
    finally:
        server.stop()
    return wd, _tables(wd)


def test_api_refusing_connections_fails_the_job_then_a_rerun_redoes_it(
    repo_root, tmp_path, local_model, api_baseline, baseline
):
    port = free_port()  # nothing listens here yet
    wd = _seeded(repo_root, tmp_path / "refused", baseline[0], extractor="fault-api", port=port)
    down = _snakemake(wd)
    assert down.returncode != 0
    logs = "".join(p.read_text() for p in (wd / "logs/contextbias/extract").rglob("*.log"))
    assert "failed in the backend after 2 retries" in logs and "Connection" in logs
    # an outage is not a result: no extraction record, no cached answer, no merged table
    assert not list((wd / "results/contextbias/extractions").rglob("*.jsonl"))
    assert (
        not list((wd / "results/cache").rglob("*.json"))
        if (wd / "results/cache").exists()
        else True
    )
    assert not (wd / "results/contextbias/attributes.parquet").exists()
    # the dry run plans the extraction again (it was never recorded as finished)
    plan = _snakemake(wd, "-n")
    assert "extract_contextbias_attributes" in plan.stdout
    server = ModelServer(local_model, port=port, api_key=KEY).start()
    try:
        _ok(_snakemake(wd))
    finally:
        server.stop()
    _assert_same(_tables(wd), api_baseline[1])
    for path in (wd / "results").rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".log", ".html"):
            assert KEY not in path.read_text(errors="replace"), path


def test_api_http_500_then_recovers_within_the_job(
    repo_root, tmp_path, local_model, api_baseline, baseline
):
    port = free_port()
    server = ModelServer(local_model, port=port, api_key=KEY)
    server.fail_first = 3  # the first round's requests fail, the retry gets answers
    server.start()
    try:
        wd = _seeded(repo_root, tmp_path / "http500", baseline[0], extractor="fault-api", port=port)
        _ok(_snakemake(wd))
    finally:
        server.stop()
    assert server.failed == 3
    logs = "".join(p.read_text() for p in (wd / "logs/contextbias/extract").rglob("*.log"))
    assert "HTTP 500" in logs and "retry 1/2" in logs
    _assert_same(_tables(wd), api_baseline[1])


def test_api_server_moved_reruns_nothing_and_the_cache_hits(
    repo_root, tmp_path, local_model, api_baseline
):
    """Where a model is served is not what it answers (issue 24, item 9): after the
    OpenAI-compatible server moves to another port, the finished run is up to date, and
    its extraction forced again asks the moved server nothing."""
    wd = tmp_path / "moved"
    shutil.copytree(api_baseline[0], wd, symlinks=True)
    registry_path = wd / "config/faults_models.yaml"
    registry = yaml.safe_load(registry_path.read_text())
    port = free_port()
    registry["vlms"]["fault-api"]["base_url"] = f"http://127.0.0.1:{port}/v1"
    registry_path.write_text(yaml.safe_dump(registry, sort_keys=False))
    plan = _snakemake(wd, "-n")
    _ok(plan)
    assert "Nothing to be done" in plan.stdout + plan.stderr, plan.stdout[-3000:]
    server = ModelServer(local_model, port=port, api_key=KEY).start()
    try:
        _ok(_snakemake(wd, "--forcerun", "extract_contextbias_attributes"))
    finally:
        server.stop()
    logs = "".join(p.read_text() for p in (wd / "logs/contextbias/extract").rglob("*.log"))
    rounds = re.findall(r"\((\d+) cached, (\d+) asked\)", logs)
    assert rounds and all(asked == "0" for _, asked in rounds) and server.requests == 0
    _assert_same(_tables(wd), api_baseline[1])


def test_corrupt_image_fails_its_job_and_regenerate_mends_it(repo_root, tmp_path, baseline):
    wd = _seeded(repo_root, tmp_path / "corrupt", baseline[0])
    shard = "results/contextbias/images/tiny-sd/chef/CF/0"
    _ok(_snakemake(wd, shard))
    png = sorted((wd / shard).glob("*.png"))[0]
    png.write_bytes(png.read_bytes()[:200])  # truncated after generation
    broken = _snakemake(wd)
    assert broken.returncode != 0
    text = (
        broken.stdout + broken.stderr + "".join(p.read_text() for p in (wd / "logs").rglob("*.log"))
    )
    assert png.name in text and "missing, corrupt or changed" in text
    advice = f"stereolens regenerate --shard {shard}"
    assert advice in text
    # the advice works
    fixed = subprocess.run(
        [STEREOLENS, "regenerate", "--shard", shard, "--configfile", "config/faults.yaml"]
        + ["--profile", "profiles/local", "--", "--cores", "2"],
        cwd=wd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    _ok(fixed)
    _assert_same(_tables(wd), baseline[1])


def test_truncated_jsonl_line_names_the_file_and_regenerate_mends_it(repo_root, tmp_path, baseline):
    wd = tmp_path / "jsonl"
    shutil.copytree(baseline[0], wd, symlinks=True)
    shard = "results/contextbias/extractions/fault-vlm/tiny-sd/chef/CA-R/0.jsonl"
    path = wd / shard
    text = path.read_text()
    path.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])
    broken = _snakemake(wd)
    assert broken.returncode != 0
    out = (
        broken.stdout + broken.stderr + "".join(p.read_text() for p in (wd / "logs").rglob("*.log"))
    )
    assert f"{shard}:" in out and "is not valid JSON" in out
    assert f"stereolens regenerate --shard {shard}" in out
    fixed = subprocess.run(
        [STEREOLENS, "regenerate", "--shard", shard, "--configfile", "config/faults.yaml"]
        + ["--profile", "profiles/local", "--", "--cores", "2"],
        cwd=wd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    _ok(fixed)
    _assert_same(_tables(wd), baseline[1])


def test_regenerate_a_model(repo_root, tmp_path, baseline):
    wd = tmp_path / "model"
    shutil.copytree(baseline[0], wd, symlinks=True)
    before = {p: p.stat().st_mtime_ns for p in (wd / "results/contextbias/images").rglob("*.png")}
    # deleting the model's folders is not enough (Snakemake: "Nothing to be done")
    shutil.rmtree(wd / "results/contextbias/images/tiny-sd")
    plan = _snakemake(wd, "-n")
    assert "Nothing to be done" in plan.stdout + plan.stderr
    out = subprocess.run(
        [STEREOLENS, "regenerate", "--model", "tiny-sd", "--configfile", "config/faults.yaml"]
        + ["--profile", "profiles/local", "--", "--cores", "2"],
        cwd=wd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    _ok(out)
    assert "Forced execution" in out.stdout + out.stderr or "regenerating" in out.stdout
    after = {p: p.stat().st_mtime_ns for p in (wd / "results/contextbias/images").rglob("*.png")}
    assert set(after) == set(before)
    _assert_same(_tables(wd), baseline[1])
