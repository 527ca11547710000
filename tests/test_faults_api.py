"""Fault injection through an OpenAI-compatible API (tests/test_faults.py has the reduced
run and the helpers; split from it so that pytest-xdist can run the cases on two workers):
the tiny VLM behind tests/openai_server.py, a real HTTP server on 127.0.0.1 whose answers
come from the model. An API that refuses connections, one that answers HTTP 500 and then
recovers, a server moved to another port; each compared with an undisturbed run against
the server."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from openai_server import ModelServer, free_port
from test_faults import (
    FAULT_VLM,
    KEY,
    _assert_same,
    _at_stage,
    _ok,
    _snakemake,
    _tables,
    undisturbed_run,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow]  # every case runs Snakemake


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
def api_baseline(repo_root, tmp_path_factory, local_model, tiny_models):
    """The undisturbed run against the tiny VLM behind the test server. Its generation is
    the fault suite's undisturbed run's (the extractor is not an input of generation), so
    it starts where that run is when extraction begins (test_faults._at_stage) and only
    extracts and what follows: no generation job runs (checked)."""
    local = undisturbed_run(repo_root, tmp_path_factory, tiny_models)[0]
    port = free_port()
    wd = _api_at_extraction(local, tmp_path_factory.mktemp("api-baseline") / "wd", port)
    server = ModelServer(local_model, port=port, api_key=KEY).start()
    try:
        out = _snakemake(wd)
    finally:
        server.stop()
    _ok(out)
    assert "generate_images" not in out.stdout + out.stderr
    return wd, _tables(wd)


def _api_at_extraction(baseline_wd: Path, dest: Path, port: int) -> Path:
    """The API run as a run from nothing is when extraction begins (test_faults._at_stage:
    generation done, no extraction output, no cached answer), extracting with fault-api, its
    endpoint on ``port`` (where a model is served triggers no rerun:
    test_api_server_moved_...)."""
    wd = _at_stage(baseline_wd, dest, "extraction")
    registry_path = wd / "config/faults_models.yaml"
    registry = yaml.safe_load(registry_path.read_text())
    registry["vlms"]["fault-api"]["base_url"] = f"http://127.0.0.1:{port}/v1"
    registry_path.write_text(yaml.safe_dump(registry, sort_keys=False))
    config_path = wd / "config/faults.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["contextbias"]["extractors"] = ["fault-api"]
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return wd


def test_api_refusing_connections_fails_the_job_then_a_rerun_redoes_it(
    tmp_path, local_model, api_baseline
):
    port = free_port()  # nothing listens here yet
    wd = _api_at_extraction(api_baseline[0], tmp_path / "refused", port)
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


def test_api_http_500_then_recovers_within_the_job(tmp_path, local_model, api_baseline):
    port = free_port()
    server = ModelServer(local_model, port=port, api_key=KEY)
    server.fail_first = 3  # the first round's requests fail, the retry gets answers
    server.start()
    try:
        wd = _api_at_extraction(api_baseline[0], tmp_path / "http500", port)
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
