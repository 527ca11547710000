"""Fault injection: damaged files in a finished run, and `stereolens regenerate` (the reduced
run and the helpers are tests/test_faults.py's; split from it so that pytest-xdist can run
the cases on two workers, both files on the one undisturbed run built once per pytest run).
A corrupt image in a finished shard; a truncated JSON line in a finished extraction file;
`stereolens regenerate` of a model."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from test_faults import (
    STEREOLENS,
    _assert_same,
    _env,
    _ok,
    _seeded,
    _snakemake,
    _tables,
    undisturbed_run,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow]  # every case runs Snakemake


@pytest.fixture(scope="module")
def baseline(repo_root, tmp_path_factory, tiny_models):
    return undisturbed_run(repo_root, tmp_path_factory, tiny_models)


def test_corrupt_image_fails_its_job_and_regenerate_mends_it(
    repo_root, tmp_path, tiny_models, baseline
):
    wd = _seeded(repo_root, tmp_path / "corrupt", tiny_models)
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


def test_truncated_jsonl_line_names_the_file_and_regenerate_mends_it(tmp_path, baseline):
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


def test_regenerate_a_model(tmp_path, baseline):
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
